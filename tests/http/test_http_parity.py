"""One endpoint, four servers: the same handler behaviours through the ASGI middleware (a
Starlette app under a real uvicorn), the plain WSGI middleware, Django's middleware and
Flask's extension (each under the stdlib's threading WSGI server), over real sockets and a
real Redis. For every behaviour each shell must give its client the same status, problem
type and settle's own headers, leave the same record and log the same ``settle.http.*``
events: a service ported from one server to another answers as before.

The few differences the frameworks truly have are listed in ``DIFFERS`` and documented
(docs/http-endpoints.md, "What differs under WSGI" and "Flask"/"Django", "Order")."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from structlog.testing import capture_logs

import tests.wsgi.test_django_views as django_views  # configures Django's settings first
from settle import AsyncSettler, Settler
from settle.attempt import Attempt
from settle.http.keys import operation_id
from settle.http.stored import StoredResponse
from tests.http.apps import serve, serve_wsgi
from tests.wsgi.test_wsgi_middleware import _take_over

SHELLS = ["asgi", "wsgi", "django", "flask"]
LEASE = 1.0
TIMEOUT = 0.5
OPTIONS: dict[str, Any] = {
    "lease": LEASE,
    "max_request_bytes": 4096,
    "max_response_bytes": 4096,
    "paths": ["/op/*"],
}
PRINCIPAL = "tenant:acme"  # the takeover in tests/wsgi reserves as this principal
PROBLEM = "urn:settle:problem:"


# -- the behaviours, once ----------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    body: bytes
    headers: list[tuple[str, str]] = field(default_factory=list)
    chunks: int = 1  # sent as a stream of this many parts


class Runs:
    """How many times each behaviour's handler ran in one shell, the options the shell
    guards it with, and the "slow" view's events (see :func:`concurrently`): each shell's
    own, so a view of an earlier case or shell still running (one that failed or timed out)
    can neither say it started in this one nor be released by it."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.count: dict[str, int] = {}
        self.options = options
        self.slow_started = threading.Event()
        """Set once the "slow" view runs."""
        self.slow_released = threading.Event()
        """The "slow" view ends once it is set."""

    def ran(self, behaviour: str) -> int:
        self.count[behaviour] = self.count.get(behaviour, 0) + 1
        return self.count[behaviour]


def _answer(behaviour: str, run: int) -> Answer:
    """What a handler that ends normally answers."""
    body = json.dumps({"behaviour": behaviour, "run": run}).encode()
    headers = [("Content-Type", "application/json"), ("Location", f"/receipts/{run}")]
    match behaviour:
        case "client_error":
            return Answer(400, b'{"error": "amount must be positive"}', headers[:1])
        case "server_error" | "late_error":
            return Answer(503, b'{"error": "the provider is down"}', headers[:1])
        case "stream":
            return Answer(201, body, headers, chunks=3)
        case "large":
            return Answer(201, b"x" * 8192, [("Content-Type", "text/plain")])
        case "slow":
            return Answer(201, body, headers)
        case _:
            return Answer(201, body, headers)


class PaymentError(Exception):
    pass


def lose(settler: Settler, attempt: Attempt) -> None:
    """A newer attempt takes the key over; wait (blocking) until the heartbeat says so."""
    _take_over(settler, attempt.operation_id)
    deadline = time.monotonic() + 5
    while not attempt.lost and time.monotonic() < deadline:
        time.sleep(0.02)
    assert attempt.lost


def act(behaviour: str, attempt: Attempt, settler: Settler, runs: Runs) -> Answer:
    """The sync handlers' body (plain WSGI, Django, Flask): answer, or raise."""
    run = runs.ran(behaviour)
    match behaviour:
        case "raise":
            raise PaymentError("the charge failed")
        case "raise_after_lost":
            lose(settler, attempt)
            try:
                raise PaymentError("the charge failed")
            except PaymentError:
                raise  # the handler's own error, bare, after its lease was lost
        case "stale":
            lose(settler, attempt)
            attempt.check()  # StaleAttempt
        case "timeout":
            time.sleep(TIMEOUT + 0.15)  # a blocking downstream call past the timeout
            attempt.check()  # TimeoutError
        case "late_error" | "late_created":
            time.sleep(TIMEOUT + 0.15)  # then answers without asking check()
        case "slow":
            runs.slow_started.set()
            runs.slow_released.wait(30)  # until the concurrent request has its answer
    return _answer(behaviour, run)


async def aact(behaviour: str, attempt: Attempt, settler: Settler, runs: Runs) -> Answer:
    """The ASGI handler's body: the same behaviours, on the event loop."""
    run = runs.ran(behaviour)
    match behaviour:
        case "raise":
            raise PaymentError("the charge failed")
        case "raise_after_lost" | "stale":
            await asyncio.to_thread(_take_over, settler, attempt.operation_id)
            deadline = time.monotonic() + 5
            while not attempt.lost and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.02)  # the heartbeat stops the handler here
            if behaviour == "stale":
                attempt.check()
            try:
                raise PaymentError("the charge failed")
            except PaymentError:
                raise
        case "timeout":
            time.sleep(TIMEOUT + 0.15)  # noqa: ASYNC251  # a blocking call holds the loop
            attempt.check()
        case "late_error" | "late_created":
            time.sleep(TIMEOUT + 0.15)  # noqa: ASYNC251
        case "slow":
            runs.slow_started.set()
            await asyncio.to_thread(runs.slow_released.wait, 30)
    return _answer(behaviour, run)


# -- the shells --------------------------------------------------------------------------------


def _parts(answer: Answer) -> list[bytes]:
    size = max(1, len(answer.body) // answer.chunks)
    return [answer.body[i : i + size] for i in range(0, len(answer.body), size)]


def asgi_shell(async_settler: AsyncSettler, settler: Settler, runs: Runs) -> Any:

    from settle.asgi import IdempotencyMiddleware, current_attempt  # noqa: PLC0415

    async def op(request: Request) -> Response:
        await request.body()
        behaviour = request.path_params["behaviour"]
        answer = await aact(behaviour, current_attempt(request.scope), settler, runs)
        if answer.chunks > 1:

            async def parts() -> Any:
                for part in _parts(answer):
                    yield part

            return StreamingResponse(parts(), answer.status, dict(answer.headers))
        return Response(answer.body, answer.status, dict(answer.headers))

    async def refuse(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 403, "headers": []})
        await send({"type": "http.response.body", "body": b"refused"})

    class Refusing:
        """An inner middleware that refuses before the route (an authentication check)."""

        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["path"] == "/op/refused":
                await refuse(scope, receive, send)
                return
            await self.app(scope, receive, send)

    def principal(scope: Any) -> str | None:
        value = dict(scope["headers"]).get(b"x-principal")
        return None if value is None else value.decode()

    middleware = [
        Middleware(
            IdempotencyMiddleware, settler=async_settler, principal=principal, **runs.options
        ),
        Middleware(Refusing),
    ]
    return Starlette(routes=[Route("/op/{behaviour}", op, methods=["POST"])], middleware=middleware)


def wsgi_shell(settler: Settler, runs: Runs) -> Any:
    from settle.wsgi import IdempotencyMiddleware, current_attempt  # noqa: PLC0415

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        behaviour = environ["PATH_INFO"].rsplit("/", 1)[-1]
        environ["wsgi.input"].read()
        if behaviour == "refused":  # refused inside the guard, before the "view"
            start_response("403 Forbidden", [])
            return [b"refused"]
        answer = act(behaviour, current_attempt(environ), settler, runs)
        start_response(f"{answer.status} X", answer.headers)
        if answer.chunks > 1:
            return iter(_parts(answer))
        return [answer.body]

    def principal(environ: dict[str, Any]) -> str | None:
        return environ.get("HTTP_X_PRINCIPAL")

    return IdempotencyMiddleware(app, settler=settler, principal=principal, **runs.options)


def flask_shell(settler: Settler, runs: Runs) -> Any:
    from flask import Flask, g, request  # noqa: PLC0415

    from settle.flask import Idempotency  # noqa: PLC0415

    app = Flask(__name__)
    app.config["SETTLE"] = {
        "settler": settler,
        "principal": lambda req: req.headers.get("X-Principal"),
        **runs.options,
    }
    Idempotency(app)

    @app.before_request
    def refuse() -> Any:
        if request.path == "/op/refused":
            return "refused", 403
        return None

    @app.post("/op/<behaviour>")
    def op(behaviour: str) -> Any:
        request.get_data()
        answer = act(behaviour, g.settle, settler, runs)
        if answer.chunks > 1:
            return app.response_class(iter(_parts(answer)), answer.status, answer.headers)
        return answer.body, answer.status, answer.headers

    return app


class _RefusingMiddleware:
    """A Django middleware listed after settle's that refuses before the view."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        from django.http import HttpResponse  # noqa: PLC0415

        if request.path == "/op/refused":
            return HttpResponse(b"refused", status=403)
        return self.get_response(request)


@contextlib.contextmanager
def django_shell(settler: Settler, runs: Runs) -> Iterator[Any]:
    from django.core.handlers.wsgi import WSGIHandler  # noqa: PLC0415
    from django.http import HttpResponse, StreamingHttpResponse  # noqa: PLC0415
    from django.test import override_settings  # noqa: PLC0415
    from django.urls import path  # noqa: PLC0415

    def op(request: Any, behaviour: str) -> Any:
        answer = act(behaviour, request.settle, settler, runs)
        if answer.chunks > 1:
            response: Any = StreamingHttpResponse(iter(_parts(answer)), status=answer.status)
        else:
            response = HttpResponse(answer.body, status=answer.status)
        for name, value in answer.headers:
            response[name] = value
        return response

    settle = {"settler": settler, "principal": django_views.principal, **runs.options}
    middleware = ["settle.django.IdempotencyMiddleware", f"{__name__}._RefusingMiddleware"]
    urls = django_views.urlconf(path("op/<str:behaviour>", op))
    with override_settings(ROOT_URLCONF=urls, MIDDLEWARE=middleware, SETTLE=settle):
        yield WSGIHandler()


@contextlib.contextmanager
def served(
    shell: str, settler: Settler, async_settler: AsyncSettler, runs: Runs
) -> Iterator[httpx.Client]:
    with contextlib.ExitStack() as stack:
        if shell == "asgi":
            base = stack.enter_context(
                serve(asgi_shell(async_settler, settler, runs), async_settler)
            )
        elif shell == "wsgi":
            base = stack.enter_context(serve_wsgi(wsgi_shell(settler, runs)))
        elif shell == "flask":
            base = stack.enter_context(serve_wsgi(flask_shell(settler, runs)))
        else:
            handler = stack.enter_context(django_shell(settler, runs))
            base = stack.enter_context(serve_wsgi(handler))
        yield stack.enter_context(httpx.Client(base_url=base, timeout=30))


# -- what a client sees, what is stored, what is logged -----------------------------------------


def seen(answer: httpx.Response) -> dict[str, Any]:
    """What the client got that settle decides: status, problem type, settle's headers."""
    type_ = answer.headers.get("content-type")
    problem = type_ == "application/problem+json"
    return {
        "status": answer.status_code,
        "problem": answer.json()["type"].removeprefix(PROBLEM) if problem else None,
        "replayed": answer.headers.get("idempotent-replayed"),
        "retry-after": answer.headers.get("retry-after"),
        # settle's or the handler's (JSON); a framework's own page is its own
        "content-type": type_ if type_ and "json" in type_ else None,
        "location": answer.headers.get("location"),
    }


def stored(settler: Settler, key: str, principal: str = PRINCIPAL) -> dict[str, Any]:
    record = settler.get(operation_id("http", key, principal, "principal"))
    if record is None:
        return {"state": None}
    out: dict[str, Any] = {"state": record.state.value, "reason": record.reason}
    if record.state.value == "completed":
        response = record.value(StoredResponse)
        out["status"], out["kept"] = response.status, response.body is not None
    out["quarantined"] = len(settler.quarantine.list(operation_id=record.operation_id))
    return out


#: A takeover (``_take_over``) is two scripts: the record is made provisional, then reserved
#: again by a newer attempt. The heartbeat that finds the lease lost may run between them
#: (``not_pending``) or after both (``stale_generation``), in any shell: the same loss, said
#: at two instants. CI once saw Django's heartbeat land between them.
_TAKEOVER_SEEN = {"not_pending": "taken_over", "stale_generation": "taken_over"}


def events(logs: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """The settle.http events, with the field that says why, in a stable order."""
    why = ("reason", "problem", "status")
    found = []
    for e in logs:
        if str(e.get("event", "")).startswith("settle.http."):
            detail = next((e[name] for name in why if name in e), None)
            if e["event"] == "settle.http.lease_lost":
                detail = _TAKEOVER_SEEN.get(detail, detail)
            found.append((e["event"], detail))
    return sorted(found, key=repr)


# -- the cases ---------------------------------------------------------------------------------

#: Sends a case's requests (the client, the key, the shell's :class:`Runs`).
Sends = Callable[[httpx.Client, str, Runs], list[httpx.Response]]


def _post(client: httpx.Client, behaviour: str, key: str, **kw: Any) -> httpx.Response:
    headers = {"Idempotency-Key": key, "X-Principal": kw.pop("principal", PRINCIPAL)}
    return client.post(
        f"/op/{behaviour}", content=kw.pop("body", b'{"amount": 1}'), headers=headers
    )


def twice(behaviour: str) -> Sends:
    """The request, then its retry with the same key."""

    def send(client: httpx.Client, key: str, runs: Runs) -> list[httpx.Response]:
        return [_post(client, behaviour, key), _post(client, behaviour, key)]

    return send


def once(behaviour: str, **kw: Any) -> Sends:
    def send(client: httpx.Client, key: str, runs: Runs) -> list[httpx.Response]:
        return [_post(client, behaviour, key, **kw)]

    return send


def concurrently(client: httpx.Client, key: str, runs: Runs) -> list[httpx.Response]:
    """The second request is sent once the first is in its view, and the first's view ends
    once the second has its answer (or after 30 s, if it went into the view too): a fixed
    head start and a fixed 0.8 s view left a loaded machine room to answer the first before
    the second arrived. The events are the shell's own (``runs``), made for this case."""
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(_post, client, "slow", key)
        try:
            assert runs.slow_started.wait(30), "the first request never reached its view"
            second = pool.submit(_post, client, "slow", key)
            wait([second], timeout=30)
        finally:
            runs.slow_released.set()
        # Whichever reserved first answers 201, the other 409.
        return sorted([first.result(), second.result()], key=lambda a: a.status_code)


def mismatched(client: httpx.Client, key: str, runs: Runs) -> list[httpx.Response]:
    return [_post(client, "created", key), _post(client, "created", key, body=b'{"amount": 2}')]


def another_principal(client: httpx.Client, key: str, runs: Runs) -> list[httpx.Response]:
    return [
        _post(client, "created", key),
        _post(client, "created", key, principal="tenant:umbrella"),
    ]


CASES: dict[str, Sends] = {
    "answers 2xx": twice("created"),
    "answers 4xx": twice("client_error"),
    "answers 5xx": twice("server_error"),
    "raises": once("raise"),
    "raises after its lease was lost": once("raise_after_lost"),
    "check() raises StaleAttempt": once("stale"),
    "check() raises TimeoutError": once("timeout"),
    "answers 5xx past its timeout": once("late_error"),
    "answers 2xx past its timeout": once("late_created"),
    "streams its body": twice("stream"),
    "answers past max_response_bytes": twice("large"),
    "is sent a body past max_request_bytes": once("created", body=b"x" * 5000),
    "is refused before the view": once("refused"),
    "is sent twice at once": concurrently,
    "is sent again with another body": mismatched,
    "is sent by another principal": another_principal,
}


def _refused_unstored(observed: dict[str, Any]) -> dict[str, Any]:
    """Django and Flask tell a refusal before the view (a middleware's, a ``before_request``
    hook's) from the view's answer: sent, never stored, the attempt provisional
    (``handler_not_reached``), so the same request runs the view once put right. A bare
    ASGI or WSGI app cannot tell, and stores it as the app's finished answer
    (docs/http-endpoints.md: put such a middleware outside settle's)."""
    record = observed["record"]
    assert (record["state"], record["reason"]) == ("provisional", "handler_not_reached")
    stored = {"state": "completed", "reason": None, "status": 403, "kept": True}
    events = [("settle.http.completed", 403), ("settle.http.started", None)]
    return {**observed, "record": {**stored, "quarantined": 0}, "events": events}


#: Where the frameworks truly differ (documented in docs/http-endpoints.md): shell, case ->
#: checks what it observes instead, and gives what the ASGI shell observes.
DIFFERS: dict[tuple[str, str], Callable[[dict[str, Any]], dict[str, Any]]] = {
    ("django", "is refused before the view"): _refused_unstored,
    ("flask", "is refused before the view"): _refused_unstored,
}


def observe(shell: str, case: str, settler: Settler, async_settler: AsyncSettler) -> dict[str, Any]:
    # A timeout only where the case is about it: a lost lease is found within lease / 3,
    # and a loaded machine must not turn that wait into a timeout.
    timeout = TIMEOUT if "timeout" in case.lower() or "TimeoutError" in case else None
    runs = Runs({**OPTIONS, "timeout": timeout})
    key = f"k-{case.replace(' ', '-')}"
    with capture_logs() as logs, served(shell, settler, async_settler, runs) as client:
        answers = CASES[case](client, key, runs)
        time.sleep(0.05)  # an ASGI settlement after the last byte went out
    observed = {
        "answers": [seen(a) for a in answers],
        "record": stored(settler, key),
        "runs": sum(runs.count.values()),
        "events": events(logs),
    }
    if case == "is sent by another principal":
        observed["other record"] = stored(settler, key, "tenant:umbrella")
    if len(answers) == 2 and answers[1].headers.get("idempotent-replayed"):
        observed["replayed byte for byte"] = answers[1].content == answers[0].content
    return observed


#: What every shell must give (checked on the ASGI shell's observation, which the others
#: must equal): each answer's status and problem, and the record's state and reason.
EXPECTED: dict[str, tuple[list[tuple[int, str | None]], tuple[str | None, str | None]]] = {
    "answers 2xx": ([(201, None), (201, None)], ("completed", None)),
    "answers 4xx": ([(400, None), (400, None)], ("completed", None)),
    "answers 5xx": ([(503, None), (503, None)], ("provisional", "status_503")),
    "raises": ([(500, None)], ("provisional", "exception")),
    "raises after its lease was lost": ([(409, "attempt-superseded")], ("pending", None)),
    "check() raises StaleAttempt": ([(409, "attempt-superseded")], ("pending", None)),
    "check() raises TimeoutError": ([(504, "handler-timeout")], ("provisional", "timeout")),
    "answers 5xx past its timeout": ([(504, "handler-timeout")], ("provisional", "timeout")),
    # The loop held past the deadline (ASGI) or a thread never stopped (WSGI): a finished
    # answer given late is stored, the truth; an ASGI handler that awaits meanwhile is
    # answered 504 at its deadline instead (docs/http-endpoints.md, "What differs").
    "answers 2xx past its timeout": ([(201, None)], ("completed", None)),
    "streams its body": ([(201, None), (201, None)], ("completed", None)),
    "answers past max_response_bytes": (
        [(201, None), (410, "response-not-stored")],
        ("completed", None),
    ),
    "is sent a body past max_request_bytes": ([(413, "request-too-large")], (None, None)),
    "is refused before the view": ([(403, None)], ("completed", None)),
    "is sent twice at once": ([(201, None), (409, "request-in-progress")], ("completed", None)),
    "is sent again with another body": (
        [(201, None), (422, "idempotency-key-reused")],
        ("completed", None),
    ),
    "is sent by another principal": ([(201, None), (201, None)], ("completed", None)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_shell_answers_stores_and_logs_alike(
    case: str, redis_url: str, namespace: str
) -> None:
    found: dict[str, dict[str, Any]] = {}
    for shell in SHELLS:
        settler = Settler.from_url(redis_url, namespace=f"{namespace}{shell}", shards=2)
        # Made for the ASGI shell only, and closed by its server as it stops.
        async_settler = AsyncSettler.from_url(redis_url, namespace=f"{namespace}{shell}", shards=2)
        try:
            observed = observe(shell, case, settler, async_settler)
        finally:
            settler.close()
        differs = DIFFERS.get((shell, case))
        found[shell] = differs(observed) if differs else observed
    asgi = found["asgi"]
    answers, (state, reason) = EXPECTED[case]
    assert [(a["status"], a["problem"]) for a in asgi["answers"]] == answers, asgi
    assert (asgi["record"]["state"], asgi["record"].get("reason")) == (state, reason), asgi
    differ = {
        shell: {k: v for k, v in o.items() if asgi.get(k) != v}
        for shell, o in found.items()
        if o != asgi
    }
    assert differ == {}, f"asgi: {asgi}"
