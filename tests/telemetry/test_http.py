"""The middlewares put each guarded request's outcome on the HTTP server span that
OpenTelemetry's own ASGI / WSGI instrumentation makes, and count it in
``settle.http.requests``; the settle calls of the request are children of that span.
ASGI: a real Starlette app behind a real uvicorn server; WSGI: a real threading server."""

from __future__ import annotations

import asyncio
import io
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import redis
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware as AsgiTelemetry
from opentelemetry.instrumentation.wsgi import OpenTelemetryMiddleware as WsgiTelemetry
from opentelemetry.sdk.trace import ReadableSpan
from structlog.testing import capture_logs

from settle import AsyncSettler, Settler
from settle._log import operation_digest
from settle.errors import CorruptRecord
from settle.http.keys import operation_id
from settle.http.request import fingerprint_request
from settle.wsgi import IdempotencyMiddleware
from settle.wsgi.middleware import request_head
from tests.http.apps import Ledger, key_headers, serve, serve_wsgi, starlette_app, wsgi_app
from tests.telemetry.conftest import Telemetry

#: The outcome of each request the scenario sends, in order.
EXPECTED = [
    ("/payments", "executed"),
    ("/payments", "replayed"),
    ("/payments", "mismatch"),  # the same key with another body
    ("/payments", "rejected"),  # no key
    ("/flaky", "provisional"),  # a 500: the attempt is marked provisional
    ("/flaky", "executed"),
    ("/gated", "conflict"),  # while the first /gated request runs
    ("/gated", "executed"),
]


def _path(span: ReadableSpan) -> str:
    return urlsplit(str(span.attributes["http.url"])).path


def _server_spans(otel: Telemetry) -> list[ReadableSpan]:
    return [s for s in otel.spans() if s.kind.name == "SERVER"]


def _check(otel: Telemetry, ns: str) -> None:
    servers = _server_spans(otel)
    seen = sorted((_path(s), s.attributes.get("settle.http.outcome")) for s in servers)
    assert seen == sorted(EXPECTED)
    for span in servers:
        assert span.attributes["settle.namespace"] == ns
    executed = next(
        s
        for s in servers
        if s.attributes["settle.http.outcome"] == "executed" and _path(s) == "/payments"
    )
    names = [s.name for s in otel.children(executed)]
    assert "settle.reserve" in names
    assert "settle.complete" in names
    n = {"settle.namespace": ns}
    for outcome in {o for _, o in EXPECTED}:
        want = sum(o == outcome for _, o in EXPECTED)
        assert otel.count("settle.http.requests", **n, **{"settle.http.outcome": outcome}) == want


async def _scenario(client: httpx.AsyncClient, ledger: Ledger) -> None:
    body = {"amount": 100, "currency": "EUR"}
    assert (
        await client.post("/payments", json=body, headers=key_headers("k-1"))
    ).status_code == 201
    replay = await client.post("/payments", json=body, headers=key_headers("k-1"))
    assert replay.headers["idempotent-replayed"] == "true"
    other = {"amount": 5, "currency": "EUR"}
    assert (
        await client.post("/payments", json=other, headers=key_headers("k-1"))
    ).status_code == 422
    assert (await client.post("/payments", json=body, headers=key_headers(None))).status_code == 400
    assert (await client.post("/flaky", json=body, headers=key_headers("k-2"))).status_code == 500
    assert (await client.post("/flaky", json=body, headers=key_headers("k-2"))).status_code == 201
    first = asyncio.create_task(client.post("/gated", json=body, headers=key_headers("k-3")))
    await asyncio.to_thread(ledger.entered.wait, 10)
    second = await client.post("/gated", json=body, headers=key_headers("k-3"))
    assert second.status_code == 409
    ledger.gate.set()
    assert (await first).status_code == 201


@pytest.mark.asyncio
async def test_asgi_outcomes_on_the_server_span(
    redis_url: str, namespace: str, otel: Telemetry
) -> None:
    ledger = Ledger()
    app_settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
    app = AsgiTelemetry(starlette_app(app_settler, ledger))
    with serve(app, app_settler) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            await _scenario(client, ledger)
    _check(otel, namespace)


@pytest.mark.asyncio
async def test_wsgi_outcomes_on_the_server_span(
    redis_url: str, namespace: str, otel: Telemetry
) -> None:
    ledger = Ledger()
    settler = Settler.from_url(redis_url, namespace=namespace, shards=4)
    app = WsgiTelemetry(wsgi_app(settler, ledger))
    with serve_wsgi(app) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            await _scenario(client, ledger)
    settler.close()
    _check(otel, namespace)


@pytest.mark.asyncio
async def test_a_principal_callable_that_raises_is_its_own_outcome_not_a_rejection(
    redis_url: str, namespace: str, otel: Telemetry
) -> None:
    """The app's principal callable raised: a 500 problem, the server's fault. Counted as
    ``rejected`` (the client's: no key, malformed, too large) it hid an outage of the
    authentication behind what looks like bad clients on the dashboard."""

    def principal(scope: Any) -> str | None:
        raise RuntimeError("the identity provider is down")

    ledger = Ledger()
    app_settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
    app = AsgiTelemetry(starlette_app(app_settler, ledger, principal=principal))
    with serve(app, app_settler) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            sent = await client.post("/payments", json={"a": 1}, headers=key_headers("k-1"))
    assert sent.status_code == 500
    [span] = _server_spans(otel)
    assert span.attributes["settle.http.outcome"] == "principal_failed"
    n = {"settle.namespace": namespace, "settle.http.outcome": "principal_failed"}
    assert otel.count("settle.http.requests", **n) == 1
    assert ledger.effects == []


KEY = "IDEMKEY-SECRET-7f3a"
PRINCIPAL = "tenant:acme"


def _environ(body: bytes = b'{"x":1}') -> dict[str, Any]:
    return {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/pay",
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "localhost",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.url_scheme": "http",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body),
        "HTTP_IDEMPOTENCY_KEY": KEY,
    }


def _created(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("201 Created", [("Content-Type", "application/json")])
    return [b"{}"]


@pytest.mark.parametrize("corruption", ["not_a_response", "not_a_record"])
def test_an_error_the_middleware_lets_through_names_the_operation_by_its_digest(
    redis_url: str, namespace: str, otel: Telemetry, corruption: str
) -> None:
    """An error the WSGI middleware lets through (the server answers its own 500) is
    recorded by the server instrumentation, message and traceback: it names the operation
    by its digest, never its id (which holds the client's Idempotency-Key); the request is
    logged as settle.http.failed and counted with the outcome ``error``. Another writer
    completed the operation id with something else, or its record is not a settle record."""
    settler = Settler.from_url(redis_url, namespace=namespace, shards=2)
    op = operation_id("http", KEY, PRINCIPAL, "principal")
    if corruption == "not_a_response":
        fingerprint = fingerprint_request(request_head(_environ()), b'{"x":1}')
        r = settler.reserve(op, None, principal=PRINCIPAL, fingerprint=fingerprint)
        settler.complete(r.reservation, {"not": "an http response"})
    else:
        with redis.Redis.from_url(redis_url) as raw:
            raw.hset(settler._core.keys.record(op), "x", "y")
    app = WsgiTelemetry(
        IdempotencyMiddleware(_created, settler=settler, principal=lambda e: PRINCIPAL)
    )
    with capture_logs() as logs, pytest.raises(CorruptRecord) as raised:
        b"".join(app(_environ(), lambda *a, **k: None))
    settler.close()

    assert KEY not in str(raised.value)
    assert f"operation_digest={operation_digest(op)}" in str(raised.value)
    assert raised.value.operation_id == op  # the id stays on the error for its handler
    [server] = _server_spans(otel)
    assert server.attributes is not None
    assert server.attributes["settle.http.outcome"] == "error"
    recorded = [ev.attributes for ev in server.events if ev.name == "exception"]
    assert recorded
    assert not any(KEY in str(dict(a or {})) for a in recorded)
    assert otel.count("settle.http.requests", **{"settle.namespace": namespace}) == 1
    [failed] = [e for e in logs if e["event"] == "settle.http.failed"]
    assert (failed["error"], failed["operation_digest"]) == ("CorruptRecord", operation_digest(op))
    assert not any(KEY in repr(e) for e in logs)


def test_a_handler_exception_that_quotes_the_operation_names_it_by_its_digest(
    redis_url: str, namespace: str, otel: Telemetry
) -> None:
    """``attempt.check()`` raises ``TimeoutError`` / ``StaleAttempt`` naming the operation
    id, which holds the client's Idempotency-Key, and a handler may quote it in its own
    errors; the handler lets one out, and the server instrumentation records its message.
    The middlewares name the operation by its digest in what leaves them, as they do for
    settle's own errors. (``check()``'s ``TimeoutError`` past a configured ``timeout`` no
    longer leaves the WSGI middleware: its client gets the 504, which quotes neither.)"""
    settler = Settler.from_url(redis_url, namespace=namespace, shards=2)
    op = operation_id("http", KEY, PRINCIPAL, "principal")

    def slow(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        attempt = environ["settle"]
        # A downstream client's timeout, well within the request's own (it escapes).
        raise TimeoutError(f"the provider did not answer the charge {attempt.operation_id}")

    app = WsgiTelemetry(
        IdempotencyMiddleware(slow, settler=settler, principal=lambda e: PRINCIPAL, timeout=30)
    )
    with pytest.raises(TimeoutError) as raised:
        b"".join(app(_environ(), lambda *a, **k: None))
    assert KEY not in str(raised.value)
    assert f"operation_digest={operation_digest(op)}" in str(raised.value)
    recorded = [ev.attributes for ev in _server_spans(otel)[0].events if ev.name == "exception"]
    assert recorded
    assert not any(KEY in str(dict(a or {})) for a in recorded)

    def past(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        attempt = environ["settle"]
        attempt.deadline = 0.0  # the timeout has passed
        attempt.check()
        raise AssertionError("check() let a passed deadline through")

    timed = IdempotencyMiddleware(past, settler=settler, principal=lambda e: PRINCIPAL, timeout=30)
    environ = {**_environ(), "HTTP_IDEMPOTENCY_KEY": f"{KEY}-late"}
    with capture_logs() as logs:
        answered = b"".join(timed(environ, lambda *a, **k: None))
    assert b"handler-timeout" in answered
    assert f"{KEY}-late".encode() not in answered
    assert logs
    assert not any(f"{KEY}-late" in repr(e) for e in logs)

    def wrapping(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        attempt = environ["settle"]
        try:
            raise OSError(5, f"cannot charge {attempt.operation_id}")
        except OSError as exc:  # the handler wraps it; the traceback shows both
            exc.add_note(f"operation {attempt.operation_id}")
            raise RuntimeError("payment failed") from exc

    again = IdempotencyMiddleware(wrapping, settler=settler, principal=lambda e: PRINCIPAL)
    with pytest.raises(RuntimeError) as wrapped:
        b"".join(again(_environ(), lambda *a, **k: None))  # the same request, retried
    cause = wrapped.value.__cause__
    assert isinstance(cause, OSError)
    assert KEY not in str(cause)  # its strerror, which str() shows, is rewritten too
    assert not any(KEY in note for note in cause.__notes__)
    assert "operation_digest=" in str(cause)

    async def asgi() -> BaseException:
        from settle.asgi import IdempotencyMiddleware as AsgiMiddleware  # noqa: PLC0415

        async def handler(scope: dict[str, Any], receive: Any, send: Any) -> None:
            scope["settle"].deadline = 0.0
            scope["settle"].check()

        a = AsyncSettler.from_url(redis_url, namespace=namespace, shards=2)
        guarded = AsgiMiddleware(handler, settler=a, principal=lambda scope: PRINCIPAL)
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/pay-asgi",
            "raw_path": b"/pay-asgi",
            "query_string": b"",
            "headers": [(b"idempotency-key", f"{KEY}-asgi".encode())],
        }
        sent = [{"type": "http.request", "body": b'{"x":2}', "more_body": False}]

        async def receive() -> dict[str, Any]:
            return sent.pop(0) if sent else {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            return None

        try:
            await guarded(scope, receive, send)
        except BaseException as exc:  # what leaves the middleware
            return exc
        finally:
            await a.aclose()
        raise AssertionError("the handler's TimeoutError did not leave the middleware")

    escaped = asyncio.run(asgi())
    assert isinstance(escaped, TimeoutError)
    assert KEY not in str(escaped)
    asgi_op = operation_id("http", f"{KEY}-asgi", PRINCIPAL, "principal")
    assert f"operation_digest={operation_digest(asgi_op)}" in str(escaped)
    settler.close()
