"""A guarded response over ``max_response_bytes`` under WSGI (plain, Flask, Django): held
no further than the limit, sent on as the app yields it and completed "not stored", as
under ASGI. It was collected whole before: its parts and then their join, about twice its
size at the peak, per request."""

from __future__ import annotations

import contextlib
import io
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.http import HttpRequest, StreamingHttpResponse
from django.test import override_settings
from django.urls import path
from flask import Flask
from flask import Response as FlaskResponse
from structlog.testing import capture_logs

# Django configured as tests/wsgi/test_django_views.py configures it, whichever of the two
# a worker imports first.
import tests.wsgi.test_django_views  # noqa: F401
from settle import Settler, State
from settle.flask import Idempotency
from settle.http.keys import operation_id
from settle.wsgi import IdempotencyMiddleware, current_attempt
from tests.http.apps import serve_wsgi
from tests.http.test_http_table import (
    LARGE,
    _large_endpoint,
    _supersede,
    key_headers,
    problem_type,
)
from tests.wsgi.test_wsgi_middleware import _take_over

KEY = {"Idempotency-Key": "k-big", "X-Principal": "tenant:acme"}
PART = 64 << 10
BIG = 50 << 20  # 800 parts of 64 KiB
#: What the server process may hold at its peak while it sends BIG: the default
#: max_response_bytes (256 KiB) and a few parts, with room for the server's own buffers.
PEAK = 8 << 20


class Parts:
    """A generator-like WSGI body with a ``close()``: ``count`` parts of ``PART`` bytes,
    made one at a time; it counts what it made and its closes."""

    def __init__(self, count: int, fail_at: int | None = None) -> None:
        self.count = count
        self.fail_at = fail_at
        self.made = 0
        self.closes = 0
        self.lock = threading.Lock()

    def __iter__(self) -> Iterator[bytes]:
        while self.made < self.count:
            if self.made == self.fail_at:
                raise RuntimeError("the export's source failed")
            self.made += 1
            yield b"x" * PART

    def close(self) -> None:
        with self.lock:
            self.closes += 1


def principal(environ: dict[str, Any]) -> str | None:
    return environ.get("HTTP_X_PRINCIPAL")


def _record(settler: Settler) -> Any:
    return settler.get(operation_id("http", "k-big", "tenant:acme", "principal"))


def _download(base: str) -> tuple[int, int, bytes]:
    """POST with the key and read the answer a part at a time: its status, its size, and
    its first bytes (never held whole by the client either)."""
    size, head = 0, b""
    with (
        httpx.Client(base_url=base, timeout=120) as client,
        client.stream("POST", "/export", content=b"x", headers=KEY) as answer,
    ):
        for chunk in answer.iter_raw(PART):
            size += len(chunk)
            if len(head) < 64:
                head += chunk[:64]
        return answer.status_code, size, head


def _measured(app: Any) -> tuple[tuple[int, int, bytes], int, httpx.Response]:
    """The first download under tracemalloc (the server runs in this process), its peak,
    and the retry's answer."""
    with serve_wsgi(app) as base:
        tracemalloc.start()
        try:
            first = _download(base)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        with httpx.Client(base_url=base, timeout=30) as client:
            again = client.post("/export", content=b"x", headers=KEY)
    return first, peak, again


def _plain(body: Parts) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> Parts:
        start_response("200 OK", [("Content-Type", "text/csv")])
        return body

    return app


def _flask(body: Parts, settler: Settler) -> Any:
    app = Flask(__name__)

    @app.post("/export")
    def export() -> FlaskResponse:
        return FlaskResponse(body, mimetype="text/csv")

    Idempotency(app, settler=settler, principal=lambda request: request.headers["X-Principal"])
    return app


@pytest.mark.parametrize("shell", ["wsgi", "flask", "django"])
def test_a_50_mb_response_streams_through_a_real_server_within_the_cap(
    settler: Settler, shell: str
) -> None:
    """A 50 MB export, made a part at a time, through wsgiref: the server process holds
    no more than the limit and a few parts of it at its peak (it held the whole response
    twice over), the client gets all of it, the body is closed once, and the operation
    is completed "not stored" (the retry gets 410, the handler never runs again)."""
    body = Parts(BIG // PART)
    with capture_logs() as logs:
        if shell == "wsgi":
            app = IdempotencyMiddleware(_plain(body), settler=settler, principal=principal)
            first, peak, again = _measured(app)
        elif shell == "flask":
            first, peak, again = _measured(_flask(body, settler))
        else:
            options = {"settler": settler, "principal": _django_principal}
            mw = ["settle.django.IdempotencyMiddleware"]
            conf = _django_urls(body)
            hosts = ["127.0.0.1", "testserver"]
            with override_settings(
                ROOT_URLCONF=conf, MIDDLEWARE=mw, SETTLE=options, ALLOWED_HOSTS=hosts
            ):
                first, peak, again = _measured(WSGIHandler())
    status, size, head = first
    assert status == 200
    assert size == BIG
    assert head.startswith(b"xxxx")
    assert peak < PEAK, f"the server held {peak} bytes at its peak"
    assert body.closes == 1
    assert again.status_code == 410
    assert again.json()["type"] == "urn:settle:problem:response-not-stored"
    assert body.made == BIG // PART  # never run again
    events = [e for e in logs if e["event"].startswith("settle.http.")]
    assert any(e["event"] == "settle.http.response_not_stored" and e["size"] == BIG for e in events)
    assert any(e["event"] == "settle.http.completed" and e["stored"] is False for e in events)
    record = _record(settler)
    assert record is not None
    assert record.state is State.COMPLETED


def _django_principal(request: HttpRequest) -> str | None:
    return request.META.get("HTTP_X_PRINCIPAL")


def _django_urls(body: Parts) -> str:
    def export(request: HttpRequest) -> StreamingHttpResponse:
        return StreamingHttpResponse(body, content_type="text/csv")

    name = f"settle_stream_urls_{id(body)}"
    module = type(sys)(name)
    module.urlpatterns = [path("export", export)]  # type: ignore[attr-defined]
    sys.modules[name] = module
    return name


def _environ() -> dict[str, Any]:
    return {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/export",
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "CONTENT_LENGTH": "1",
        "CONTENT_TYPE": "text/plain",
        "HTTP_IDEMPOTENCY_KEY": "k-big",
        "HTTP_X_PRINCIPAL": "tenant:acme",
        "wsgi.input": io.BytesIO(b"x"),
        "wsgi.errors": io.StringIO(),
    }


def _started(statuses: list[str]) -> Any:
    def start_response(status: str, headers: Any, exc_info: Any = None) -> Any:
        statuses.append(status)
        return lambda data: None

    return start_response


def test_the_first_parts_go_out_before_the_app_is_done_and_a_client_gone_is_provisional(
    settler: Settler,
) -> None:
    """The server gets the first part while the app has made only a few past the limit
    (it had made them all); the server stops iterating (its client went away): the app's
    close() is called once and the attempt is provisional (``client_disconnect``), as under
    ASGI, so the retry runs the handler again."""
    body = Parts(64)  # 4 MiB; the limit is 256 KiB
    app = IdempotencyMiddleware(_plain(body), settler=settler, principal=principal)
    statuses: list[str] = []
    with capture_logs() as logs:
        sent = app(_environ(), _started(statuses))
        parts = iter(sent)
        next(parts)
        assert statuses == ["200 OK"]
        assert body.made < 8, body.made
        next(parts)
        sent.close()  # type: ignore[attr-defined]
        sent.close()  # type: ignore[attr-defined]
    assert body.closes == 1
    record = _record(settler)
    assert record is not None
    assert record.state is State.PROVISIONAL
    assert any(
        e["event"] == "settle.http.abandoned" and e["reason"] == "client_disconnect" for e in logs
    )


def test_a_source_that_fails_while_it_streams_breaks_the_response_off(settler: Settler) -> None:
    """The body's source fails past the limit, after its first parts went out: the error
    goes on to the server (which breaks the response off, so that the client sees it cut),
    the body is closed once and the attempt is provisional (``exception``)."""
    body = Parts(64, fail_at=10)
    app = IdempotencyMiddleware(_plain(body), settler=settler, principal=principal)
    got: list[bytes] = []

    def send() -> None:
        sent = app(_environ(), _started([]))
        try:
            got.extend(sent)
        finally:
            sent.close()  # type: ignore[attr-defined]  # as the server does

    with pytest.raises(RuntimeError, match="source failed"):
        send()
    assert 0 < len(got) < 10
    assert body.closes == 1
    record = _record(settler)
    assert record is not None
    assert record.state is State.PROVISIONAL


def test_a_large_response_of_a_superseded_attempt_is_replaced_before_its_first_byte(
    settler: Settler,
) -> None:
    """A newer attempt owns the key by the time the response passes the limit: the renewal
    asked before its first byte finds it, none of it goes out, the client gets the 409 (the
    newer attempt has not finished), the body is read to its end and closed once."""
    body = Parts(16)

    def app(environ: dict[str, Any], start_response: Any) -> Parts:
        _take_over(settler, current_attempt(environ).operation_id)
        start_response("200 OK", [("Content-Type", "text/csv")])
        return body

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal)
    with serve_wsgi(guarded) as base, httpx.Client(base_url=base, timeout=30) as client:
        answer = client.post("/export", content=b"x", headers=KEY)
    assert answer.status_code == 409
    assert answer.json()["type"] == "urn:settle:problem:attempt-superseded"
    assert body.closes == 1


def test_a_takeover_while_a_large_response_streams_is_quarantined(
    redis_url: str, namespace: str, settler: Settler
) -> None:
    """A newer attempt takes the key over after the renewal let the response go on and its
    first bytes went out: its client gets the stale response whole (nothing else can be
    said once a status is out), as under ASGI; the record is not touched (the stale
    settlement is quarantined) and the retry gets the newer attempt's 409. (The response
    was collected whole before, and its client got the 409.)"""
    sizes = LARGE["crossed-by-the-first"]

    def supersede(operation: str) -> None:
        _supersede(settler, operation, complete=False)

    with contextlib.ExitStack() as stack:
        client = _large_endpoint(stack, "wsgi", redis_url, namespace, sizes, supersede, 3)
        with capture_logs() as logs:
            response = client.post("/charge", content=b"{}", headers=key_headers("k-late"))
        retried = client.post("/charge", content=b"{}", headers=key_headers("k-late"))
    assert (response.status_code, response.content) == (201, b"s" * sum(sizes))
    op = operation_id("http", "k-late", "tenant:acme", "principal")
    assert [e.kind.value for e in settler.quarantine.list(operation_id=op)] == ["stale_generation"]
    assert problem_type(retried) == "request-in-progress"  # the newer attempt's
    assert "settle.http.superseded" in [e["event"] for e in logs]


def test_a_large_response_that_streams_past_the_deadline_is_completed(
    settler: Settler,
) -> None:
    """The deadline passes while a large response streams: a WSGI thread cannot be
    stopped, and a finished response given late is completed, as a late stored one is
    (docs/http-endpoints.md, "What differs under WSGI"): its client gets it whole and the
    retry gets 410."""

    def app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "text/csv")])
        for i in range(8):
            if i == 6:
                time.sleep(0.6)  # past timeout=0.3
            yield b"x" * PART

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal, timeout=0.3)
    with serve_wsgi(guarded) as base, httpx.Client(base_url=base, timeout=30) as client:
        first = client.post("/export", content=b"x", headers=KEY)
        again = client.post("/export", content=b"x", headers=KEY)
    assert (first.status_code, len(first.content)) == (200, 8 * PART)
    assert again.status_code == 410


def _writing(count: int) -> Any:
    """A WSGI app that sends its response both ways PEP 3333 allows: each step passes a
    part to ``start_response``'s ``write()`` and then yields one."""

    def app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        write = start_response("200 OK", [("Content-Type", "text/csv")])
        for i in range(count):
            write(b"w%03d" % i + b"w" * (PART - 4))
            yield b"y%03d" % i + b"y" * (PART - 4)

    return app


def _expected(count: int) -> bytes:
    return b"".join(
        b"w%03d" % i + b"w" * (PART - 4) + b"y%03d" % i + b"y" * (PART - 4) for i in range(count)
    )


def test_what_the_app_passes_to_write_while_it_streams_goes_out_in_order(
    settler: Settler,
) -> None:
    """An app that calls ``write()`` and also returns an iterable (PEP 3333 allows both):
    what it writes after the response passed the limit goes out, in the order it was
    written, and counts in the size the "not stored" marker reports. (It was dropped: the
    client got a response with holes in it, and nothing said so.)"""
    count = 16  # 2 MiB; the limit is 256 KiB
    app = IdempotencyMiddleware(_writing(count), settler=settler, principal=principal)
    with capture_logs() as logs:
        sent = app(_environ(), _started([]))
        try:
            got = b"".join(sent)
        finally:
            sent.close()  # type: ignore[attr-defined]
    assert got == _expected(count)
    record = _record(settler)
    assert record is not None
    assert record.state is State.COMPLETED
    sizes = [e["size"] for e in logs if e["event"] == "settle.http.response_not_stored"]
    assert sizes == [2 * count * PART]


def test_what_the_app_writes_reaches_a_real_client_whole(settler: Settler) -> None:
    """The same through wsgiref: the client gets every byte written and yielded, in order,
    and the retry gets 410."""
    count = 16
    app = IdempotencyMiddleware(_writing(count), settler=settler, principal=principal)
    with serve_wsgi(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        first = client.post("/export", content=b"x", headers=KEY)
        again = client.post("/export", content=b"x", headers=KEY)
    assert first.status_code == 200
    assert first.content == _expected(count)
    assert again.status_code == 410
