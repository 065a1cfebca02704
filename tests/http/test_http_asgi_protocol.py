"""What a guarded app sends that ASGI allows, or that ASGI forbids, behind a real uvicorn:
the first client gets what uvicorn alone would give it, and an app's protocol error is
uvicorn's to report (as without settle), never a settlement of its own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from settle import AsyncSettler, Settler, State
from settle.asgi import IdempotencyMiddleware
from settle.http.keys import operation_id
from settle.http.stored import StoredResponse
from tests.http.apps import serve

pytestmark = pytest.mark.asyncio

TENANT = "tenant:acme"


def tenant(scope: Any) -> str:
    return TENANT


async def body_of(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return body


def guarded(app: Any, settler: AsyncSettler) -> Any:
    return IdempotencyMiddleware(app, settler=settler, principal=tenant, paths=["/pay"])


async def bare_first_again(
    app: Any, redis_url: str, namespace: str, key: str
) -> tuple[httpx.Response, httpx.Response, httpx.Response]:
    """``app`` under a real uvicorn: a POST to ``/open`` (not guarded: uvicorn alone), then
    two to ``/pay`` (guarded) with the Idempotency-Key ``key``."""
    app_settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
    with serve(guarded(app, app_settler), app_settler) as base:
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            bare = await client.post("/open", content=b"x")
            first = await client.post("/pay", content=b"x", headers={"Idempotency-Key": key})
            again = await client.post("/pay", content=b"x", headers={"Idempotency-Key": key})
    return bare, first, again


async def test_a_body_sent_after_the_last_one_is_uvicorns_error_and_settles_nothing(
    redis_url: str, namespace: str, settler: Settler
) -> None:
    """A handler that sends a second body after ``more_body=False``: uvicorn refuses it
    with a RuntimeError, guarded or not; the stored response is the one the client got, and
    no "conflicting settlement" is made up from the refused bytes."""
    refused: dict[str, str] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await body_of(receive)
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": False})
        try:
            await send({"type": "http.response.body", "body": b"second", "more_body": False})
        except RuntimeError as exc:
            refused[scope["path"]] = str(exc)

    bare, first, again = await bare_first_again(app, redis_url, namespace, "k-1")

    assert (first.status_code, first.content) == (201, b"first")
    assert (bare.status_code, bare.content) == (201, b"first")
    assert refused["/pay"] == refused["/open"]  # uvicorn's own refusal, guarded or not
    assert "after response already completed" in refused["/pay"]
    assert (again.status_code, again.content) == (201, b"first")
    assert again.headers["idempotent-replayed"] == "true"
    record = settler.get(operation_id("http", "k-1", TENANT, "principal"))
    assert record is not None
    assert record.state is State.COMPLETED
    assert record.value(StoredResponse).body == b"first"
    assert settler.quarantine.list() == []


async def test_a_body_sent_before_the_start_is_uvicorns_error_and_runs_again(
    redis_url: str, namespace: str, settler: Settler
) -> None:
    """A handler that sends its body before ``http.response.start`` gets uvicorn's own
    RuntimeError (not an assertion of settle's); the attempt is provisional and the retry
    runs the handler again."""
    refused: list[tuple[str, str]] = []
    runs: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await body_of(receive)
        if "settle" in scope:
            runs.append(scope["settle"].generation)
        try:
            await send({"type": "http.response.body", "body": b"early", "more_body": False})
        except Exception as exc:
            refused.append((type(exc).__name__, str(exc)))
            raise

    bare, first, again = await bare_first_again(app, redis_url, namespace, "k-2")

    assert bare.status_code == first.status_code == again.status_code == 500
    assert refused[0][0] == "RuntimeError"
    assert refused == [refused[0]] * 3  # the same refusal, guarded or not
    assert len(runs) == 2
    assert runs[1] > runs[0]  # provisional, then run again under a new generation
    record = settler.get(operation_id("http", "k-2", TENANT, "principal"))
    assert record is not None
    assert (record.state, record.reason) == (State.PROVISIONAL, "exception")


async def test_response_headers_given_as_an_iterator_reach_the_first_client(
    redis_url: str, namespace: str
) -> None:
    """ASGI's ``headers`` is any iterable of pairs: a generator's headers reach the first
    client as they do without settle, and are the ones stored and replayed."""

    def headers() -> Iterator[tuple[bytes, bytes]]:
        yield b"content-type", b"application/json"
        yield b"location", b"/payments/p-1"

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await body_of(receive)
        await send({"type": "http.response.start", "status": 201, "headers": headers()})
        await send({"type": "http.response.body", "body": b'{"id":"p-1"}'})

    bare, first, again = await bare_first_again(app, redis_url, namespace, "k-3")

    for response in (bare, first, again):
        assert response.status_code == 201
        assert response.headers["content-type"] == "application/json"
        assert response.headers["location"] == "/payments/p-1"
        assert response.content == b'{"id":"p-1"}'
    assert "idempotent-replayed" not in first.headers
    assert again.headers["idempotent-replayed"] == "true"


async def test_a_second_start_is_refused_and_the_first_one_stands(
    redis_url: str, namespace: str, settler: Settler
) -> None:
    """A handler that sends ``http.response.start`` twice: uvicorn refuses the second with a
    RuntimeError and the first is the response. The middleware, holding the first back to
    store it, took the second in its place without a word: the client got, and the store
    kept, a status the server would never have sent."""
    refused: dict[str, str] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await body_of(receive)
        await send({"type": "http.response.start", "status": 201, "headers": []})
        try:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        except RuntimeError as exc:
            refused[scope["path"]] = str(exc)
        await send({"type": "http.response.body", "body": b"paid"})

    bare, first, again = await bare_first_again(app, redis_url, namespace, "k-4")

    assert (bare.status_code, bare.content) == (201, b"paid")
    assert (first.status_code, first.content) == (201, b"paid")
    assert (again.status_code, again.content) == (201, b"paid")
    assert again.headers["idempotent-replayed"] == "true"
    assert refused["/pay"] == refused["/open"]
    record = settler.get(operation_id("http", "k-4", TENANT, "principal"))
    assert record is not None
    assert record.value(StoredResponse).status == 201
