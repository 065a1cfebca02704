"""The WSGI guard's heartbeat (the decorator's heartbeat thread, renewing a request's
lease while its handler runs) reports like the decorator's: its ``settle.renew`` spans are
children of the request's server span (OpenTelemetry's WSGI instrumentation), and a failed
renewal's event names the request (namespace, method, path), never its key. Real Redis,
a real threading WSGI server; a failed renewal is a real dropped connection (the fault
tests' proxy)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.instrumentation.wsgi import OpenTelemetryMiddleware as WsgiTelemetry
from structlog.testing import capture_logs

from settle import Settler
from settle._core.scripts import SCRIPTS
from settle._runtime.transient import ATTEMPTS
from settle.wsgi import IdempotencyMiddleware
from tests.faults.servers import proxy_to, script_needle, sync_client
from tests.faults.tcp_proxy import FaultyProxy
from tests.http.apps import serve_wsgi
from tests.telemetry.conftest import Telemetry

KEY = "wsgi-heartbeat-key-9c1e"


def _slow(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """A handler that outlives two lease renewals (lease 0.6 s: renewed every 0.2 s)."""
    time.sleep(0.7)
    start_response("201 Created", [("Content-Type", "application/json")])
    return [b"{}"]


def _app(settler: Settler) -> IdempotencyMiddleware:
    return IdempotencyMiddleware(_slow, settler=settler, principal=lambda _environ: "tenant:acme")


def _post(base: str) -> httpx.Response:
    return httpx.post(
        f"{base}/pay", json={"amount": 1}, headers={"Idempotency-Key": KEY}, timeout=30
    )


def test_wsgi_renewals_are_children_of_the_request(
    redis_url: str, namespace: str, otel: Telemetry
) -> None:
    settler = Settler.from_url(redis_url, namespace=namespace, shards=4, lease=0.6)
    try:
        with serve_wsgi(WsgiTelemetry(_app(settler))) as base:
            assert _post(base).status_code == 201
    finally:
        settler.close()
    [server] = [s for s in otel.spans() if s.kind.name == "SERVER"]
    assert server.context is not None
    renewals = otel.spans("settle.renew")
    assert len(renewals) >= 2
    for renewal in renewals:
        assert renewal.parent is not None
        assert renewal.parent.span_id == server.context.span_id
        assert renewal.context is not None
        assert renewal.context.trace_id == server.context.trace_id


@pytest.fixture
def proxy(redis_url: str) -> Iterator[FaultyProxy]:
    running = proxy_to(redis_url, SCRIPTS)
    yield running
    running.close()


def test_a_failed_wsgi_renewal_names_its_request(proxy: FaultyProxy, namespace: str) -> None:
    settler = Settler(sync_client(proxy.port), namespace=namespace, shards=4, lease=0.6)
    # Every try of the first renewal is cut (settle's own retries included): it raises.
    proxy.cut(script_needle(SCRIPTS, "renew"), "before_request", times=ATTEMPTS)
    try:
        with capture_logs() as logs, serve_wsgi(_app(settler)) as base:
            assert _post(base).status_code == 201
    finally:
        settler.close()
    failed = [e for e in logs if e["event"] == "settle.operation.heartbeat_failed"]
    assert failed
    for event in failed:
        assert event["namespace"] == namespace
        assert event["method"] == "POST"
        assert event["path"] == "/pay"
        assert event["error"] == "BackendError"
        assert isinstance(event["operation_digest"], str)
        assert KEY not in repr(event)
