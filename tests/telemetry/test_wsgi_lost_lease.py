"""What a WSGI request whose lease a newer attempt took over reports (hunt-wsgi's lost-lease
rule, seen through hunt-otel's telemetry): whichever way its handler ends (it stops on
``attempt.check()``, answers an error, or raises an error of its own), the attempt is
superseded and settles nothing, and that is what the server span's
``settle.http.outcome``, ``settle.http.requests`` and the log say, as under ASGI, which
stops such a handler itself. A real threading WSGI server behind OpenTelemetry's WSGI
instrumentation, a real Redis."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from opentelemetry.instrumentation.wsgi import OpenTelemetryMiddleware as WsgiTelemetry
from structlog.testing import capture_logs

from settle import Settler
from settle.wsgi import IdempotencyMiddleware, current_attempt
from tests.http.apps import serve_wsgi
from tests.http.test_http_late_errors import _on_event
from tests.telemetry.conftest import Telemetry
from tests.wsgi.test_wsgi_lost_lease import LEASE, lapse, lose, untouched
from tests.wsgi.test_wsgi_middleware import KEY, principal


@pytest.mark.parametrize(("ends", "status"), [("check", 409), ("503", 409), ("own-error", 409)])
def test_a_request_that_lost_its_lease_is_reported_superseded(
    settler: Settler, namespace: str, otel: Telemetry, ends: str, status: int
) -> None:
    seen: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        attempt = current_attempt(environ)
        seen["operation"] = attempt.operation_id
        seen["newer"] = lose(settler, attempt)
        if ends == "check":
            attempt.check()  # StaleAttempt: the 409
        if ends == "own-error":
            raise ValueError("a bug")  # the 409, as under ASGI, settling nothing
        start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
        return [b"the provider timed out"]

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal, lease=LEASE)
    with (
        capture_logs() as logs,
        serve_wsgi(WsgiTelemetry(guarded)) as base,
        httpx.Client(base_url=base, timeout=30) as client,
    ):
        answer = client.post("/charge", content=b"x", headers=KEY)
    assert answer.status_code == status
    untouched(settler, seen["operation"], seen["newer"])
    [server] = [s for s in otel.spans() if s.kind.name == "SERVER"]
    assert server.attributes is not None
    assert server.attributes.get("settle.http.outcome") == "superseded"
    assert otel.count("settle.http.requests", **{"settle.namespace": namespace}) == 1
    assert (
        otel.count(
            "settle.http.requests",
            **{"settle.namespace": namespace, "settle.http.outcome": "superseded"},
        )
        == 1
    )
    abandoned = [e["reason"] for e in logs if e["event"] == "settle.http.abandoned"]
    assert abandoned == ["lease_lost"]


def test_a_lease_lost_as_the_504_is_settled_is_reported_superseded(
    settler: Settler, namespace: str, otel: Telemetry
) -> None:
    """The handler raised past its ``timeout``; as the guard answers its 504 its lease
    lapses and a retry takes the key over: nothing is settled, and the request is reported
    ``superseded`` (as ASGI reports a handler whose lease was lost while it stopped), not
    ``timeout``: the newer attempt owns the operation."""
    seen: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        attempt = current_attempt(environ)
        seen["operation"], seen["attempt"] = attempt.operation_id, attempt
        time.sleep(0.2)
        raise ValueError("a bug")

    def take_over() -> None:
        seen["newer"] = lapse(settler, seen["attempt"])

    guarded = IdempotencyMiddleware(
        app, settler=settler, principal=principal, lease=LEASE, timeout=0.1
    )
    with (
        _on_event("settle.http.abandoned", "timeout", take_over),
        serve_wsgi(WsgiTelemetry(guarded)) as base,
        httpx.Client(base_url=base, timeout=30) as client,
    ):
        answer = client.post("/charge", content=b"x", headers=KEY)
    assert answer.status_code == 504
    untouched(settler, seen["operation"], seen["newer"])
    [server] = [s for s in otel.spans() if s.kind.name == "SERVER"]
    assert server.attributes is not None
    assert server.attributes.get("settle.http.outcome") == "superseded"
