"""The Django, Flask and WSGI examples of docs/http-endpoints.md are what the suite runs.

The Django and Flask blocks are files of the shop that ``test_wsgi_gunicorn`` serves with
gunicorn (each block opens with its file name and must stand in that file verbatim); the
WSGI block is run here as written, under a real WSGI server.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.http.apps import serve_wsgi
from tests.http.docs import DOC, section_blocks

SHOP = Path(__file__).parent / "shop"
SECTIONS = {
    "Django and Django REST framework": ["settings.py", "urls.py", "views.py"],
    "Flask": ["flask_app.py"],
}


@pytest.mark.parametrize(("heading", "files"), SECTIONS.items())
def test_the_framework_examples_are_the_served_shop(heading: str, files: list[str]) -> None:
    blocks = section_blocks(heading)
    assert [block.splitlines()[0] for block in blocks] == [f"# {name}" for name in files]
    for block, name in zip(blocks, files, strict=True):
        assert block in (SHOP / name).read_text(), f"{name} no longer holds the documented code"


def test_every_example_of_the_page_is_run() -> None:
    everything = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    run = [
        *section_blocks("A payment endpoint with FastAPI"),  # tests/http/test_http_fastapi.py
        *(block for heading in SECTIONS for block in section_blocks(heading)),
        *section_blocks("Any WSGI app"),
    ]
    assert sorted(everything) == sorted(run)


def test_the_wsgi_example(redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SETTLE_REDIS_URL", redis_url)
    monkeypatch.setenv("SETTLE_NAMESPACE", namespace)
    [block] = section_blocks("Any WSGI app")
    example: dict[str, Any] = {"__name__": "wsgi_example"}
    exec(compile(block, str(DOC), "exec"), example)
    key = {"Idempotency-Key": str(uuid.uuid4())}
    try:
        with serve_wsgi(example["app"]) as base, httpx.Client(base_url=base) as client:
            first = client.post("/payments", json={"amount": 1}, headers={**key, "X-Tenant": "a"})
            again = client.post("/payments", json={"amount": 1}, headers={**key, "X-Tenant": "a"})
            anonymous = client.post("/payments", json={"amount": 1}, headers=key)
    finally:
        example["settler"].close()
    assert first.status_code == 201
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert anonymous.status_code == 401
