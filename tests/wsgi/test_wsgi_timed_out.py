"""The neighbours of the WSGI 504 (``Guard.timed_out``): a handler past its ``timeout``
whose lease was also lost is superseded (409, settling nothing, no quarantine entry against
the newer attempt), never timed out; a Flask error handler that answers the view's
exception with a 4xx has that answer stored, in time or late; a Flask 500 handler, a
Django async view and a Django view past its timeout settle as the exception they are; a
handler that moves its own ``attempt.deadline`` without a ``timeout`` configured gets no
504. Real Flask and Django apps and plain WSGI apps over real HTTP, on a real Redis."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx
import pytest
from django.http import HttpRequest, JsonResponse
from django.test import Client, override_settings
from django.urls import path
from flask import g
from structlog.testing import capture_logs
from werkzeug.test import EnvironBuilder

import tests.wsgi.test_django_views as django_views  # configures Django's settings first
from settle import Settler, State
from settle.wsgi import IdempotencyMiddleware, current_attempt
from tests.http.apps import serve_wsgi
from tests.wsgi.test_wsgi_lost_lease import (
    LEASE,
    guarded_flask,
    lose,
    superseded_and_untouched,
    untouched,
)
from tests.wsgi.test_wsgi_middleware import KEY, principal

TIMEOUT = 0.05  # passed while the heartbeat finds the takeover (lease / 3)


class PaymentDeclined(Exception):
    pass


@pytest.mark.parametrize("ends", ["raise", "503", "check"])
def test_a_lost_lease_past_the_timeout_is_superseded_not_timed_out(
    settler: Settler, ends: str
) -> None:
    """The timeout passed and a newer attempt took the key over: the stale attempt must
    settle nothing (a ``timeout`` mark would be quarantined against the newer attempt's
    record), and its client gets 409 ``attempt-superseded`` as under ASGI."""
    seen: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        attempt = current_attempt(environ)
        seen["operation"] = attempt.operation_id
        seen["newer"] = lose(settler, attempt)
        assert attempt.remaining() == 0.0  # past its deadline too
        if ends == "raise":
            raise PaymentDeclined("the charge failed")
        if ends == "check":
            attempt.check()  # StaleAttempt, though the deadline passed as well
        start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
        return [b"the provider timed out"]

    guarded = IdempotencyMiddleware(
        app, settler=settler, principal=principal, lease=LEASE, timeout=TIMEOUT
    )
    with (
        capture_logs() as logs,
        serve_wsgi(guarded) as base,
        httpx.Client(base_url=base, timeout=30) as client,
    ):
        answer = client.post("/charge", content=b"x", headers=KEY)
    superseded_and_untouched(settler, answer, seen["operation"], seen["newer"])
    abandoned = [e["reason"] for e in logs if e["event"] == "settle.http.abandoned"]
    assert abandoned == ["lease_lost"]


def test_a_flask_view_past_its_timeout_whose_lease_was_lost_is_superseded(
    settler: Settler,
) -> None:
    """The same through Flask's 500 for the view's exception (the ``Raised`` path)."""
    seen: dict[str, Any] = {}
    app = guarded_flask(settler, timeout=TIMEOUT)

    @app.post("/charge")
    def charge() -> Any:
        attempt = g.settle
        seen["operation"] = attempt.operation_id
        seen["newer"] = lose(settler, attempt)
        raise PaymentDeclined("the charge failed")

    with serve_wsgi(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        answer = client.post("/charge", content=b"x", headers=KEY)
    superseded_and_untouched(settler, answer, seen["operation"], seen["newer"])


@pytest.mark.parametrize("late", [False, True], ids=["in-time", "past-the-timeout"])
def test_a_flask_error_handler_that_answers_a_4xx_is_stored(settler: Settler, late: bool) -> None:
    """An ``errorhandler`` that turns the view's exception into a 4xx is the view's
    finished answer (Flask sends no ``got_request_exception`` for it): stored and replayed,
    the view never run again, even when it answered past its ``timeout``."""
    runs: list[int] = []
    app = guarded_flask(settler, timeout=0.2)

    @app.errorhandler(PaymentDeclined)
    def declined(exc: PaymentDeclined) -> Any:
        return {"error": str(exc)}, 402

    @app.post("/charge")
    def charge() -> Any:
        runs.append(1)
        if late:
            time.sleep(0.3)
        raise PaymentDeclined("card declined")

    with serve_wsgi(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        first = client.post("/charge", content=b"x", headers=KEY)
        again = client.post("/charge", content=b"x", headers=KEY)
    assert (first.status_code, again.status_code) == (402, 402), first.text
    assert again.headers.get("idempotent-replayed") == "true"
    assert runs == [1]


def test_a_flask_500_handler_settles_the_exception(settler: Settler) -> None:
    """A handler for 500 (``InternalServerError``) makes the answer; the attempt is still
    provisional for the view's exception, as under ASGI and plain WSGI."""
    app = guarded_flask(settler)

    @app.errorhandler(500)
    def oops(exc: Any) -> Any:
        return {"error": "internal"}, 500

    @app.post("/charge")
    def charge() -> Any:
        seen.append(g.settle.operation_id)
        raise PaymentDeclined("a bug")

    seen: list[str] = []
    with serve_wsgi(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        answer = client.post("/charge", content=b"x", headers=KEY)
    assert answer.status_code == 500
    assert answer.json() == {"error": "internal"}
    record = settler.get(seen[0])
    assert record is not None
    assert (record.state, record.reason) == (State.PROVISIONAL, "exception")


@pytest.mark.parametrize("late", [False, True], ids=["in-time", "past-the-timeout"])
def test_a_django_async_view_that_raises(settler: Settler, late: bool) -> None:
    """An async view under the (sync) middleware: Django runs it in its loop and answers
    its exception with a 500, telling settle through ``got_request_exception`` (sent from
    another thread): provisional (``exception``), or the 504 past its ``timeout``."""
    seen: list[str] = []

    async def create(request: HttpRequest) -> JsonResponse:
        seen.append(request.settle.operation_id)  # type: ignore[attr-defined]
        if late:
            await asyncio.sleep(0.3)
        raise PaymentDeclined("a bug")

    options = {"settler": settler, "principal": django_views.principal, "timeout": 0.2}
    with override_settings(
        ROOT_URLCONF=django_views.urlconf(path("c", create)),
        MIDDLEWARE=["settle.django.IdempotencyMiddleware"],
        SETTLE=options,
    ):
        client = Client(raise_request_exception=False)
        answer = client.post("/c", b"{}", "application/json", **django_views.headers("k-async"))
    record = settler.get(seen[0])
    assert record is not None
    if late:
        assert answer.status_code == 504
        assert answer.json()["type"].endswith("handler-timeout")
        assert (record.state, record.reason) == (State.PROVISIONAL, "timeout")
    else:
        assert answer.status_code == 500
        assert (record.state, record.reason) == (State.PROVISIONAL, "exception")


def test_a_deadline_the_handler_moves_without_a_timeout_is_no_504(settler: Settler) -> None:
    """No ``timeout`` configured: the guard answers no 504 (its problem would say the
    request did not finish "within None s"), even when the handler sets
    ``attempt.deadline`` itself and lets ``attempt.check()``'s ``TimeoutError`` out: the
    server's 500, the attempt provisional (``exception``)."""
    seen: list[str] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        attempt = current_attempt(environ)
        seen.append(attempt.operation_id)
        attempt.deadline = 0.0  # the handler's own budget, long gone
        attempt.check()
        raise AssertionError("check() let a passed deadline through")

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal, lease=LEASE)
    with serve_wsgi(guarded) as base, httpx.Client(base_url=base, timeout=30) as client:
        answer = client.post("/charge", content=b"x", headers=KEY)
    assert answer.status_code == 500
    assert "handler-timeout" not in answer.text
    record = settler.get(seen[0])
    assert record is not None
    assert (record.state, record.reason) == (State.PROVISIONAL, "exception")


class _SlowHandler(logging.Handler):
    """A log shipper that writes synchronously (a remote collector, a mail to the admins):
    the framework reports the view's exception through it before it answers its 500."""

    def emit(self, record: logging.LogRecord) -> None:
        del record
        time.sleep(0.4)


@pytest.mark.parametrize("framework", ["flask", "django"])
def test_an_error_raised_in_time_and_reported_slowly_is_no_timeout(
    settler: Settler, framework: str
) -> None:
    """The view raised well within its ``timeout``; the framework then took its time to log
    the exception (a synchronous log handler) before it answered its 500. That 500 is the
    handler's exception, settled as ``exception``: the deadline is asked of the moment the
    framework caught the error (``got_request_exception``), not of when its 500 came back."""
    seen: list[str] = []
    slow = _SlowHandler()
    if framework == "flask":
        app = guarded_flask(settler, timeout=0.2)

        @app.post("/charge")
        def charge() -> Any:
            seen.append(g.settle.operation_id)
            raise PaymentDeclined("a bug")

        logger = app.logger
        logger.addHandler(slow)
        try:
            with serve_wsgi(app) as base, httpx.Client(base_url=base, timeout=30) as client:
                answer = client.post("/charge", content=b"x", headers=KEY)
        finally:
            logger.removeHandler(slow)
        status = answer.status_code
    else:

        def create(request: HttpRequest) -> JsonResponse:
            seen.append(request.settle.operation_id)  # type: ignore[attr-defined]
            raise PaymentDeclined("a bug")

        options = {"settler": settler, "principal": django_views.principal, "timeout": 0.2}
        logger = logging.getLogger("django.request")
        logger.addHandler(slow)
        try:
            with override_settings(
                ROOT_URLCONF=django_views.urlconf(path("c", create)),
                MIDDLEWARE=["settle.django.IdempotencyMiddleware"],
                SETTLE=options,
            ):
                client = Client(raise_request_exception=False)
                headers = django_views.headers("k-slow-report")
                status = client.post("/c", b"{}", "application/json", **headers).status_code
        finally:
            logger.removeHandler(slow)
    assert status == 500
    record = settler.get(seen[0])
    assert record is not None
    assert (record.state, record.reason) == (State.PROVISIONAL, "exception")


@pytest.mark.parametrize("lost", [True, False], ids=["lease-lost", "lease-held"])
@pytest.mark.parametrize("exit_", [SystemExit, KeyboardInterrupt])
def test_an_exit_past_the_timeout_goes_on(
    settler: Settler, exit_: type[BaseException], lost: bool
) -> None:
    """A worker told to exit (``SystemExit``, ``KeyboardInterrupt``) while a handler runs
    whose deadline passed (and whose lease was lost, or not): the exit goes on to the
    server, never swallowed into a 409 or a 504; a stale attempt settles nothing and is
    logged superseded, one still owning its key is provisional (``exception``)."""
    seen: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        attempt = current_attempt(environ)
        seen["operation"] = attempt.operation_id
        if lost:
            seen["newer"] = lose(settler, attempt)
        else:
            time.sleep(TIMEOUT * 2)
        raise exit_

    guarded = IdempotencyMiddleware(
        app, settler=settler, principal=principal, lease=LEASE, timeout=TIMEOUT
    )
    environ = EnvironBuilder(method="POST", path="/charge", data=b"x", headers=KEY).get_environ()
    with capture_logs() as logs, pytest.raises(exit_):
        guarded(environ, lambda *a, **k: None)
    abandoned = [e["reason"] for e in logs if e["event"] == "settle.http.abandoned"]
    if lost:
        untouched(settler, seen["operation"], seen["newer"])
        assert abandoned == ["lease_lost"]
        return
    record = settler.get(seen["operation"])
    assert record is not None
    assert (record.state, record.reason) == (State.PROVISIONAL, "exception")
    assert abandoned == []
