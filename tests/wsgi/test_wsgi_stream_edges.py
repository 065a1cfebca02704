"""The edges of a guarded WSGI response over ``max_response_bytes`` with more to come
(tests/wsgi/test_wsgi_stream.py streams the usual one): a status never stored, a lease
known lost, the deadline, an error page asked for mid-stream, and responses the guarded
handler did not give, each settled as docs/http-endpoints.md ("What differs under WSGI")
says."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.http import HttpRequest, StreamingHttpResponse
from django.test import override_settings
from django.urls import path
from structlog.testing import capture_logs

from settle import Settler, State
from settle.http._sync import SyncGuard
from settle.http.policy import IdempotencyPolicy
from settle.wsgi import IdempotencyMiddleware, current_attempt
from tests.http.test_http_table import _lapse
from tests.wsgi.test_wsgi_middleware import _holder, _take_over
from tests.wsgi.test_wsgi_stream import (
    PART,
    Parts,
    _django_urls,
    _environ,
    _plain,
    _record,
    _started,
    principal,
)

COUNT = 16  # 1 MiB; the limit is 256 KiB


def _lose(settler: Settler, environ: dict[str, Any]) -> None:
    """A newer attempt takes the key over and this attempt learns it (what its heartbeat
    does when it renews)."""
    attempt = current_attempt(environ)
    stale = _holder(settler, attempt.operation_id)
    _take_over(settler, attempt.operation_id)
    attempt.mark_lost(settler.renew(stale, lease=5))


def _abandoned(logs: list[dict[str, Any]]) -> list[str]:
    return [e["reason"] for e in logs if e["event"] == "settle.http.abandoned"]


def _state(settler: Settler) -> tuple[State, str | None]:
    record = _record(settler)
    assert record is not None
    return record.state, record.reason


def _django_environ() -> dict[str, Any]:
    server = {"SERVER_NAME": "testserver", "SERVER_PORT": "80", "wsgi.url_scheme": "http"}
    return {**_environ(), **server}


def _sent(app: Any, statuses: list[str], environ: dict[str, Any] | None = None) -> bytes:
    sent = app(_environ() if environ is None else environ, _started(statuses))
    try:
        return b"".join(sent)
    finally:
        getattr(sent, "close", lambda: None)()


def test_a_large_5xx_of_an_attempt_known_lost_is_replaced_by_the_409(settler: Settler) -> None:
    """A status never stored, over the limit with more to come, the lease known lost
    before its first byte: none of it goes out, its client gets the 409, nothing is
    settled (the newer attempt's record is untouched) and the body is closed once."""
    body = Parts(COUNT)

    def app(environ: dict[str, Any], start_response: Any) -> Parts:
        _lose(settler, environ)
        start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
        return body

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal)
    statuses: list[str] = []
    with capture_logs() as logs:
        got = _sent(guarded, statuses)
    assert statuses == ["409 Conflict"]
    assert b"attempt-superseded" in got
    assert body.closes == 1
    assert _abandoned(logs) == ["lease_lost"]
    assert _state(settler)[0] is State.PENDING  # the newer attempt's, untouched


def test_a_large_5xx_chosen_past_the_deadline_is_replaced_by_the_504(settler: Settler) -> None:
    """A status never stored, over the limit with more to come, chosen past ``timeout``:
    its client gets the 504 ``handler-timeout`` before any of it goes out, and the attempt
    is provisional (``timeout``), as for a small one."""
    body = Parts(COUNT)

    def app(environ: dict[str, Any], start_response: Any) -> Parts:
        time.sleep(0.3)
        start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
        return body

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal, timeout=0.1)
    statuses: list[str] = []
    got = _sent(guarded, statuses)
    assert statuses == ["504 Gateway Timeout"]
    assert b"handler-timeout" in got
    assert body.closes == 1
    assert _state(settler) == (State.PROVISIONAL, "timeout")


def test_a_large_5xx_streams_and_leaves_the_attempt_provisional(settler: Settler) -> None:
    """A status never stored, over the limit, its lease held and within its deadline: it
    streams as sent and the attempt is provisional (``status_503``), so a retry runs the
    handler again."""
    body = Parts(COUNT)

    def app(environ: dict[str, Any], start_response: Any) -> Parts:
        start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
        return body

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal)
    statuses: list[str] = []
    got = _sent(guarded, statuses)
    assert statuses == ["503 Service Unavailable"]
    assert len(got) == COUNT * PART
    assert _state(settler) == (State.PROVISIONAL, "status_503")


def test_a_large_5xx_whose_lease_is_lost_while_it_streams_settles_nothing(
    settler: Settler,
) -> None:
    """The lease is found lost while a large 5xx streams: it goes on as sent, nothing is
    settled (the newer attempt's record is untouched), and ``abandoned`` says
    ``lease_lost``."""

    def app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
        for i in range(COUNT):
            if i == COUNT - 4:
                _lose(settler, environ)
            yield b"x" * PART

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal)
    with capture_logs() as logs:
        got = _sent(guarded, [])
    assert len(got) == COUNT * PART
    assert _abandoned(logs) == ["lease_lost"]
    assert _state(settler)[0] is State.PENDING


def test_a_client_gone_once_the_lease_is_known_lost_settles_nothing(settler: Settler) -> None:
    """The server stops iterating (its client went away) after the lease was found lost:
    nothing is settled and ``abandoned`` says ``lease_lost``, not ``client_disconnect``."""

    def app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "text/csv")])
        for i in range(COUNT):
            if i == 8:
                _lose(settler, environ)
            yield b"x" * PART

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal)
    with capture_logs() as logs:
        sent = guarded(_environ(), _started([]))
        parts = iter(sent)
        for _ in range(10):
            next(parts)
        sent.close()  # type: ignore[attr-defined]
    assert _abandoned(logs) == ["lease_lost"]
    assert _state(settler)[0] is State.PENDING


def test_a_source_that_fails_past_the_deadline_while_it_streams_is_a_timeout(
    settler: Settler,
) -> None:
    """The body's source fails while it streams, past ``timeout``: the error goes on to
    the server and the attempt is provisional as ``timeout``, not ``exception``."""

    def app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "text/csv")])
        for i in range(COUNT):
            if i == 8:
                time.sleep(0.3)
                raise RuntimeError("the export's source failed")
            yield b"x" * PART

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal, timeout=0.1)
    with pytest.raises(RuntimeError, match="source failed"):
        _sent(guarded, [])
    assert _state(settler) == (State.PROVISIONAL, "timeout")


def test_an_error_page_asked_for_while_it_streams_breaks_the_response_off(
    settler: Settler,
) -> None:
    """The app calls ``start_response`` with ``exc_info`` once part of its response went
    out: PEP 3333 has the error raised on (the server breaks the response off), never the
    error page's bytes sent in the middle of the response."""

    def app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "text/csv")])
        for i in range(COUNT):
            if i == 8:
                try:
                    raise ValueError("a row failed")
                except ValueError:
                    write = start_response("500 Error", [], sys.exc_info())
                    write(b"ERROR PAGE")
                    yield b"ERROR PAGE"
                    return
            yield b"x" * PART

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal)
    got: list[bytes] = []
    sent = guarded(_environ(), _started([]))
    with pytest.raises(ValueError, match="a row failed"):
        got.extend(sent)
    sent.close()  # type: ignore[attr-defined]
    assert b"ERROR" not in b"".join(got)
    assert _state(settler) == (State.PROVISIONAL, "exception")


def _framework(settler: Settler, app: Any, **hooks: Any) -> IdempotencyMiddleware:
    policy = IdempotencyPolicy.configure(principal=principal)
    return IdempotencyMiddleware.from_guard(app, SyncGuard(settler, policy), **hooks)


def test_a_large_response_given_without_the_handler_is_not_streamed_as_its_own(
    settler: Settler,
) -> None:
    """A framework's hook or router answered with a large response (``reached`` says the
    handler did not run): it is sent whole and never stored, the attempt provisional
    (``handler_not_reached``), so the retry runs the handler; never completed "not
    stored" (which would answer every retry 410 for a handler that never ran)."""
    body = Parts(COUNT)
    guarded = _framework(settler, _plain(body), reached=lambda environ: False)
    got = _sent(guarded, [])
    assert len(got) == COUNT * PART
    assert _state(settler) == (State.PROVISIONAL, "handler_not_reached")


def test_a_frameworks_large_500_for_the_handlers_error_is_settled_as_that_error(
    settler: Settler,
) -> None:
    """The framework answered the handler's exception with a large 500 (``raised``): it
    is settled as that exception (``exception``), as a small one is, not as a streamed
    ``status_500``."""
    body = Parts(COUNT)

    def app(environ: dict[str, Any], start_response: Any) -> Parts:
        start_response("500 Internal Server Error", [("Content-Type", "text/html")])
        return body

    guarded = _framework(settler, app, raised=lambda environ: (time.monotonic(), None))
    _sent(guarded, [])
    assert _state(settler) == (State.PROVISIONAL, "exception")


class Gate:
    """A Django middleware after settle's that answers before the view (a gate, a
    maintenance page) with a large streamed response."""

    body: Parts

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> StreamingHttpResponse:
        return StreamingHttpResponse(Gate.body, content_type="text/csv")


def test_a_large_django_response_given_before_the_view_is_not_streamed_as_its_own(
    settler: Settler,
) -> None:
    """Under Django, a middleware after settle's answered before the view with a large
    ``StreamingHttpResponse``: sent whole, never stored, the attempt provisional
    (``handler_not_reached``), so the retry runs the view; never completed "not stored"."""
    Gate.body = Parts(COUNT)
    options = {"settler": settler, "principal": lambda r: r.META.get("HTTP_X_PRINCIPAL")}
    mw = ["settle.django.IdempotencyMiddleware", f"{__name__}.Gate"]
    with override_settings(ROOT_URLCONF=_django_urls(Parts(0)), MIDDLEWARE=mw, SETTLE=options):
        got = _sent(WSGIHandler(), [], _django_environ())
    assert len(got) == COUNT * PART
    assert _state(settler) == (State.PROVISIONAL, "handler_not_reached")


def test_a_django_stream_that_crosses_the_limit_with_its_last_part_is_settled_first(
    settler: Settler,
) -> None:
    """A Django ``StreamingHttpResponse`` that crosses the limit with its last part is
    settled before any of it goes out, as plain WSGI and ASGI settle one: no renewal is
    asked first (that renewal is for one with more to come), so a lease that lapsed
    meanwhile logs no ``settle.http.lease_lapsed``; it is completed "not stored"."""
    sizes = [200 << 10, 100 << 10]  # the limit is 256 KiB

    def export(request: HttpRequest) -> StreamingHttpResponse:
        _lapse(settler, request.settle.operation_id)  # type: ignore[attr-defined]
        return StreamingHttpResponse((b"x" * n for n in sizes), content_type="text/csv")

    module = _django_urls(Parts(0))
    sys.modules[module].urlpatterns = [path("export", export)]  # type: ignore[attr-defined]
    options = {"settler": settler, "principal": lambda r: r.META.get("HTTP_X_PRINCIPAL")}
    mw = ["settle.django.IdempotencyMiddleware"]
    statuses: list[str] = []
    with (
        override_settings(ROOT_URLCONF=module, MIDDLEWARE=mw, SETTLE=options),
        capture_logs() as logs,
    ):
        got = _sent(WSGIHandler(), statuses, _django_environ())
    assert (statuses, len(got)) == (["200 OK"], sum(sizes))
    assert "settle.http.lease_lapsed" not in [e["event"] for e in logs]
    assert _state(settler)[0] is State.COMPLETED
