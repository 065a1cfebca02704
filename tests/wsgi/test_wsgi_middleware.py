"""What only the WSGI shell does: collecting and closing the app's iterable, the heartbeat
thread, and the configuration of the Django and Flask integrations."""

from __future__ import annotations

import functools
import io
import json
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from wsgiref.util import setup_testing_defaults

import httpx
import pytest
from flask import Flask
from structlog.testing import capture_logs

from settle import Reservation, Reserved, Settler, State
from settle.asgi import current_attempt as asgi_current_attempt
from settle.embedded import EmbeddedRedis
from settle.errors import ConfigurationError, NotGuarded, SettleError
from settle.flask import Idempotency
from settle.http._sync import configured_guard
from settle.http.keys import operation_id
from settle.testing import MemorySettler
from settle.wsgi import IdempotencyMiddleware, current_attempt
from tests.cluster.split_cluster import SHARDS, split_cluster
from tests.faults.servers import lapse_under
from tests.http.apps import serve_wsgi
from tests.wsgi.servers import Sending, connect, read_answer, reset

KEY = {"Idempotency-Key": "k-1", "X-Principal": "tenant:acme"}


def principal(environ: dict[str, Any]) -> str | None:
    return environ.get("HTTP_X_PRINCIPAL")


class Body:
    """A WSGI body iterable with a ``close()``, as a streaming framework returns."""

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts
        self.closed = threading.Event()
        self.closes = 0

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.parts)

    def close(self) -> None:
        self.closes += 1
        self.closed.set()


class BrokenBody(Body):
    """Its source fails after the first part."""

    def __iter__(self) -> Iterator[bytes]:
        yield self.parts[0]
        raise RuntimeError("the stream's source failed")


def test_the_body_iterable_is_collected_closed_and_replayed(settler: Settler) -> None:
    bodies: list[Body] = []

    def app(environ: dict[str, Any], start_response: Any) -> Body:
        attempt = current_attempt(environ)
        start_response("201 Created", [("Content-Type", "text/plain")])
        body = Body([b"generation ", str(attempt.generation).encode(), b" ", uuid.uuid4().bytes])
        bodies.append(body)
        return body

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal)
    with serve_wsgi(guarded) as base, httpx.Client(base_url=base) as client:
        first = client.post("/charge", content=b"x", headers=KEY)
        again = client.post("/charge", content=b"x", headers=KEY)
    assert first.status_code == 201
    # The handler saw its fencing token (a hybrid-clock generation, see docs/concepts.md).
    assert int(first.content.split(b" ")[1]) > 0
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert len(bodies) == 1
    assert bodies[0].closed.is_set()


def _holder(settler: Settler, operation: str) -> Reservation:
    """The reservation of the attempt that holds ``operation`` now (read from its record)."""
    record = settler.get(operation)
    assert record is not None
    assert record.attempt_id is not None
    return Reservation(
        operation_id=operation,
        fingerprint=record.fingerprint,
        fingerprint_version=record.fingerprint_version,
        binding=record.binding,
        generation=record.generation,
        attempt_id=record.attempt_id,
    )


def _take_over(settler: Settler, operation: str) -> Reserved:
    """What a lapsed lease and a retry do to a running attempt: a newer one owns it (its
    reservation is returned)."""
    lost = _holder(settler, operation)
    settler.mark_provisional(lost, "test: the lease was lost")
    newer = settler.reserve(operation, principal="tenant:acme", fingerprint=lost.fingerprint)
    assert isinstance(newer, Reserved)
    return newer


@pytest.mark.parametrize(
    ("case", "status"),
    [("breaks", 500), ("no-start-response", 500), ("superseded", 409), ("too-large", 201)],
)
def test_the_body_iterable_is_closed_once_whatever_the_middleware_answers(
    settler: Settler, case: str, status: int
) -> None:
    """PEP 3333: the iterable's close() is called however it ends. The middleware collects
    it and closes it itself, before it settles: once, also when its source fails, when the
    app never started a response, when settle answers 409 in its place (the attempt was
    superseded) and when it is too large to store."""
    bodies: list[Body] = []

    def app(environ: dict[str, Any], start_response: Any) -> Body:
        if case == "superseded":
            _take_over(settler, current_attempt(environ).operation_id)
        if case != "no-start-response":
            start_response("201 Created", [("Content-Type", "text/plain")])
        size = 8 << 10 if case == "too-large" else 8
        body = (BrokenBody if case == "breaks" else Body)([b"x" * size, b"y"])
        bodies.append(body)
        return body

    guarded = IdempotencyMiddleware(
        app, settler=settler, principal=principal, max_response_bytes=4 << 10
    )
    with serve_wsgi(guarded) as base, httpx.Client(base_url=base) as client:
        answer = client.post("/charge", content=b"x", headers=KEY)
    assert answer.status_code == status
    [body] = bodies
    assert body.closes == 1


def test_the_heartbeat_keeps_the_lease_of_a_long_handler(settler: Settler) -> None:
    """The handler runs for three leases: a retry meanwhile gets 409, never a takeover."""
    started = threading.Event()
    generations: list[int] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        attempt = current_attempt(environ)
        generations.append(attempt.generation)
        started.set()
        time.sleep(3.0)
        assert not attempt.lost
        start_response("201 Created", [("Content-Type", "application/json")])
        return [json.dumps({"generation": attempt.generation}).encode()]

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal, lease=1.0)
    with serve_wsgi(guarded) as base, httpx.Client(base_url=base, timeout=30) as client:
        results: list[httpx.Response] = []
        first = threading.Thread(
            target=lambda: results.append(client.post("/charge", content=b"x", headers=KEY))
        )
        first.start()
        assert started.wait(10)
        time.sleep(2.0)  # two leases: only the heartbeat keeps the first attempt's
        busy = client.post("/charge", content=b"x", headers=KEY)
        first.join(10)
    assert busy.status_code == 409
    assert busy.headers["retry-after"] == "1"
    assert [r.status_code for r in results] == [201]
    assert len(generations) == 1  # one attempt: the retry never took it over


def test_a_takeover_while_the_handler_runs_marks_its_attempt_lost(settler: Settler) -> None:
    """The heartbeat's renewal that finds a newer attempt holding the key marks the running
    attempt lost (``attempt.lost``, ``attempt.check()`` raises), so a handler that checks
    between its steps stops before its next side effect. Only a record gone or a lease that
    only lapsed lets it run on."""
    seen: list[bool] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        attempt = current_attempt(environ)
        _take_over(settler, attempt.operation_id)
        deadline = time.monotonic() + 5
        while not attempt.lost and time.monotonic() < deadline:
            time.sleep(0.02)  # the next renewal (lease / 3) finds the takeover
        seen.append(attempt.lost)
        start_response("201 Created", [("Content-Type", "text/plain")])
        return [b"charged"]

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal, lease=0.6)
    with serve_wsgi(guarded) as base, httpx.Client(base_url=base, timeout=30) as client:
        answer = client.post("/charge", content=b"x", headers=KEY)
    assert seen == [True]
    assert answer.status_code == 409  # superseded: its response is not the operation's


def test_a_record_gone_whose_log_line_cannot_be_written_ends_no_renewer(
    settler: Settler, redis_client: Any
) -> None:
    """A renewal that finds the record gone (Redis lost it while the handler ran) is logged
    from the renewer thread as ``settle.http.renew_failed``; a log pipeline that raises then
    (an application's processor, a closed stream) ended that thread with a traceback on
    every renewal. The line is dropped, the handler runs on, no thread dies."""
    import structlog  # noqa: PLC0415

    died: list[threading.ExceptHookArgs] = []
    seen: list[str] = []

    def processor(_logger: object, _method: str, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("event") == "settle.http.renew_failed":
            seen.append(event["event"])
            raise ValueError("I/O operation on closed file")
        raise structlog.DropEvent

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        attempt = current_attempt(environ)
        for key in redis_client.scan_iter(match=f"*:op:{attempt.operation_id}"):
            redis_client.delete(key)  # what a restart without persistence does
        time.sleep(1.0)  # five renewals, each finding the record gone
        start_response("201 Created", [("Content-Type", "text/plain")])
        return [b"lost" if attempt.lost else b"ran on"]

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal, lease=0.6)
    hook = threading.excepthook
    threading.excepthook = died.append
    structlog.configure(processors=[processor])
    try:
        with serve_wsgi(guarded) as base, httpx.Client(base_url=base, timeout=30) as client:
            answer = client.post("/charge", content=b"x", headers=KEY)
    finally:
        structlog.reset_defaults()
        threading.excepthook = hook
    assert seen  # the renewals found the record gone and tried to say so
    assert answer.content == b"ran on"
    assert died == []


def test_a_handler_whose_lease_only_lapsed_is_not_told_to_stop(namespace: str) -> None:
    """Found in review: the heartbeat that found a lease lapsed (its renewal held past it by
    a slow Redis) marked the attempt lost though nobody had taken the key over, so a handler
    that calls ``attempt.check()`` between steps stopped half-way (here a 500) and the
    retry ran it again. Its ``complete`` is accepted at its own generation: it now runs on
    and its response is stored."""
    server = EmbeddedRedis().start()
    settler = Settler.from_url(server.url, namespace=namespace, shards=4)
    generations: list[int] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        attempt = current_attempt(environ)
        generations.append(attempt.generation)
        lapse_under(server, attempt, logs)
        attempt.check()  # not lost: nobody took the key over
        start_response("201 Created", [("Content-Type", "text/plain")])
        return [b"charged"]

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal, lease=0.6)
    try:
        with (
            capture_logs() as logs,
            serve_wsgi(guarded) as base,
            httpx.Client(base_url=base, timeout=30) as client,
        ):
            first = client.post("/charge", content=b"x", headers=KEY)
            again = client.post("/charge", content=b"x", headers=KEY)
        record = settler.get(operation_id("http", "k-1", "tenant:acme", "principal"))
    finally:
        settler.close()
        server.close()
    assert (first.status_code, first.content) == (201, b"charged")
    assert (again.content, again.headers["idempotent-replayed"]) == (b"charged", "true")
    assert len(generations) == 1
    assert record is not None
    assert record.state is State.COMPLETED
    events = [e["event"] for e in logs]
    assert "settle.operation.lease_lapsed" in events
    assert "settle.http.superseded" not in events


def test_a_renewal_held_by_a_hung_primary_holds_up_no_other_request() -> None:
    """Found in audit (the decorator's heartbeat, which the guard shares): renewals were
    sent one after another, so one held by a frozen cluster primary let the lease of a
    request on a healthy primary lapse, and its retry ran the handler a second time."""
    scoped = functools.partial(operation_id, "http", principal="tenant:acme", scope="principal")
    with split_cluster(scoped) as split:
        settler = Settler.from_cluster(split.seeds, namespace=split.namespace, shards=SHARDS)
        settler.check()  # the start-up checks read every primary: before one is frozen
        runs: list[str] = []

        def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
            runs.append(environ["HTTP_IDEMPOTENCY_KEY"])
            time.sleep(4.0)
            start_response("201 Created", [("Content-Type", "text/plain")])
            return [b"charged"]

        guarded = IdempotencyMiddleware(app, settler=settler, principal=principal, lease=1.5)

        def post(client: httpx.Client, key: str) -> int:
            headers = {**KEY, "Idempotency-Key": key}
            return client.post("/charge", content=b"x", headers=headers).status_code

        try:
            with (
                serve_wsgi(guarded) as base,
                httpx.Client(base_url=base, timeout=60) as client,
                ThreadPoolExecutor(2) as pool,
            ):
                on_frozen = pool.submit(post, client, split.frozen_op)
                on_healthy = pool.submit(post, client, split.healthy_op)
                # 2.5 s: past the lease (1.5 s), only its renewals keep the request's
                with split.frozen_after(lambda: len(runs) == 2, 2.5):
                    assert post(client, split.healthy_op) == 409
                assert on_healthy.result() == 201
                on_frozen.exception()  # its lease lapsed while frozen: whatever it got
            assert runs.count(split.healthy_op) == 1, runs
        finally:
            settler.close()


def test_a_client_gone_while_its_response_is_sent_is_no_error(settler: Settler) -> None:
    """The client resets the connection before its response is written: the server's
    write fails and it closes the iterable unexhausted. The handler's response was settled
    before sending, so settle logs nothing at error level, nothing after its
    ``settle.http.completed``, and leaves the record completed: the retry replays it (as
    under ASGI, where the response is stored before it is sent, too)."""
    entered, gone = threading.Event(), threading.Event()
    runs: list[int] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        runs.append(current_attempt(environ).generation)
        entered.set()
        assert gone.wait(10)
        start_response("201 Created", [("Content-Type", "application/octet-stream")])
        return [b"x" * (200 << 10)]  # more than a socket buffer: the write must fail

    server = Sending(IdempotencyMiddleware(app, settler=settler, principal=principal))
    request = (
        b"POST /charge HTTP/1.1\r\nHost: t\r\nIdempotency-Key: k-1\r\n"
        b"X-Principal: tenant:acme\r\nContent-Length: 1\r\n\r\nx"
    )
    with capture_logs() as events, serve_wsgi(server) as base:
        sock = connect(base)
        sock.sendall(request)
        assert entered.wait(10)
        reset(sock)
        gone.set()
        assert server.closed.wait(10), "the server never gave the response up"
        assert not server.exhausted  # its write failed: the client never got the response
        logged = list(events)
        record = settler.get(operation_id("http", "k-1", "tenant:acme", "principal"))
        with httpx.Client(base_url=base) as client:
            again = client.post("/charge", content=b"x", headers=KEY)
    assert [e["event"] for e in logged if e["log_level"] not in ("debug", "info")] == []
    assert [e["event"] for e in logged][-1] == "settle.http.completed"
    assert record is not None
    assert record.state is State.COMPLETED
    assert again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert len(again.content) == 200 << 10
    assert len(runs) == 1


def _recording(runs: list[bytes]) -> Any:
    """A WSGI app that records each body it reads and answers 201."""

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        runs.append(environ["wsgi.input"].read())
        start_response("201 Created", [])
        return [b""]

    return app


def test_a_client_that_leaves_mid_body_runs_nothing(settler: Settler) -> None:
    """A body shorter than its Content-Length is never run as if it were the request. The
    client stopped sending (it may still read): it gets a 400 ``request-incomplete``
    problem, and settle logs ``settle.http.disconnected`` at info, as the ASGI middleware
    does. Found in review: the middleware raised ClientDisconnected into the server, which
    logged it as an error with its traceback and answered its own 500."""
    runs: list[bytes] = []
    guarded = IdempotencyMiddleware(_recording(runs), settler=settler, principal=principal)
    with capture_logs() as events, serve_wsgi(guarded) as base:
        with connect(base) as sock:
            sock.sendall(
                b"POST /charge HTTP/1.1\r\nHost: t\r\nIdempotency-Key: k-1\r\n"
                b"X-Principal: tenant:acme\r\nContent-Length: 100\r\n\r\n" + b"x" * 10
            )
            sock.shutdown(socket.SHUT_WR)
            status, body = read_answer(sock)
        logged = list(events)
        with httpx.Client(base_url=base) as client:
            whole = client.post("/charge", content=b"x" * 100, headers=KEY)
    assert status.endswith(b" 400 Bad Request"), status
    assert json.loads(body)["type"] == "urn:settle:problem:request-incomplete"
    assert [(e["event"], e["log_level"]) for e in logged if "http" in e["event"]] == [
        ("settle.http.disconnected", "info")
    ]
    assert whole.status_code == 201
    assert runs == [b"x" * 100]  # the whole request, once; never the 10-byte one


def _post(guarded: Any, length: str, body: bytes = b"x" * 10) -> tuple[str, bytes]:
    """Call the middleware as a WSGI server would with ``CONTENT_LENGTH=length``: the
    status it started and the body it returned."""
    environ: dict[str, Any] = {}
    setup_testing_defaults(environ)
    environ.update(
        REQUEST_METHOD="POST",
        PATH_INFO="/charge",
        CONTENT_LENGTH=length,
        HTTP_IDEMPOTENCY_KEY=f"k-{uuid.uuid4().hex}",
        HTTP_X_PRINCIPAL="tenant:acme",
    )
    environ["wsgi.input"] = io.BytesIO(body)
    started: list[str] = []
    answer = b"".join(guarded(environ, lambda status, headers, *_: started.append(status)))
    return started[0], answer


@pytest.mark.parametrize("length", ["abc", "10, 10", "-5", "1e3"])
def test_a_content_length_that_is_not_a_number_is_a_400_problem(
    settler: Settler, length: str
) -> None:
    """A server that passes a malformed Content-Length through (wsgiref, Werkzeug's dev
    server; gunicorn refuses it itself): the body cannot be delimited, so nothing is read,
    reserved or run, and the client gets a 400 problem rather than the middleware's 500."""
    runs: list[bytes] = []
    guarded = IdempotencyMiddleware(_recording(runs), settler=settler, principal=principal)
    status, body = _post(guarded, length)
    assert status == "400 Bad Request"
    problem = json.loads(body)
    assert problem["type"].endswith("request-malformed")
    assert runs == []
    ns = settler.config.namespace
    assert settler._runner.client.keys(f"settle:{{{ns}:*}}:op:*") == []  # nothing reserved


def test_a_content_length_with_spaces_around_it_is_read(settler: Settler) -> None:
    """RFC 9110 allows whitespace around a field value, and wsgiref passes ``"10 "`` on."""
    runs: list[bytes] = []
    guarded = IdempotencyMiddleware(_recording(runs), settler=settler, principal=principal)
    for length in ("10 ", " 10"):
        assert _post(guarded, length)[0] == "201 Created"
    assert runs == [b"x" * 10, b"x" * 10]


def test_works_on_the_in_memory_settler() -> None:
    """Users can unit-test their guarded WSGI app on ``settle.testing.MemorySettler``."""
    runs: list[int] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        runs.append(current_attempt(environ).generation)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [f"run {len(runs)}".encode()]

    guarded = IdempotencyMiddleware(
        app, settler=MemorySettler(namespace="mem"), principal=principal
    )
    with serve_wsgi(guarded) as base, httpx.Client(base_url=base) as client:
        first = client.post("/x", content=b"1", headers=KEY)
        again = client.post("/x", content=b"1", headers=KEY)
    assert first.content == again.content == b"run 1"
    assert len(runs) == 1


def test_an_unguarded_request_has_no_attempt() -> None:
    with pytest.raises(LookupError, match=r"environ\['settle'\]"):
        current_attempt({})


@pytest.mark.parametrize("carrier", [{}, {"settle": "not an attempt"}])
def test_no_attempt_is_a_settle_error_under_wsgi_and_asgi(carrier: dict[str, Any]) -> None:
    """SPEC §11: every public error derives from SettleError. ``current_attempt`` raised a
    bare LookupError (no attempt) or TypeError (something else under "settle")."""
    for lookup in (current_attempt, asgi_current_attempt):
        with pytest.raises(NotGuarded) as raised:
            lookup(carrier)
        assert isinstance(raised.value, SettleError)
        assert isinstance(raised.value, LookupError)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"principal": principal}, "no settler"),
        ({"url": "redis://127.0.0.1:1/0", "principal": principal}, "no settler"),
        ({"settler": "settle.nothing.here", "principal": principal}, "cannot import"),
        ({"settler": MemorySettler(namespace="c")}, "needs 'principal'"),
        (
            {"settler": MemorySettler(namespace="c"), "principal": principal, "tiemout": 1},
            "tiemout",
        ),
        (
            {"settler": MemorySettler(namespace="c"), "principal": principal, "paths": ["x"]},
            "paths",
        ),
    ],
)
def test_framework_configuration_is_checked_at_start_up(
    options: dict[str, Any], message: str
) -> None:
    """Django's ``settings.SETTLE`` and Flask's ``app.config["SETTLE"]`` go through here."""
    with pytest.raises(ConfigurationError, match=message):
        configured_guard(options)


def test_flask_needs_a_principal() -> None:
    app = Flask(__name__)
    app.config["SETTLE"] = {"settler": MemorySettler(namespace="f")}
    with pytest.raises(ConfigurationError, match="principal"):
        Idempotency(app)


def test_flask_refuses_a_second_init_app() -> None:
    """Found in review: a second init_app wrapped the app again; the inner guard found the
    outer's reservation in progress and every guarded request got 409."""
    app = Flask(__name__)
    extension = Idempotency(app, settler=MemorySettler(namespace="twice"), principal=principal)
    with pytest.raises(ConfigurationError, match="already installed"):
        extension.init_app(app)


def test_a_second_start_response_without_exc_info_is_the_apps_error(settler: Settler) -> None:
    """PEP 3333: calling start_response again without exc_info is a fatal error. The app
    gets it raised (its 500 page never replaces the first answer), the attempt is left
    provisional, and a retry runs the handler again; with exc_info the error page replaces
    the first answer."""
    runs: list[str] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        runs.append(environ["PATH_INFO"])
        start_response("201 Created", [("Content-Type", "text/plain")])
        if len(runs) == 1:
            start_response("200 OK", [("Content-Type", "text/plain")])  # raises
        if environ["PATH_INFO"] == "/error-page":
            try:
                raise ValueError("the charge failed after the headers were chosen")
            except ValueError:
                start_response("503 Service Unavailable", [], sys.exc_info())
            return [b"try again"]
        return [b"charged"]

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal)
    with serve_wsgi(guarded) as base, httpx.Client(base_url=base) as client:
        failed = client.post("/charge", content=b"x", headers=KEY)
        retried = client.post("/charge", content=b"x", headers=KEY)
        paged = client.post("/error-page", content=b"x", headers={**KEY, "Idempotency-Key": "k-2"})
    assert failed.status_code == 500
    assert (retried.status_code, retried.content) == (201, b"charged")
    assert "idempotent-replayed" not in retried.headers
    assert (paged.status_code, paged.content) == (503, b"try again")
    assert runs == ["/charge", "/charge", "/error-page"]


def test_an_error_page_started_with_exc_info_replaces_the_body_already_produced(
    settler: Settler,
) -> None:
    """Found in a hunt: an app (or an error-page middleware inside the guard) that wrote or
    yielded part of its response, then called start_response again with exc_info, had its
    402 stored and replayed as the abandoned bytes followed by the error page. The error
    page replaces the whole response: status, headers and body."""

    def charge(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        start_response("201 Created", [("Content-Type", "text/plain")])
        yield b"charged ch_1;"
        raise ValueError("declined by the bank")

    def error_pages(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        try:
            yield from charge(environ, start_response)
        except ValueError:
            start_response("402 Payment Required", [("Content-Type", "text/plain")], sys.exc_info())
            yield b"card declined"

    def writer(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        write = start_response("201 Created", [("Content-Type", "text/plain")])
        write(b"charged ch_2;")
        try:
            raise ValueError("declined by the bank")
        except ValueError:
            start_response("402 Payment Required", [("Content-Type", "text/plain")], sys.exc_info())
        return [b"card declined"]

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        if environ["PATH_INFO"] == "/written":
            return writer(environ, start_response)
        return error_pages(environ, start_response)

    guarded = IdempotencyMiddleware(app, settler=settler, principal=principal)
    with serve_wsgi(guarded) as base, httpx.Client(base_url=base) as client:
        for path in ("/yielded", "/written"):
            headers = {**KEY, "Idempotency-Key": f"k{path[1:]}"}
            first = client.post(path, content=b"x", headers=headers)
            again = client.post(path, content=b"x", headers=headers)
            assert (first.status_code, first.content) == (402, b"card declined")
            assert (again.status_code, again.content) == (402, b"card declined")
            assert again.headers["idempotent-replayed"] == "true"
