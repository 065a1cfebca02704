"""A WSGI handler whose lease a newer attempt took over, and that stops as the docs ask
(``attempt.check()`` raises ``StaleAttempt``) or answers an error: the client gets
``409 attempt-superseded``, as under ASGI (which stops the handler itself), never the stale
attempt's 500; and the stale attempt settles nothing (no ``mark_provisional`` against the
newer attempt's record, no quarantine entry), as under ASGI and the decorator. A real Flask
app and plain WSGI apps over real HTTP, on a real Redis."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from flask import Flask, g

from settle import Attempt, Settler, State
from settle.flask import Idempotency
from settle.wsgi import IdempotencyMiddleware, current_attempt
from tests.http.apps import serve_wsgi
from tests.wsgi.test_wsgi_middleware import KEY, _take_over, principal

LEASE = 0.6


def lose(settler: Settler, attempt: Attempt) -> int:
    """A newer attempt takes the key over; wait until the heartbeat tells this one. The
    newer attempt's generation."""
    newer = _take_over(settler, attempt.operation_id)
    deadline = time.monotonic() + 5
    while not attempt.lost and time.monotonic() < deadline:
        time.sleep(0.02)  # the next renewal (lease / 3) finds the takeover
    assert attempt.lost
    return newer.reservation.generation


def superseded_and_untouched(
    settler: Settler, answer: httpx.Response, operation: str, newer: int
) -> None:
    assert answer.status_code == 409, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["type"].endswith("attempt-superseded")
    record = settler.get(operation)
    assert record is not None
    assert record.state is State.PENDING  # the newer attempt's, as it left it
    assert record.generation == newer
    assert settler.quarantine.list(operation_id=operation) == []


@pytest.mark.parametrize("ends", ["check", "503"])
def test_a_plain_wsgi_handler_that_lost_its_lease(settler: Settler, ends: str) -> None:
    seen: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        attempt = current_attempt(environ)
        seen["operation"] = attempt.operation_id
        seen["newer"] = lose(settler, attempt)
        if ends == "check":
            attempt.check()  # StaleAttempt: stop before the next side effect
        start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
        return [b"the provider timed out"]

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal, lease=LEASE)
    with serve_wsgi(guarded) as base, httpx.Client(base_url=base, timeout=30) as client:
        answer = client.post("/charge", content=b"x", headers=KEY)
    superseded_and_untouched(settler, answer, seen["operation"], seen["newer"])


def test_a_flask_view_that_stops_on_a_lost_lease(settler: Settler) -> None:
    seen: dict[str, Any] = {}
    app = Flask(__name__)
    app.config["SETTLE"] = {
        "settler": settler,
        "principal": lambda req: req.headers.get("X-Principal"),
        "lease": LEASE,
    }
    Idempotency(app)

    @app.post("/charge")
    def charge() -> Any:
        attempt = g.settle
        seen["operation"] = attempt.operation_id
        seen["newer"] = lose(settler, attempt)
        attempt.check()  # Flask answers the StaleAttempt with its 500
        return {"charged": True}, 201

    with serve_wsgi(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        answer = client.post("/charge", content=b"x", headers=KEY)
    superseded_and_untouched(settler, answer, seen["operation"], seen["newer"])
