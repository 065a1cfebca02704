"""What a handler's own error becomes when settle answers in its place, and the 504's other
edges, under ASGI (a real uvicorn) and WSGI (the stdlib's threading server, Flask, Django),
over real sockets and a real Redis:

* an error raised past the ``timeout`` or after a lost lease is answered 504 / 409, never
  raised to the server: ``settle.http.abandoned`` names its type (``error``; never its
  message, which may quote a payload), and its traceback reaches the server's error log
  (WSGI: ``wsgi.errors``; ASGI: the event loop's exception handler, the ``asyncio`` log);
* a lease lost while the 504 is being settled marks nothing (no stale ``timeout`` mark
  quarantined against the newer attempt's record);
* the 504's detail says nothing of a handler "stopped" (a WSGI handler is not);
* a 5xx whose status was chosen in time and whose body ran on past the deadline is that 5xx
  (its ``Retry-After`` included), under ASGI and WSGI alike.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import structlog
from django.core.handlers.wsgi import WSGIHandler
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.test import Client, override_settings
from django.urls import path
from flask import g
from structlog.testing import LogCapture, capture_logs

import tests.wsgi.test_django_views as django_views  # configures Django's settings first
from settle import AsyncSettler, Settler, State
from settle.asgi import IdempotencyMiddleware as AsgiMiddleware
from settle.attempt import Attempt
from settle.wsgi import IdempotencyMiddleware, current_attempt
from tests.http.apps import serve, serve_wsgi
from tests.http.test_http_abandoned import lose_the_lease_in_a_timeout_of_its_own
from tests.wsgi.test_wsgi_lost_lease import LEASE, guarded_flask, lapse, lose, untouched
from tests.wsgi.test_wsgi_middleware import KEY, principal

TIMEOUT = 0.1
SECRET = "card 4242424242424242"  # what an error's message may quote: never in settle's log


class PaymentDeclined(Exception):
    pass


def _abandoned(logs: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(e["reason"], e.get("error")) for e in logs if e["event"] == "settle.http.abandoned"]


def _quotes_nothing(logs: list[dict[str, Any]]) -> None:
    assert SECRET not in repr(logs)


def _answered_in_its_place(
    settler: Settler, answer: httpx.Response, logs: list[Any], ends: str, seen: dict[str, Any]
) -> None:
    """The bug ``PaymentDeclined`` ended the handler ``ends`` (past its timeout, after its
    lease was lost): its client got the 504 or the 409 in its place, the log names its type
    and quotes nothing of it, and a stale attempt settled nothing."""
    if ends == "past-the-timeout":
        assert answer.status_code == 504, answer.text
        assert _abandoned(logs) == [("timeout", "PaymentDeclined")]
    else:
        assert answer.status_code == 409, answer.text
        assert _abandoned(logs) == [("lease_lost", "PaymentDeclined")]
        untouched(settler, seen["operation"], seen["newer"])
    _quotes_nothing(logs)


def _post(
    settler: Settler, app: Any, timeout: float | None = TIMEOUT, errors: io.StringIO | None = None
) -> httpx.Response:
    """One guarded POST to the plain WSGI ``app`` under a real server (``errors``: its
    ``wsgi.errors``, the server's error log)."""
    guarded = IdempotencyMiddleware(
        app, settler=settler, principal=principal, lease=LEASE, timeout=timeout
    )

    def served(environ: dict[str, Any], start_response: Any) -> Any:
        if errors is not None:
            environ["wsgi.errors"] = errors
        return guarded(environ, start_response)

    with serve_wsgi(served) as base, httpx.Client(base_url=base, timeout=30) as client:
        return client.post("/charge", content=b"x", headers=KEY)


@contextlib.contextmanager
def _on_event(event: str, reason: str, action: Callable[[], None]) -> Iterator[list[Any]]:
    """Capture settle's log, and run ``action`` where ``event`` (of ``reason``) is logged:
    a moment between two steps of the guard, reached in the request's own thread."""
    capture = LogCapture()

    def hook(_logger: Any, _method: str, event_dict: Any) -> Any:
        if event_dict.get("event") == event and event_dict.get("reason") == reason:
            action()
        return event_dict

    old = structlog.get_config()["processors"]
    structlog.configure(processors=[hook, capture])
    try:
        yield capture.entries
    finally:
        structlog.configure(processors=old)


# -- 1. the error's type is logged, its traceback reaches the server's log ------------------


@pytest.mark.parametrize("ends", ["past-the-timeout", "after-a-lost-lease"])
def test_a_plain_wsgi_handlers_error_is_logged_by_type_and_its_traceback_kept(
    settler: Settler, ends: str
) -> None:
    seen: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        attempt = current_attempt(environ)
        seen["operation"] = attempt.operation_id
        if ends == "past-the-timeout":
            time.sleep(TIMEOUT * 2)
        else:
            seen["newer"] = lose(settler, attempt)
        raise PaymentDeclined(SECRET)  # a bug, not a timeout

    errors = io.StringIO()
    with capture_logs() as logs:
        answer = _post(settler, app, TIMEOUT if ends == "past-the-timeout" else None, errors)
    _answered_in_its_place(settler, answer, logs, ends, seen)
    traceback = errors.getvalue()
    assert "Traceback" in traceback
    assert f"PaymentDeclined: {SECRET}" in traceback  # the server's log has the bug whole


@pytest.mark.parametrize("ends", ["timeout", "lost-lease"])
def test_check_stopping_the_handler_is_named_but_no_traceback(settler: Settler, ends: str) -> None:
    """``attempt.check()``'s ``TimeoutError`` or ``StaleAttempt`` is settle's own signal,
    which the 504 or the 409 says: named as ``error``, no traceback in the server's log."""

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        attempt = current_attempt(environ)
        if ends == "timeout":
            time.sleep(TIMEOUT * 2)
        else:
            lose(settler, attempt)
        attempt.check()
        raise AssertionError("check() let the stop through")

    errors = io.StringIO()
    with capture_logs() as logs:
        answer = _post(settler, app, TIMEOUT if ends == "timeout" else None, errors)
    expected = ("timeout", "TimeoutError") if ends == "timeout" else ("lease_lost", "StaleAttempt")
    assert (answer.status_code, _abandoned(logs)) == (504 if ends == "timeout" else 409, [expected])
    assert errors.getvalue() == ""


def test_a_flask_views_error_past_the_timeout_is_logged_by_type(settler: Settler) -> None:
    """Flask caught the error and logged its traceback (its own error log) before it
    answered the 500 that settle replaces with the 504: settle's line names its type."""
    app = guarded_flask(settler, timeout=TIMEOUT)

    @app.post("/charge")
    def charge() -> Any:
        assert g.settle is not None
        time.sleep(TIMEOUT * 2)
        raise PaymentDeclined(SECRET)

    with (
        capture_logs() as logs,
        serve_wsgi(app) as base,
        httpx.Client(base_url=base, timeout=30) as client,
    ):
        answer = client.post("/charge", content=b"x", headers=KEY)
    assert answer.status_code == 504, answer.text
    assert _abandoned(logs) == [("timeout", "PaymentDeclined")]
    _quotes_nothing(logs)


def test_a_django_views_error_past_the_timeout_is_logged_by_type(settler: Settler) -> None:
    def create(request: HttpRequest) -> JsonResponse:
        time.sleep(TIMEOUT * 2)
        raise PaymentDeclined(SECRET)

    options = {"settler": settler, "principal": django_views.principal, "timeout": TIMEOUT}
    with (
        capture_logs() as logs,
        override_settings(
            ROOT_URLCONF=django_views.urlconf(path("c", create)),
            MIDDLEWARE=["settle.django.IdempotencyMiddleware"],
            SETTLE=options,
        ),
    ):
        client = Client(raise_request_exception=False)
        answer = client.post("/c", b"{}", "application/json", **django_views.headers("k-late"))
    assert answer.status_code == 504
    assert _abandoned(logs) == [("timeout", "PaymentDeclined")]
    _quotes_nothing(logs)


def test_an_asgi_handlers_error_past_the_timeout_is_logged_by_type_and_its_traceback_kept(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The handler held the loop past its deadline, so that the timer could not fire, then
    raised: the 504 as under WSGI, and the bug's traceback on the ``asyncio`` log."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        time.sleep(TIMEOUT * 3)  # noqa: ASYNC251  # holds the loop
        raise PaymentDeclined(SECRET)

    settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
    guarded = AsgiMiddleware(
        app, settler=settler, principal=lambda scope: "tenant:acme", timeout=TIMEOUT
    )
    with (
        caplog.at_level(logging.ERROR, logger="asyncio"),
        capture_logs() as logs,
        serve(guarded, settler) as base,
        httpx.Client(base_url=base, timeout=30) as client,
    ):
        answer = client.post("/charge", content=b"x", headers=KEY)
    assert answer.status_code == 504, answer.text
    assert _abandoned(logs) == [("timeout", "PaymentDeclined")]
    _quotes_nothing(logs)
    reported = [r for r in caplog.records if r.name == "asyncio" and r.exc_info]
    assert len(reported) == 1
    assert isinstance(reported[0].exc_info[1], PaymentDeclined)  # type: ignore[index]


# -- 2. a lease lost while the 504 is settled ---------------------------------------------------


def test_a_lease_lost_as_the_504_is_settled_marks_nothing(settler: Settler) -> None:
    """Past the deadline the handler raised; as the guard answers its 504 (the moment it
    logs ``settle.http.abandoned``), its lease lapses, a retry takes the key over and the
    heartbeat tells this one. Its ``timeout`` mark would be quarantined against the newer attempt's
    record: nothing is settled, the record is the newer attempt's as it left it."""
    seen: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        attempt = current_attempt(environ)
        seen["operation"], seen["attempt"] = attempt.operation_id, attempt
        time.sleep(TIMEOUT * 2)
        raise PaymentDeclined("the charge failed")

    def take_over() -> None:
        attempt: Attempt = seen["attempt"]
        seen["newer"] = lapse(settler, attempt)

    with _on_event("settle.http.abandoned", "timeout", take_over):
        answer = _post(settler, app)
    assert answer.status_code == 504, answer.text
    untouched(settler, seen["operation"], seen["newer"])


# -- 3. the 504 says what is true on every server --------------------------------------------


def test_the_504_says_nothing_of_a_stopped_handler(settler: Settler) -> None:
    """Under WSGI the handler is not stopped at its timeout: the 504 must not say it was."""

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        current_attempt(environ)
        time.sleep(TIMEOUT * 2)
        raise PaymentDeclined("the charge failed")

    answer = _post(settler, app)
    assert answer.status_code == 504, answer.text
    detail = answer.json()["detail"]
    assert "stopped" not in detail
    assert f"did not finish within {TIMEOUT} s" in detail


# -- 4. a 5xx chosen in time, its body past the deadline ---------------------------------------


def _the_503_stands(answer: httpx.Response, record: Any) -> None:
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"] == "7"
    assert answer.text == "the provider is down: try again later"
    assert record is not None
    assert (record.state, record.reason) == (State.PROVISIONAL, "status_503")


def test_a_wsgi_503_chosen_in_time_whose_body_runs_late_is_that_503(settler: Settler) -> None:
    seen: list[str] = []

    def app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        seen.append(current_attempt(environ).operation_id)
        start_response(
            "503 Service Unavailable", [("Content-Type", "text/plain"), ("Retry-After", "7")]
        )

        def body() -> Iterator[bytes]:
            yield b"the provider is down"
            time.sleep(TIMEOUT * 2)  # the rest of the body comes past the deadline
            yield b": try again later"

        return body()

    answer = _post(settler, app)
    _the_503_stands(answer, settler.get(seen[0]))


def test_an_asgi_503_chosen_in_time_whose_body_runs_late_is_that_503(
    redis_url: str, namespace: str, settler: Settler
) -> None:
    """The same under ASGI, whose handler holds the loop while it makes the rest of its
    body (its timer cannot fire): its start went out in time, and so does the rest."""
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        seen.append(scope["settle"].operation_id)
        headers = [(b"content-type", b"text/plain"), (b"retry-after", b"7")]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        body = {"type": "http.response.body", "body": b"the provider is down", "more_body": True}
        await send(body)
        time.sleep(TIMEOUT * 2)  # noqa: ASYNC251  # holds the loop
        await send({"type": "http.response.body", "body": b": try again later"})

    async_settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
    guarded = AsgiMiddleware(
        app, settler=async_settler, principal=lambda scope: "tenant:acme", timeout=TIMEOUT
    )
    with serve(guarded, async_settler) as base, httpx.Client(base_url=base, timeout=30) as client:
        answer = client.post("/charge", content=b"x", headers=KEY)
    _the_503_stands(answer, settler.get(seen[0]))


def test_a_wsgi_503_chosen_past_the_deadline_is_still_the_504(settler: Settler) -> None:
    """The neighbour: a 5xx chosen past the deadline is the timeout it is."""

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        current_attempt(environ)
        time.sleep(TIMEOUT * 2)
        start_response("503 Service Unavailable", [("Retry-After", "7")])
        return [b"down"]

    answer = _post(settler, app)
    assert answer.status_code == 504, answer.text


# -- the review's neighbours -------------------------------------------------------------------


def _asgi_post(redis_url: str, namespace: str, app: Any) -> httpx.Response:
    settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
    guarded = AsgiMiddleware(
        app, settler=settler, principal=lambda scope: "tenant:acme", timeout=TIMEOUT
    )
    with serve(guarded, settler) as base, httpx.Client(base_url=base, timeout=30) as client:
        return client.post("/charge", content=b"x", headers=KEY)


def _asyncio_reports(caplog: pytest.LogCaptureFixture) -> list[BaseException]:
    return [
        r.exc_info[1]
        for r in caplog.records
        if r.name == "asyncio" and r.exc_info and r.exc_info[1] is not None
    ]


def test_an_asgi_errors_traceback_names_the_operation_by_its_digest(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The error handed to the loop's exception handler quotes the operation id (as
    ``attempt.check()``'s errors, and what a handler builds from them, do): the ``asyncio``
    log names the operation by its digest, as the error raised to the server would."""
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        seen.append(scope["settle"].operation_id)
        time.sleep(TIMEOUT * 3)  # noqa: ASYNC251  # holds the loop
        raise PaymentDeclined(f"the charge of {scope['settle'].operation_id} was declined")

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        answer = _asgi_post(redis_url, namespace, app)
    assert answer.status_code == 504, answer.text
    [reported] = _asyncio_reports(caplog)
    assert isinstance(reported, PaymentDeclined)
    assert seen[0] not in str(reported)
    assert "operation_digest=" in str(reported)


def test_a_wsgi_errors_traceback_names_the_operation_by_its_digest(settler: Settler) -> None:
    seen: list[str] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        operation = current_attempt(environ).operation_id
        seen.append(operation)
        time.sleep(TIMEOUT * 2)
        raise PaymentDeclined(f"the charge of {operation} was declined")

    errors = io.StringIO()
    answer = _post(settler, app, errors=errors)
    assert answer.status_code == 504, answer.text
    written = errors.getvalue()
    assert "PaymentDeclined" in written
    assert seen[0] not in written
    assert "operation_digest=" in written


def test_an_asgi_check_past_the_timeout_writes_no_traceback(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The loop held past the deadline, then ``attempt.check()``: its ``TimeoutError`` is
    settle's own signal, which the 504 says: named as ``error``, nothing on the ``asyncio``
    log (as under WSGI: nothing in ``wsgi.errors``)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        time.sleep(TIMEOUT * 3)  # noqa: ASYNC251  # holds the loop
        scope["settle"].check()
        raise AssertionError("check() let the stop through")

    with caplog.at_level(logging.ERROR, logger="asyncio"), capture_logs() as logs:
        answer = _asgi_post(redis_url, namespace, app)
    assert answer.status_code == 504, answer.text
    assert _abandoned(logs) == [("timeout", "TimeoutError")]
    assert _asyncio_reports(caplog) == []


def test_a_django_streamed_503_chosen_in_time_whose_body_runs_late_is_that_503(
    settler: Settler,
) -> None:
    """Django's neighbour of the WSGI case: the view's ``StreamingHttpResponse`` came back in
    time (its status chosen), its generator runs on past the deadline: that 503 stands."""
    seen: list[str] = []

    def create(request: HttpRequest) -> StreamingHttpResponse:
        seen.append(request.settle.operation_id)  # type: ignore[attr-defined]

        def body() -> Iterator[bytes]:
            yield b"the provider is down"
            time.sleep(TIMEOUT * 2)
            yield b": try again later"

        response = StreamingHttpResponse(body(), status=503, content_type="text/plain")
        response["Retry-After"] = "7"
        return response

    options = {"settler": settler, "principal": django_views.principal, "timeout": TIMEOUT}
    with override_settings(
        ROOT_URLCONF=django_views.urlconf(path("c", create)),
        MIDDLEWARE=["settle.django.IdempotencyMiddleware"],
        SETTLE=options,
    ):
        client = Client(raise_request_exception=False)
        answer = client.post("/c", b"{}", "application/json", **django_views.headers("k-503"))
    assert answer.status_code == 503
    assert answer["Retry-After"] == "7"
    assert b"".join(answer.streaming_content) == b"the provider is down: try again later"  # type: ignore[attr-defined]
    record = settler.get(seen[0])
    assert record is not None
    assert (record.state, record.reason) == (State.PROVISIONAL, "status_503")


@pytest.mark.asyncio
async def test_an_asgi_error_raised_after_a_lease_lost_while_its_stop_was_put_off(
    async_settler: AsyncSettler, caplog: pytest.LogCaptureFixture
) -> None:
    """The lease lost while the handler's own ``asyncio.timeout`` was cancelling it (the
    stop put off), then the handler raises a bug: 409, ``error`` names its type, and its
    traceback goes to the ``asyncio`` log, as under WSGI (``wsgi.errors``)."""
    with caplog.at_level(logging.ERROR, logger="asyncio"), capture_logs() as logs:
        first, _, _ = await lose_the_lease_in_a_timeout_of_its_own(async_settler, "raises")
    assert first.status == 409
    assert _abandoned(logs) == [("lease_lost", "RuntimeError")]
    [reported] = _asyncio_reports(caplog)
    assert isinstance(reported, RuntimeError)


@pytest.mark.parametrize("ends", ["past-the-timeout", "after-a-lost-lease"])
def test_a_django_streamed_bodys_error_reaches_the_servers_log(
    settler: Settler, ends: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Django never sees an error its view's streamed body raises as settle collects it (nor
    one a ``TemplateResponse`` raises as settle renders it): without settle's 504 / 409 it
    would reach Django's handler around settle's middleware, which logs it. Its traceback
    goes to the server's error log (``wsgi.errors``), as under plain WSGI."""
    seen: dict[str, Any] = {}

    def create(request: HttpRequest) -> StreamingHttpResponse:
        attempt = request.settle  # type: ignore[attr-defined]
        seen["operation"] = attempt.operation_id

        def body() -> Iterator[bytes]:
            yield b"the first rows"
            if ends == "past-the-timeout":
                time.sleep(TIMEOUT * 2)
            else:
                seen["newer"] = lose(settler, attempt)
            raise PaymentDeclined(SECRET)

        return StreamingHttpResponse(body(), content_type="text/plain")

    options: dict[str, Any] = {"settler": settler, "principal": django_views.principal}
    if ends == "past-the-timeout":
        options["timeout"] = TIMEOUT
    else:
        options["lease"] = LEASE
    errors = io.StringIO()

    with override_settings(
        ROOT_URLCONF=django_views.urlconf(path("c", create)),
        MIDDLEWARE=["settle.django.IdempotencyMiddleware"],
        SETTLE=options,
    ):
        django = WSGIHandler()

        def served(environ: dict[str, Any], start_response: Any) -> Any:
            environ["wsgi.errors"] = errors
            return django(environ, start_response)

        with (
            caplog.at_level(logging.ERROR),
            capture_logs() as logs,
            serve_wsgi(served) as base,
            httpx.Client(base_url=base, timeout=30) as client,
        ):
            answer = client.post(
                "/c",
                content=b"{}",
                headers={"Idempotency-Key": "k-s", "X-Principal": "tenant:acme"},
            )
    _answered_in_its_place(settler, answer, logs, ends, seen)
    assert f"PaymentDeclined: {SECRET}" in errors.getvalue()


def test_an_asgi_500_a_framework_made_of_a_late_error_then_raised_is_reported(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A framework inside the guard answers the handler's error with its 500 and raises it
    on for the server to log (Starlette's ``ServerErrorMiddleware``, when the guard wraps the
    whole app), the loop held past the deadline: the 504 replaces that 500, and the error
    must not vanish with it: its traceback goes to the ``asyncio`` log, as under WSGI."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        time.sleep(TIMEOUT * 3)  # noqa: ASYNC251  # holds the loop
        try:
            raise PaymentDeclined(SECRET)
        except PaymentDeclined:
            await send({"type": "http.response.start", "status": 500, "headers": []})
            await send({"type": "http.response.body", "body": b"Internal Server Error"})
            raise

    with caplog.at_level(logging.ERROR, logger="asyncio"), capture_logs() as logs:
        answer = _asgi_post(redis_url, namespace, app)
    assert answer.status_code == 504, answer.text
    assert [reason for reason, _ in _abandoned(logs)] == ["timeout"]
    _quotes_nothing(logs)
    [reported] = _asyncio_reports(caplog)
    assert isinstance(reported, PaymentDeclined)


def test_a_wsgi_error_page_chosen_past_the_deadline_is_the_504(settler: Settler) -> None:
    """The status is the one of the last ``start_response``: a 200 chosen in time, then a
    body that fails past the deadline and an error page (``start_response`` again, with
    ``exc_info``, PEP 3333): that 500 was chosen late, and the 504 replaces it."""

    def app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        current_attempt(environ)
        start_response("200 OK", [("Content-Type", "text/plain")])

        def body() -> Iterator[bytes]:
            try:
                time.sleep(TIMEOUT * 2)
                raise PaymentDeclined("the charge failed")
            except PaymentDeclined:
                start_response("500 Internal Server Error", [], sys.exc_info())
                yield b"error page"

        return body()

    answer = _post(settler, app)
    assert answer.status_code == 504, answer.text
