"""``suppress_instrumentation()`` is how an application (and the SDK's own exporters) says
"report nothing of this work": OpenTelemetry's instrumentations (redis, ASGI, WSGI...) then
make no span and record no measurement. settle's own telemetry honours it too: its spans of
work done under it were new root traces, with no parent, as the application's own spans
around them were suppressed. Sync and async, the decorator too, on a real Redis with the
real SDK."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from opentelemetry.instrumentation.utils import suppress_instrumentation

from settle import AsyncSettler, Attempt, Settler
from settle.wsgi import IdempotencyMiddleware
from tests.http.apps import serve_wsgi
from tests.telemetry.conftest import Telemetry


def _nothing_reported(otel: Telemetry, namespace: str) -> None:
    assert [s.name for s in otel.spans()] == []
    n = {"settle.namespace": namespace}
    assert otel.count("settle.reservations", **n) == 0
    assert otel.count("settle.call.duration", **n) == 0


def test_no_span_or_measurement_under_suppress_instrumentation(
    settler: Settler, namespace: str, otel: Telemetry
) -> None:
    @settler.operation(key="charge:{order}", principal="tenant:a")
    def charge(order: str, attempt: Attempt = Attempt.INJECTED) -> int:
        return attempt.number

    with suppress_instrumentation():
        r = settler.reserve("op-1", {"n": 1}, principal="tenant:a")
        settler.complete(r.reservation, {"ok": True})
        settler.reserve("op-1", {"n": 1}, principal="tenant:a")
        assert charge("o-1") == 1
        settler.quarantine.list()
    _nothing_reported(otel, namespace)
    # Outside it, reported as ever.
    settler.reserve("op-2", {"n": 1}, principal="tenant:a")
    assert [s.name for s in otel.spans() if s.name.startswith("settle.")] == ["settle.reserve"]


@pytest.mark.asyncio
async def test_no_async_span_or_measurement_under_suppress_instrumentation(
    async_settler: AsyncSettler, namespace: str, otel: Telemetry
) -> None:
    s = async_settler

    @s.operation(key="charge:{order}", principal="tenant:a")
    async def charge(order: str, attempt: Attempt = Attempt.INJECTED) -> int:
        return attempt.number

    with suppress_instrumentation():
        r = await s.reserve("op-1", {"n": 1}, principal="tenant:a")
        await s.complete(r.reservation, {"ok": True})
        assert await charge("o-1") == 1
    _nothing_reported(otel, namespace)
    await s.reserve("op-2", {"n": 1}, principal="tenant:a")
    assert [x.name for x in otel.spans() if x.name.startswith("settle.")] == ["settle.reserve"]


def test_a_heartbeat_thread_reports_nothing_of_a_suppressed_call(
    redis_url: str, namespace: str, otel: Telemetry
) -> None:
    """The sync heartbeat renews from a thread of its own: the caller's suppression goes
    with its renewals, which were reported as spans with no parent."""
    settler = Settler.from_url(redis_url, namespace=namespace, lease=0.6)

    @settler.operation(key="slow:{order}", principal="tenant:a")
    def slow(order: str) -> int:
        time.sleep(0.7)  # two renewals (every 0.2 s)
        return 1

    try:
        with suppress_instrumentation():
            assert slow("o-1") == 1
        assert otel.spans("settle.renew") == []
        assert slow("o-2") == 1  # the same heartbeat, reported as ever
        assert len(otel.spans("settle.renew")) >= 2
    finally:
        settler.close()


def _suppressing(app: Any) -> Any:
    """A WSGI app whose requests run under ``suppress_instrumentation()``."""

    def suppressed(environ: dict[str, Any], start_response: Any) -> Any:
        with suppress_instrumentation():
            return app(environ, start_response)

    return suppressed


def test_a_suppressed_wsgi_request_is_reported_nowhere(
    redis_url: str, namespace: str, otel: Telemetry
) -> None:
    """The WSGI guard renews a request's lease from the heartbeat thread too."""

    def handler(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        time.sleep(0.7)
        start_response("201 Created", [("Content-Type", "application/json")])
        return [b"{}"]

    settler = Settler.from_url(redis_url, namespace=namespace, lease=0.6)
    app = IdempotencyMiddleware(handler, settler=settler, principal=lambda _e: "tenant:a")
    try:
        with serve_wsgi(_suppressing(app)) as base:
            posted = httpx.post(
                f"{base}/pay", json={"n": 1}, headers={"Idempotency-Key": "k-1"}, timeout=30
            )
            assert posted.status_code == 201
    finally:
        settler.close()
    _nothing_reported(otel, namespace)
    assert otel.count("settle.http.requests", **{"settle.namespace": namespace}) == 0
