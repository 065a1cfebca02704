"""Cases of peer ASGI idempotency middlewares' own suites (ronango/fastapi-idempotency,
snok/asgi-idempotency-header) run against settle's middleware on a real Redis: what a
client of such an endpoint relies on that settle's own suite did not spell out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from settle import AsyncSettler
from settle.asgi import IdempotencyMiddleware

pytestmark = pytest.mark.asyncio

KEY = {"Idempotency-Key": "k-1"}


def tenant(scope: Any) -> str:
    return "tenant:acme"


async def body_of(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return body
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return body


def client(app: Any, settler: AsyncSettler, **options: Any) -> httpx.AsyncClient:
    guarded = IdempotencyMiddleware(app, settler=settler, principal=tenant, **options)
    transport = httpx.ASGITransport(app=guarded, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://testserver")


async def test_lifespan_and_websocket_scopes_reach_the_app_untouched(
    async_settler: AsyncSettler,
) -> None:
    seen: list[tuple[str, bool]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((scope["type"], "settle" in scope))

    guarded = IdempotencyMiddleware(app, settler=async_settler, principal=tenant)

    async def receive() -> dict[str, Any]:
        return {"type": "lifespan.startup"}

    async def send(message: Any) -> None:
        raise AssertionError(f"the middleware answered a non-HTTP scope: {message}")

    await guarded({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
    websocket = {"type": "websocket", "path": "/payments", "query_string": b""}
    await guarded({**websocket, "headers": [(b"idempotency-key", b"k-1")]}, receive, send)
    assert seen == [("lifespan", False), ("websocket", False)]


async def test_a_chunked_body_over_the_limit_is_413_and_one_at_the_limit_runs(
    async_settler: AsyncSettler,
) -> None:
    """No Content-Length: the limit holds on what arrives (fastapi-idempotency's
    ``test_chunked_body_overflow_returns_413``, ``test_chunked_body_at_exact_limit_passes``)."""
    runs: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        runs.append(await body_of(receive))
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def over() -> AsyncIterator[bytes]:
        yield b"a" * 60
        yield b"b" * 60

    async def at_limit() -> AsyncIterator[bytes]:
        yield b"a" * 50
        yield b"b" * 50

    async with client(app, async_settler, max_request_bytes=100) as c:
        refused = await c.post("/payments", headers=KEY, content=over())
        assert refused.status_code == 413
        assert refused.headers["content-type"] == "application/problem+json"
        assert runs == []
        accepted = await c.post("/payments", headers=KEY, content=at_limit())
        assert accepted.status_code == 201
        assert runs == [b"a" * 50 + b"b" * 50]


async def test_a_handler_that_fails_after_its_first_chunk_is_not_stored_and_runs_again(
    async_settler: AsyncSettler,
) -> None:
    """fastapi-idempotency's ``test_streaming_app_raises_mid_stream_releases_slot``: the
    response that broke off is never replayed; the retry runs the handler, and its
    finished response is what is replayed from then on."""
    runs = 0

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal runs
        await body_of(receive)
        runs += 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part ", "more_body": True})
        if runs == 1:
            raise RuntimeError("the database went away mid-response")
        await send({"type": "http.response.body", "body": f"run {runs}".encode()})

    async with client(app, async_settler) as c:
        broken = await c.post("/payments", headers=KEY, content=b"x")
        assert broken.status_code == 500
        assert b"part" not in broken.content
        retried = await c.post("/payments", headers=KEY, content=b"x")
        assert (retried.status_code, retried.content) == (200, b"part run 2")
        assert "idempotent-replayed" not in retried.headers
        replayed = await c.post("/payments", headers=KEY, content=b"x")
        assert replayed.content == b"part run 2"
        assert replayed.headers["idempotent-replayed"] == "true"
    assert runs == 2


async def test_put_is_guarded_when_configured_and_delete_and_get_pass_through(
    async_settler: AsyncSettler,
) -> None:
    """snok/asgi-idempotency-header's method configurations: ``methods`` decides."""
    runs: list[tuple[str, bool]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await body_of(receive)
        runs.append((scope["method"], "settle" in scope))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(len(runs)).encode()})

    async with client(app, async_settler, methods=["POST", "PATCH", "PUT"]) as c:
        first = await c.put("/accounts/7", headers=KEY, content=b"x")
        again = await c.put("/accounts/7", headers=KEY, content=b"x")
        assert again.content == first.content == b"1"
        assert again.headers["idempotent-replayed"] == "true"
        assert (await c.put("/accounts/7", content=b"x")).status_code == 400
        for method in ("DELETE", "GET", "DELETE"):
            passed = await c.request(method, "/accounts/7", headers=KEY)
            assert passed.status_code == 200
            assert "idempotent-replayed" not in passed.headers
    assert runs == [("PUT", True), ("DELETE", False), ("GET", False), ("DELETE", False)]


@pytest.mark.parametrize(
    ("media_type", "body"),
    [
        ("text/html; charset=utf-8", "<p>Zahlung \u00fcber 10 \u20ac</p>".encode()),
        ("application/xml", b"<?xml version='1.0'?><receipt id='7'/>"),
        ("application/pdf", bytes(range(256)) * 4),
    ],
)
async def test_non_json_responses_are_replayed_byte_for_byte(
    async_settler: AsyncSettler, media_type: str, body: bytes
) -> None:
    runs = 0

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal runs
        await body_of(receive)
        runs += 1
        headers = [(b"content-type", media_type.encode())]
        await send({"type": "http.response.start", "status": 201, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async with client(app, async_settler) as c:
        first = await c.post("/receipts", headers=KEY, content=b"x")
        replay = await c.post("/receipts", headers=KEY, content=b"x")
    assert replay.content == first.content == body
    assert replay.headers["content-type"] == media_type
    assert (replay.status_code, replay.headers["idempotent-replayed"]) == (201, "true")
    assert runs == 1
