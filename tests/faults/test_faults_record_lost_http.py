"""An HTTP handler whose record Redis lost while it ran (SPEC §7: a handler that completed is
never executed again for the same key): the server restarts without persistence between the
reserve and the store of the response. The handler ran (the payment is made); its settlement
is quarantined as ``unknown_operation``. Answering 409 with ``Retry-After`` ("retry with the
same key to get the authoritative outcome") sends a compliant client straight back, and the
retry runs the handler a second time: nothing remembers the first run."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from settle import AsyncSettler, Settler
from settle.asgi import IdempotencyMiddleware
from settle.embedded import EmbeddedRedis
from settle.wsgi import IdempotencyMiddleware as WSGIMiddleware
from settle.wsgi import current_attempt
from tests.http.apps import serve_wsgi

pytestmark = [pytest.mark.faults]


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as s:  # persistence off: a restart comes back empty
        yield s


async def _post(mw: Any, key: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/pay",
        "query_string": b"",
        "headers": [(b"idempotency-key", key), (b"content-type", b"application/json")],
    }
    sent = False
    start: dict[str, Any] = {}
    body: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b'{"amount": 10}', "more_body": False}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            body.append(message.get("body", b""))

    await mw(scope, receive, send)
    return start["status"], dict(start.get("headers", [])), b"".join(body)


def test_a_handler_whose_record_was_lost_answers_its_response_not_a_retry_invitation(
    server: EmbeddedRedis,
) -> None:
    async def main() -> None:
        settler = AsyncSettler.from_url(server.url, namespace="lost-http", shards=2)
        runs = 0

        async def app(scope: Any, receive: Any, send: Any) -> None:
            nonlocal runs
            await receive()
            runs += 1
            if runs == 1:  # the charge is made; then Redis forgets the reservation
                await asyncio.to_thread(lambda: (server.stop(kill=True), server.start()))
            await send({"type": "http.response.start", "status": 201, "headers": []})
            await send({"type": "http.response.body", "body": b'{"charged": 10}'})

        mw = IdempotencyMiddleware(app, settler=settler, principal=lambda scope: "tenant:a")
        try:
            status, headers, body = await _post(mw, b"k-lost")
            assert runs == 1
            # The handler's own outcome, not an invitation to run it again.
            assert (status, body) == (201, b'{"charged": 10}'), (status, headers, body)
            assert b"retry-after" not in headers
        finally:
            await settler.aclose()

    asyncio.run(main())


def test_a_large_response_whose_record_was_lost_streams_on_not_a_retry_invitation(
    server: EmbeddedRedis,
) -> None:
    """The same loss, for a response over ``max_response_bytes`` that must be sent on
    before its end: the renewal asked first finds no record (``unknown_operation``), so no
    newer attempt owns the key; the client gets the handler's response, not a 409."""

    async def main() -> None:
        settler = AsyncSettler.from_url(server.url, namespace="lost-http", shards=2)
        runs = 0

        async def app(scope: Any, receive: Any, send: Any) -> None:
            nonlocal runs
            await receive()
            runs += 1
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await asyncio.to_thread(lambda: (server.stop(kill=True), server.start()))
            await send({"type": "http.response.body", "body": b"x" * 64, "more_body": True})
            await send({"type": "http.response.body", "body": b"y" * 64})

        mw = IdempotencyMiddleware(
            app, settler=settler, principal=lambda scope: "tenant:a", max_response_bytes=32
        )
        try:
            status, headers, body = await _post(mw, b"k-lost-large")
            assert runs == 1
            assert (status, body) == (200, b"x" * 64 + b"y" * 64), (status, headers, body)
        finally:
            await settler.aclose()

    asyncio.run(main())


def test_a_record_lost_before_a_lease_renewal_does_not_cancel_the_handler(
    server: EmbeddedRedis,
) -> None:
    """The same loss, noticed by the periodic lease renewal while the handler still runs
    (a handler longer than a third of the lease): the renewal finds no record
    (``unknown_operation``), so no newer attempt owns the key. Cancelling the handler and
    answering 409 with ``Retry-After`` sends the client back to run it again (the charge is
    made); the handler runs to its end and its response goes out, unstored."""

    async def main() -> None:
        settler = AsyncSettler.from_url(server.url, namespace="lost-http", shards=2)
        runs = 0
        finished = 0

        async def app(scope: Any, receive: Any, send: Any) -> None:
            nonlocal runs, finished
            await receive()
            runs += 1
            await asyncio.to_thread(lambda: (server.stop(kill=True), server.start()))
            await asyncio.sleep(1.0)  # renewals every 0.2 s find no record
            finished += 1
            await send({"type": "http.response.start", "status": 201, "headers": []})
            await send({"type": "http.response.body", "body": b'{"charged": 10}'})

        mw = IdempotencyMiddleware(
            app, settler=settler, principal=lambda scope: "tenant:a", lease=0.6
        )
        try:
            with capture_logs() as logs:
                status, headers, body = await _post(mw, b"k-lost-renewal")
            assert (runs, finished) == (1, 1)
            # Told apart from a lost lease in the logs: the record was gone, nobody took over.
            failed = [e for e in logs if e["event"] == "settle.http.renew_failed"]
            assert "unknown_operation" in [e.get("reason") for e in failed]
            assert "settle.http.lease_lost" not in [e["event"] for e in logs]
            assert (status, body) == (201, b'{"charged": 10}'), (status, headers, body)
            assert b"retry-after" not in headers
        finally:
            await settler.aclose()

    asyncio.run(main())


def test_under_wsgi_a_record_lost_before_a_lease_renewal_leaves_the_attempt_unmarked(
    server: EmbeddedRedis,
) -> None:
    """Found in a hunt: the same loss under the WSGI guard, whose heartbeat thread marked
    the attempt lost when a renewal found no record. A sync handler that calls
    ``attempt.check()`` between its steps (as docs/http-endpoints.md advises) raised
    ``StaleAttempt`` after its charge, its client got the server's 500, and the client's
    retry ran the charge again; under ASGI the same handler runs on and its client gets its
    201. The attempt stays unmarked and the response goes out, unstored, as under ASGI."""
    settler = Settler.from_url(server.url, namespace="lost-wsgi", shards=2)
    runs: list[bool] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        attempt = current_attempt(environ)
        environ["wsgi.input"].read()
        server.stop(kill=True)
        server.start()
        time.sleep(1.0)  # renewals every 0.2 s find no record
        runs.append(attempt.lost)
        attempt.check()  # before the next step: the lease is not lost
        start_response("201 Created", [("Content-Type", "application/json")])
        return [b'{"charged": 10}']

    guarded = WSGIMiddleware(app, settler=settler, principal=lambda environ: "tenant:a", lease=0.6)
    try:
        with capture_logs() as logs, serve_wsgi(guarded) as base:
            answer = httpx.post(
                f"{base}/pay",
                content=b'{"amount": 10}',
                headers={"Idempotency-Key": "k-lost-wsgi", "Content-Type": "application/json"},
                timeout=30,
            )
        assert runs == [False]
        assert (answer.status_code, answer.content) == (201, b'{"charged": 10}')
        assert "retry-after" not in answer.headers
        failed = [e for e in logs if e["event"] == "settle.http.renew_failed"]
        assert "unknown_operation" in [e.get("reason") for e in failed]
        assert "settle.http.record_lost" in [e["event"] for e in logs]
    finally:
        settler.close()
