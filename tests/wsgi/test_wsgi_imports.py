"""The base install imports no web framework: Django and Flask only behind their modules."""

from __future__ import annotations

import subprocess
import sys

import pytest

FRAMEWORKS = {"django", "flask", "werkzeug", "rest_framework", "gunicorn", "starlette", "fastapi"}


@pytest.mark.parametrize(
    "modules",
    ["settle", "settle.http, settle.http._rules, settle.http._sync", "settle.wsgi", "settle.asgi"],
)
def test_the_base_modules_import_no_web_framework(modules: str) -> None:
    code = (
        f"import sys, {modules}\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(FRAMEWORKS)!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
