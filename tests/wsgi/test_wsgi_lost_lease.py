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
from structlog.testing import capture_logs

from settle import Attempt, Reserved, Settler, State
from settle.errors import StaleAttempt
from settle.flask import Idempotency
from settle.http.stored import StoredResponse
from settle.wsgi import IdempotencyMiddleware, current_attempt
from tests.http.apps import serve_wsgi
from tests.wsgi.test_wsgi_middleware import KEY, _holder, _take_over, principal

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


def lapse(settler: Settler, attempt: Attempt) -> int:
    """As :func:`lose`, but the way a lease is lost in production: it lapses (the worker
    stalled; shortened here, between two heartbeats) and a retry takes the key over, with
    no settlement of this attempt on the record (``_take_over`` marks it provisional
    first, after which SPEC S13 absorbs a repeat of that mark)."""
    operation = attempt.operation_id
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        holder = _holder(settler, operation)
        settler.renew(holder, lease=0.02)
        time.sleep(0.05)
        newer = settler.reserve(operation, principal="tenant:acme", fingerprint=holder.fingerprint)
        if isinstance(newer, Reserved):  # else a heartbeat renewed it meanwhile: again
            break
    assert isinstance(newer, Reserved)
    while not attempt.lost and time.monotonic() < deadline:
        time.sleep(0.02)
    assert attempt.lost
    return newer.reservation.generation


def superseded_and_untouched(
    settler: Settler, answer: httpx.Response, operation: str, newer: int
) -> None:
    assert answer.status_code == 409, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["type"].endswith("attempt-superseded")
    untouched(settler, operation, newer)


def guarded_flask(settler: Settler, **options: Any) -> Flask:
    app = Flask(__name__)
    app.config["SETTLE"] = {
        "settler": settler,
        "principal": lambda req: req.headers.get("X-Principal"),
        "lease": LEASE,
        **options,
    }
    Idempotency(app)
    return app


def untouched(settler: Settler, operation: str, newer: int) -> None:
    """The stale attempt settled nothing: the record is the newer attempt's, as it left it,
    and no settlement of the stale one was quarantined."""
    record = settler.get(operation)
    assert record is not None
    assert record.state is State.PENDING
    assert record.generation == newer
    assert settler.quarantine.list(operation_id=operation) == []


@pytest.mark.parametrize("lost", ["taken-over", "lapsed"])
@pytest.mark.parametrize("ends", ["check", "503"])
def test_a_plain_wsgi_handler_that_lost_its_lease(settler: Settler, ends: str, lost: str) -> None:
    seen: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        attempt = current_attempt(environ)
        seen["operation"] = attempt.operation_id
        seen["newer"] = (lose if lost == "taken-over" else lapse)(settler, attempt)
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
    app = guarded_flask(settler)

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


@pytest.mark.parametrize("how", ["cause", "context", "context-beside-a-cause", "group"])
def test_a_stale_attempt_raised_from_gets_the_409(settler: Settler, how: str) -> None:
    """The handler wraps the ``StaleAttempt`` of ``attempt.check()`` in its own error (a
    client library's, a framework's, an exception group of calls made together): still the
    stop the docs ask for, and logged as one."""
    seen: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        attempt = current_attempt(environ)
        seen["operation"] = attempt.operation_id
        seen["newer"] = lose(settler, attempt)
        if how == "group":  # as concurrent calls gather their errors, outside any except
            with pytest.raises(StaleAttempt) as stopped:
                attempt.check()
            raise ExceptionGroup("the calls made together", [ValueError("x"), stopped.value])
        try:
            attempt.check()
        except StaleAttempt as exc:
            if how == "cause":
                raise RuntimeError("the charge was stopped") from exc
            if how == "context-beside-a-cause":
                raise RuntimeError("the charge was stopped") from OSError("the socket")
            raise RuntimeError("the charge was stopped")  # noqa: B904  # __context__ only
        raise AssertionError("check() did not raise")

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal, lease=LEASE)
    with (
        capture_logs() as events,
        serve_wsgi(guarded) as base,
        httpx.Client(base_url=base, timeout=30) as client,
    ):
        answer = client.post("/charge", content=b"x", headers=KEY)
    superseded_and_untouched(settler, answer, seen["operation"], seen["newer"])
    abandoned = [e for e in events if e["event"] == "settle.http.abandoned"]
    assert [e["reason"] for e in abandoned] == ["lease_lost"]


def test_another_error_after_the_lease_was_lost_gets_the_409_unsettled(settler: Settler) -> None:
    """A genuine error of a handler whose lease was lost (its own, raised after the loss)
    gets the 409 ``attempt-superseded`` ASGI answers when it stops such a handler (it used
    to reach the server: its 500), and the stale attempt still settles nothing."""
    seen: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        attempt = current_attempt(environ)
        seen["operation"] = attempt.operation_id
        seen["newer"] = lose(settler, attempt)
        raise ValueError("a bug")

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal, lease=LEASE)
    with serve_wsgi(guarded) as base, httpx.Client(base_url=base, timeout=30) as client:
        answer = client.post("/charge", content=b"x", headers=KEY)
    superseded_and_untouched(settler, answer, seen["operation"], seen["newer"])


def test_a_stale_attempt_of_another_operation_under_a_held_lease_is_an_error(
    settler: Settler,
) -> None:
    """A ``StaleAttempt`` the handler lets out while its own lease is held (one of a guarded
    call it made, on another operation) is its error: the server's 500, the attempt marked
    provisional, never a 409 that would say a newer attempt owns this key."""
    seen: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        seen["operation"] = current_attempt(environ).operation_id
        raise StaleAttempt(
            "attempt 1 of another operation lost its lease", operation_id="other", record=None
        )

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal, lease=LEASE)
    with serve_wsgi(guarded) as base, httpx.Client(base_url=base, timeout=30) as client:
        answer = client.post("/charge", content=b"x", headers=KEY)
    assert answer.status_code == 500
    assert "attempt-superseded" not in answer.text
    record = settler.get(seen["operation"])
    assert record is not None
    assert record.state is State.PROVISIONAL
    assert record.reason == "exception"


@pytest.mark.parametrize("lost", ["taken-over", "lapsed"])
def test_a_hook_refusal_after_the_lease_was_lost_settles_nothing(
    settler: Settler, lost: str
) -> None:
    """A ``before_request`` hook that answers after the lease was lost (a slow identity
    provider, a client that retried meanwhile): the refusal is sent, and the stale attempt
    marks nothing (no quarantine entry against the newer attempt's record), logged as an
    attempt abandoned on its lost lease."""
    seen: dict[str, Any] = {}
    runs: list[str] = []
    app = guarded_flask(settler)

    @app.before_request
    def slow_auth() -> Any:
        attempt = g.settle
        seen["operation"] = attempt.operation_id
        seen["newer"] = (lose if lost == "taken-over" else lapse)(settler, attempt)
        return {"error": "the token has expired"}, 401

    @app.post("/charge")
    def charge() -> Any:
        runs.append("charge")
        return {"charged": True}, 201

    with (
        capture_logs() as events,
        serve_wsgi(app) as base,
        httpx.Client(base_url=base, timeout=30) as client,
    ):
        answer = client.post("/charge", content=b"x", headers=KEY)
    assert answer.status_code == 401
    assert runs == []
    untouched(settler, seen["operation"], seen["newer"])
    abandoned = [e["reason"] for e in events if e["event"] == "settle.http.abandoned"]
    assert abandoned == ["lease_lost"]


@pytest.mark.parametrize("newer_done", [False, True])
def test_a_response_to_store_after_the_lease_was_lost_is_quarantined(
    settler: Settler, newer_done: bool
) -> None:
    """A handler that did not check and answered a 201 after its lease was lost: its
    response still goes to ``complete``, which keeps it as evidence in quarantine (its
    effect may have happened twice), and the client gets the authoritative response, or
    409 while the newer attempt runs."""
    seen: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        attempt = current_attempt(environ)
        seen["operation"] = attempt.operation_id
        newer = _take_over(settler, attempt.operation_id)
        deadline = time.monotonic() + 5
        while not attempt.lost and time.monotonic() < deadline:
            time.sleep(0.02)
        assert attempt.lost
        if newer_done:
            done = StoredResponse.capture(201, [], b'{"charge": "newer"}', ())
            settler.complete(newer.reservation, done)
        start_response("201 Created", [("Content-Type", "application/json")])
        return [b'{"charge": "stale"}']

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal, lease=LEASE)
    with serve_wsgi(guarded) as base, httpx.Client(base_url=base, timeout=30) as client:
        answer = client.post("/charge", content=b"x", headers=KEY)
    if newer_done:
        assert answer.status_code == 201
        assert answer.content == b'{"charge": "newer"}'
    else:
        assert answer.status_code == 409
        assert answer.json()["type"].endswith("attempt-superseded")
    evidence = settler.quarantine.list(operation_id=seen["operation"])
    assert len(evidence) == 1
