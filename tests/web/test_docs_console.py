"""docs/console.md is executed as written: its FastAPI example mounts the console under
/settle, and a user signs in and resolves an entry through it (real app, real Redis)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from settle import AsyncSettler, Settler
from tests.web.evidence import stale_settlement
from tests.web.test_console_http import csrf_of

DOC = Path(__file__).resolve().parents[2] / "docs" / "console.md"

pytestmark = pytest.mark.asyncio


@pytest.fixture
def default_writer(redis_url: str, namespace: str) -> Iterator[Settler]:
    """A namespace with the default shard count, as the example's settler expects."""
    s = Settler.from_url(redis_url, namespace=namespace)
    s.check()
    yield s
    s.close()


async def test_the_fastapi_example_mounts_a_working_console(
    redis_url: str, default_writer: Settler, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = default_writer
    blocks = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(), flags=re.S | re.M)
    assert len(blocks) == 1
    monkeypatch.setenv("SETTLE_REDIS_URL", redis_url)
    monkeypatch.setenv("SETTLE_NAMESPACE", writer.config.namespace)
    monkeypatch.setenv("CONSOLE_TOKEN", "doc-token")
    monkeypatch.setenv("CONSOLE_SESSION_KEY", "doc-session-key")
    monkeypatch.setenv("CONSOLE_HOST", "svc.test")
    ref = stale_settlement(writer, "order-doc")

    scope: dict[str, object] = {"__name__": "console_doc"}
    exec(compile(blocks[0], str(DOC), "exec"), scope)
    settler = scope["settler"]
    assert isinstance(settler, AsyncSettler)
    transport = httpx.ASGITransport(app=scope["app"])  # type: ignore[arg-type]
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://svc.test") as client:
            rebound = await client.get("http://attacker.example/settle/quarantine.jsonl")
            assert rebound.status_code == 400  # another Host: refused (DNS rebinding)
            overview = await client.get("/settle/")
            assert overview.status_code == 200
            assert 'href="/settle/static/console.css"' in overview.text
            assert (await client.get("/settle/static/console.css")).status_code == 200
            listing = (await client.get("/settle/quarantine")).text
            assert f'href="/settle/entry/{ref}"' in listing
            form = (await client.get("/settle/signin")).text
            signed = await client.post(
                f"/settle/signin?next=/settle/entry/{ref}",
                data={"token": "doc-token", "csrf": csrf_of(form)},
            )
            assert signed.headers["location"] == f"/settle/entry/{ref}"
            page = (await client.get(f"/settle/entry/{ref}")).text
            done = await client.post(
                f"/settle/entry/{ref}/resolve",
                data={"note": "reconciled with the provider", "csrf": csrf_of(page)},
            )
            # The notice comes with the redirect (in the session), not from the link.
            assert done.headers["location"] == f"/settle/entry/{ref}"
            shown = (await client.get(done.headers["location"])).text
            assert "Resolved. The evidence is kept" in shown
    finally:
        await settler.aclose()
    resolution = writer.quarantine.get(ref).resolution
    assert resolution is not None
    assert resolution.note == "[resolved by support-team] reconciled with the provider"
