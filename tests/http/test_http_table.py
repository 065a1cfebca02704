"""The endpoint guarantees, one table run against both protocols.

Each case runs twice: against the ASGI middleware (a Starlette app under a real uvicorn
server) and the WSGI middleware (a bare PEP 3333 app under the stdlib's threading WSGI
server), both on loopback ports and a real Redis, through real httpx clients over sockets.
The rules live once in :mod:`settle.http`; this table holds both shells to them.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from settle import AsyncSettler, Reserved, Settler, State
from settle._log import operation_digest
from settle.asgi import IdempotencyMiddleware
from settle.asgi import current_attempt as asgi_attempt
from settle.embedded import EmbeddedRedis
from settle.http._sync import status_line
from settle.http.keys import operation_id
from settle.http.stored import StoredResponse
from settle.wsgi import IdempotencyMiddleware as WSGIMiddleware
from settle.wsgi import current_attempt as wsgi_attempt
from tests.http.apps import (
    Ledger,
    key_headers,
    principal_from_environ,
    principal_from_header,
    serve,
    serve_wsgi,
    starlette_app,
    wsgi_app,
)
from tests.wsgi.test_wsgi_middleware import _holder, _take_over

#: Small limits so that the 413 and 410 cases stay small.
OPTIONS = {"max_request_bytes": 4096, "max_response_bytes": 4096}
PROBLEM = "urn:settle:problem:"


@dataclass
class Endpoint:
    protocol: str
    client: httpx.Client
    ledger: Ledger


@pytest.fixture(params=["asgi", "wsgi"])
def endpoint(request: pytest.FixtureRequest, redis_url: str, namespace: str) -> Iterator[Endpoint]:
    ledger = Ledger()
    with contextlib.ExitStack() as stack:
        if request.param == "asgi":
            async_settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
            app = starlette_app(async_settler, ledger, **OPTIONS)
            base = stack.enter_context(serve(app, async_settler))
        else:
            settler = stack.enter_context(
                contextlib.closing(Settler.from_url(redis_url, namespace=namespace, shards=4))
            )
            base = stack.enter_context(serve_wsgi(wsgi_app(settler, ledger, **OPTIONS)))
        client = stack.enter_context(httpx.Client(base_url=base, timeout=30))
        stack.callback(ledger.gate.set)
        yield Endpoint(request.param, client, ledger)


def odd_principal(value: str | None) -> object:
    """What a misbehaving principal callable returns for the ``X-Principal`` header."""
    match value:
        case "raise":
            raise RuntimeError("the session store is down")
        case "empty":
            return ""
        case "long":
            return "p" * 1025
        case "control":
            return "tenant\x1b[2J"
        case "separator":
            return "tenant\u2028acme"
        case "number":
            return 42
        case "bytes":
            return b"tenant:acme"
    return value


def _asgi_odd(scope: dict[str, object]) -> object:
    headers = dict(scope["headers"])  # type: ignore[call-overload]
    value = headers.get(b"x-principal")
    return odd_principal(None if value is None else value.decode("latin-1"))


def _wsgi_odd(environ: dict[str, object]) -> object:
    value = environ.get("HTTP_X_PRINCIPAL")
    return odd_principal(None if value is None else str(value))


@pytest.fixture(params=["asgi", "wsgi"])
def odd_endpoint(
    request: pytest.FixtureRequest, redis_url: str, namespace: str
) -> Iterator[Endpoint]:
    """An endpoint whose principal callable misbehaves on demand (see :func:`odd_principal`)."""
    ledger = Ledger()
    with contextlib.ExitStack() as stack:
        if request.param == "asgi":
            async_settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
            app = starlette_app(async_settler, ledger, principal=_asgi_odd, **OPTIONS)
            base = stack.enter_context(serve(app, async_settler))
        else:
            settler = stack.enter_context(
                contextlib.closing(Settler.from_url(redis_url, namespace=namespace, shards=4))
            )
            app = wsgi_app(settler, ledger, principal=_wsgi_odd, **OPTIONS)
            base = stack.enter_context(serve_wsgi(app))
        client = stack.enter_context(httpx.Client(base_url=base, timeout=30))
        yield Endpoint(request.param, client, ledger)


def problem_type(response: httpx.Response) -> str:
    assert response.headers["content-type"] == "application/problem+json"
    assert "idempotent-replayed" not in response.headers
    document = response.json()
    assert document["status"] == response.status_code
    return str(document["type"]).removeprefix(PROBLEM)


PAYMENT = {"amount": 4200, "currency": "EUR"}


@contextlib.contextmanager
def gated_first(endpoint: Endpoint, key: str) -> Iterator[list[httpx.Response]]:
    """A first ``/gated`` request under ``key`` runs (held) in a thread while the block
    runs; then the gate opens and the list holds its response."""
    done: list[httpx.Response] = []
    first = threading.Thread(
        target=lambda: done.append(
            endpoint.client.post("/gated", json={}, headers=key_headers(key))
        )
    )
    first.start()
    try:
        assert endpoint.ledger.entered.wait(10)
        yield done
    finally:
        endpoint.ledger.gate.set()
        first.join(10)


def test_missing_key_is_400_and_nothing_runs(endpoint: Endpoint) -> None:
    response = endpoint.client.post("/payments", json=PAYMENT, headers=key_headers(None))
    assert response.status_code == 400
    assert problem_type(response) == "idempotency-key-missing"
    assert endpoint.ledger.count() == 0


@pytest.mark.parametrize("key", ["a b", '"unclosed', "k" * 201, '"a";p=1'])
def test_malformed_key_is_400_and_nothing_runs(endpoint: Endpoint, key: str) -> None:
    response = endpoint.client.post("/payments", json=PAYMENT, headers=key_headers(key))
    assert response.status_code == 400
    assert problem_type(response) == "idempotency-key-malformed"
    assert endpoint.ledger.count() == 0


def test_no_principal_is_401_and_nothing_runs(endpoint: Endpoint) -> None:
    response = endpoint.client.post("/payments", json=PAYMENT, headers=key_headers("k", None))
    assert response.status_code == 401
    assert problem_type(response) == "principal-required"
    assert endpoint.ledger.count() == 0


@pytest.mark.parametrize(
    ("principal", "status", "problem", "event"),
    [
        ("empty", 401, "principal-required", "settle.http.principal_unusable"),
        ("long", 401, "principal-required", "settle.http.principal_unusable"),
        ("control", 401, "principal-required", "settle.http.principal_unusable"),
        ("separator", 401, "principal-required", "settle.http.principal_unusable"),
        ("raise", 500, "principal-failed", "settle.http.principal_failed"),
        ("number", 500, "principal-failed", "settle.http.principal_failed"),
        ("bytes", 500, "principal-failed", "settle.http.principal_failed"),
    ],
)
def test_a_misbehaving_principal_callable_gets_a_problem_and_stores_nothing(
    odd_endpoint: Endpoint,
    redis_client: Any,
    namespace: str,
    principal: str,
    status: int,
    problem: str,
    event: str,
) -> None:
    with capture_logs() as events:
        response = odd_endpoint.client.post(
            "/payments", json=PAYMENT, headers=key_headers("k-odd", principal)
        )
    assert response.status_code == status
    assert problem_type(response) == problem
    assert odd_endpoint.ledger.count() == 0
    assert redis_client.keys(f"settle:{{{namespace}:*") == []  # nothing stored
    logged = [e for e in events if e["event"] == event]
    assert len(logged) == 1
    assert "tenant" not in repr(events)  # the value is never logged


def test_replay_is_byte_identical_and_marked(endpoint: Endpoint) -> None:
    client = endpoint.client
    first = client.post("/payments", json=PAYMENT, headers=key_headers("pay-1"))
    again = client.post(
        "/payments",
        content=b'{"currency":"EUR","amount":4200}',
        headers={**key_headers('"pay-1"'), "content-type": "application/json"},
    )
    assert first.status_code == again.status_code == 201
    assert "idempotent-replayed" not in first.headers
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    assert again.headers["location"] == first.headers["location"]
    assert again.headers["content-type"] == first.headers["content-type"]
    assert "set-cookie" in first.headers
    assert "set-cookie" not in again.headers  # never stored: it belongs to one client
    assert "x-trace" not in again.headers  # not on the allow-list
    assert endpoint.ledger.count("/payments") == 1


def test_a_redirect_after_the_work_is_stored_and_the_handler_never_runs_again(
    endpoint: Endpoint,
) -> None:
    """Found in review: "charge, then 303 to the receipt" (Post/Redirect/Get) was not
    stored, so every retry of the key charged again."""
    client = endpoint.client
    first = client.post("/checkout", json=PAYMENT, headers=key_headers("prg-1"))
    again = client.post("/checkout", json=PAYMENT, headers=key_headers("prg-1"))
    assert first.status_code == again.status_code == 303
    assert again.headers["location"] == first.headers["location"]
    assert again.headers["idempotent-replayed"] == "true"
    assert endpoint.ledger.count("/checkout") == 1


def test_changed_body_under_the_same_key_is_422(endpoint: Endpoint) -> None:
    client = endpoint.client
    assert client.post("/payments", json=PAYMENT, headers=key_headers("k")).status_code == 201
    changed = client.post("/payments", json={**PAYMENT, "amount": 1}, headers=key_headers("k"))
    assert changed.status_code == 422
    assert problem_type(changed) == "idempotency-key-reused"
    assert endpoint.ledger.count("/payments") == 1


def test_same_key_while_the_first_runs_is_409_with_retry_after(endpoint: Endpoint) -> None:
    client, ledger = endpoint.client, endpoint.ledger
    with gated_first(endpoint, "g") as results:
        busy = client.post("/gated", json={}, headers=key_headers("g"))
    assert busy.status_code == 409
    assert busy.headers["retry-after"] == "1"
    assert problem_type(busy) == "request-in-progress"
    assert [r.status_code for r in results] == [201]
    replay = client.post("/gated", json={}, headers=key_headers("g"))
    assert replay.content == results[0].content
    assert ledger.count("/gated") == 1


def test_a_5xx_is_not_stored_and_the_retry_runs_under_a_new_generation(
    endpoint: Endpoint,
) -> None:
    client = endpoint.client
    failed = client.post("/flaky", json={}, headers=key_headers("f"))
    assert failed.status_code == 500
    retried = client.post("/flaky", json={}, headers=key_headers("f"))
    assert retried.status_code == 201
    assert retried.json()["run"] == 2
    first_generation, second_generation = endpoint.ledger.generations("/flaky")
    assert second_generation > first_generation
    replay = client.post("/flaky", json={}, headers=key_headers("f"))
    assert replay.content == retried.content
    assert replay.headers["idempotent-replayed"] == "true"
    assert endpoint.ledger.count("/flaky") == 2


def test_an_exception_is_not_stored_and_the_retry_runs_under_a_new_generation(
    endpoint: Endpoint,
) -> None:
    client = endpoint.client
    # uvicorn drops the connection after an app error: do not reuse it for the retry.
    close = {**key_headers("b"), "Connection": "close"}
    crashed = client.post("/boom", json={}, headers=close)
    assert crashed.status_code == 500  # the server's own error page
    retried = client.post("/boom", json={}, headers=key_headers("b"))
    assert retried.status_code == 201
    first_generation, second_generation = endpoint.ledger.generations("/boom")
    assert second_generation > first_generation
    assert client.post("/boom", json={}, headers=key_headers("b")).content == retried.content


def test_a_superseded_attempt_answers_with_the_authoritative_response(
    endpoint: Endpoint, settler: Settler
) -> None:
    """Attempt 1 loses its reservation while it runs (marked provisional, as after a lost
    lease) and attempt 2 completes: attempt 1's response is quarantined and its client gets
    attempt 2's stored response instead, and the quarantine kind is logged by its value."""
    client, ledger = endpoint.client, endpoint.ledger
    with capture_logs() as events, gated_first(endpoint, "k") as late:
        op = operation_id("http", "k", "tenant:acme", "principal")
        settler.mark_provisional(_holder(settler, op), "test: lease lost")
        second = client.post("/gated", json={}, headers=key_headers("k"))
    assert second.status_code == 201
    assert [r.status_code for r in late] == [201]
    assert late[0].content == second.content
    assert late[0].headers["idempotent-replayed"] == "true"
    kinds = [e.kind.value for e in settler.quarantine.list(operation_id=op)]
    assert kinds == ["stale_generation"]
    assert ledger.count("/gated") == 2
    [superseded] = [e for e in events if e["event"] == "settle.http.superseded"]
    assert superseded["kind"] == "stale_generation"
    assert type(superseded["kind"]) is str  # not the enum: rendered as its repr by stdlib


def test_two_principals_with_one_key_never_see_each_others_response(
    endpoint: Endpoint,
) -> None:
    client = endpoint.client
    acme = client.post("/payments", json=PAYMENT, headers=key_headers("same", "tenant:acme"))
    umbrella = client.post(
        "/payments", json=PAYMENT, headers=key_headers("same", "tenant:umbrella")
    )
    assert acme.status_code == umbrella.status_code == 201
    assert acme.json()["id"] != umbrella.json()["id"]
    assert "idempotent-replayed" not in umbrella.headers
    acme_again = client.post("/payments", json=PAYMENT, headers=key_headers("same", "tenant:acme"))
    assert acme_again.content == acme.content
    assert endpoint.ledger.count("/payments") == 2


def test_a_body_over_the_limit_is_413_and_nothing_runs(endpoint: Endpoint) -> None:
    body = {"pad": "x" * 5000}
    response = endpoint.client.post("/payments", json=body, headers=key_headers("big"))
    assert response.status_code == 413
    assert problem_type(response) == "request-too-large"
    assert endpoint.ledger.count() == 0


def test_a_response_over_the_limit_is_sent_once_then_410(endpoint: Endpoint) -> None:
    client = endpoint.client
    first = client.post("/stream?size=10000", json={}, headers=key_headers("s"))
    assert first.status_code == 200
    assert len(first.content) == 32 + 10000
    again = client.post("/stream?size=10000", json={}, headers=key_headers("s"))
    assert again.status_code == 410
    assert problem_type(again) == "response-not-stored"
    # The size the first client was sent, counted alike by ASGI and WSGI (the ASGI path
    # once stopped counting where the limit was crossed).
    assert f"its {32 + 10000}-byte response" in again.json()["detail"]
    assert endpoint.ledger.count("/stream") == 1


def test_unguarded_requests_pass_through(endpoint: Endpoint) -> None:
    response = endpoint.client.get("/open")
    assert response.json() == {"guarded": False}


def test_structlog_events_name_each_step_and_never_carry_payloads(endpoint: Endpoint) -> None:
    client = endpoint.client
    secret = {"card": "4242424242424242", "amount": 77}
    with capture_logs() as events:
        client.post("/payments", json=secret, headers=key_headers("k-log", "tenant:acme"))
        client.post("/payments", json=secret, headers=key_headers("k-log", "tenant:acme"))
        client.post("/payments", json={"amount": 1}, headers=key_headers("k-log"))
        client.post("/payments", json=secret, headers=key_headers(None))
    http = [e for e in events if e["event"].startswith("settle.http.")]
    assert [e["event"] for e in http] == [
        "settle.http.started",
        "settle.http.completed",
        "settle.http.replayed",
        "settle.http.rejected",
        "settle.http.rejected",
    ]
    assert [e.get("problem") for e in http[3:]] == [
        "idempotency-key-reused",
        "idempotency-key-missing",
    ]
    assert http[1]["status"] == 201
    op = operation_id("http", "k-log", "tenant:acme", "principal")
    # SPEC 12: the operation only as its keyed digest, never the id (nor the key in it)
    assert all(e["operation_digest"] == operation_digest(op) for e in http[:4])
    text = repr(events)
    assert op not in text
    assert "k-log" not in text
    assert "4242424242424242" not in text
    assert "tenant:acme" not in text


@pytest.mark.parametrize("protocol", ["asgi", "wsgi"])
def test_a_store_that_refuses_settle_answers_503_and_runs_nothing(
    protocol: str, redis_url: str, namespace: str
) -> None:
    """Redis refusing settle (here a client configured with another shard count than its
    namespace's; credentials in rotation or a cluster missing slots alike) is a 503
    problem with Retry-After, as an unreachable store is, not the server's bare 500."""
    with contextlib.closing(Settler.from_url(redis_url, namespace=namespace, shards=4)) as s:
        s.reserve("elsewhere", {"n": 1}, principal="tenant:acme")
    ledger = Ledger()
    with contextlib.ExitStack() as stack:
        if protocol == "asgi":
            async_settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=8)
            base = stack.enter_context(serve(starlette_app(async_settler, ledger), async_settler))
        else:
            settler = stack.enter_context(
                contextlib.closing(Settler.from_url(redis_url, namespace=namespace, shards=8))
            )
            base = stack.enter_context(serve_wsgi(wsgi_app(settler, ledger)))
        client = stack.enter_context(httpx.Client(base_url=base, timeout=30))
        response = client.post("/payments", json={"amount": 1}, headers=key_headers("k"))
    assert response.status_code == 503
    assert problem_type(response) == "idempotency-unavailable"
    assert response.headers["retry-after"]
    assert ledger.count() == 0


#: The handler's own (stale) response over max_response_bytes, in messages of these sizes:
#: the limit is crossed by the one message, by the last, by the first of several, by one
#: in the middle.
LARGE = {
    "one-message": [10_000],
    "crossed-by-the-last": [3000, 3000],
    "crossed-by-the-first": [5000, 100, 100],
    "crossed-in-the-middle": [2000, 3000, 100],
}


def _supersede(settler: Settler, operation: str, *, complete: bool) -> None:
    """What a lapsed lease and a retry do to a running attempt: a newer one owns the key
    (and, ``complete``, has stored its 200 ``newer``)."""
    newer = _take_over(settler, operation)
    if complete:
        stored = StoredResponse.capture(200, [(b"content-type", b"text/plain")], b"newer", [])
        settler.complete(newer.reservation, stored)


def _large_endpoint(
    stack: contextlib.ExitStack,
    protocol: str,
    redis_url: str,
    namespace: str,
    sizes: list[int],
    supersede: Callable[[str], None],
    before: int = 0,
    status: int = 201,
) -> httpx.Client:
    """An endpoint that answers ``status`` with ``sizes`` bytes of ``s``, in one message
    (ASGI) or chunk (WSGI) each, and calls ``supersede(operation_id)`` before its message
    ``before`` (0: before its response starts)."""
    if protocol == "asgi":

        async def asgi(scope: Any, receive: Any, send: Any) -> None:
            while (await receive()).get("more_body"):
                pass
            operation = asgi_attempt(scope).operation_id
            if before == 0:
                supersede(operation)
            headers = [(b"content-type", b"text/plain")]
            await send({"type": "http.response.start", "status": status, "headers": headers})
            for i, size in enumerate(sizes, 1):
                if i == before:
                    supersede(operation)
                more = i < len(sizes)
                await send({"type": "http.response.body", "body": b"s" * size, "more_body": more})

        async_settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
        guarded = IdempotencyMiddleware(
            asgi, settler=async_settler, principal=principal_from_header, **OPTIONS
        )
        base = stack.enter_context(serve(guarded, async_settler))
    else:

        def wsgi(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
            operation = wsgi_attempt(environ).operation_id
            if before == 0:
                supersede(operation)
            start_response(status_line(status), [("Content-Type", "text/plain")])
            for i, size in enumerate(sizes, 1):
                if i == before:
                    supersede(operation)
                yield b"s" * size

        settler = stack.enter_context(
            contextlib.closing(Settler.from_url(redis_url, namespace=namespace, shards=4))
        )
        app = WSGIMiddleware(wsgi, settler=settler, principal=principal_from_environ, **OPTIONS)
        base = stack.enter_context(serve_wsgi(app))
    return stack.enter_context(httpx.Client(base_url=base, timeout=30))


@pytest.mark.parametrize("protocol", ["asgi", "wsgi"])
@pytest.mark.parametrize("sizes", LARGE.values(), ids=LARGE.keys())
@pytest.mark.parametrize("newer", ["pending", "completed"])
def test_a_superseded_attempt_over_the_response_limit_never_sends_its_own_response(
    protocol: str, sizes: list[int], newer: str, redis_url: str, namespace: str, settler: Settler
) -> None:
    """A newer attempt took the key over before the stale one answered, with a response
    over max_response_bytes: whichever message crosses the limit, nothing of the stale
    response has gone out, so its client gets the newer attempt's stored response, or 409
    attempt-superseded while it runs, as under WSGI; the stale response is quarantined.
    (ASGI sent its one-message or last-message 201 after the quarantine.)"""

    def supersede(operation: str) -> None:
        _supersede(settler, operation, complete=newer == "completed")

    with contextlib.ExitStack() as stack:
        client = _large_endpoint(stack, protocol, redis_url, namespace, sizes, supersede)
        response = client.post("/charge", content=b"{}", headers=key_headers("k-large"))
    assert b"s" * 100 not in response.content
    if newer == "completed":
        assert (response.status_code, response.content) == (200, b"newer")
        assert response.headers["idempotent-replayed"] == "true"
    else:
        assert problem_type(response) == "attempt-superseded"
        assert response.status_code == 409
    op = operation_id("http", "k-large", "tenant:acme", "principal")
    [entry] = settler.quarantine.list(operation_id=op)
    assert entry.kind.value == "stale_generation"
    assert entry.payload is not None


@pytest.mark.parametrize("protocol", ["asgi", "wsgi"])
def test_a_takeover_after_a_large_response_started_streaming_is_quarantined(
    protocol: str, redis_url: str, namespace: str, settler: Settler
) -> None:
    """The newer attempt takes over after the limit was crossed and the stale response's
    start and first bytes went out (under ASGI it streams from there): that client gets the
    stale response whole, as docs/http-endpoints.md says, since nothing else can be said
    once a status is out; the record is not touched (the stale settlement is quarantined)
    and the next request with the key gets the authoritative outcome. Under WSGI the
    renewal before the first byte is asked once the part after the one that crossed the
    limit is read (to learn whether more follow): this takeover, made before that part, is
    found by it, so its client gets the 409 and none of the stale response."""
    sizes = LARGE["crossed-by-the-first"]

    def supersede(operation: str) -> None:
        _supersede(settler, operation, complete=False)

    with contextlib.ExitStack() as stack:
        client = _large_endpoint(stack, protocol, redis_url, namespace, sizes, supersede, 2)
        response = client.post("/charge", content=b"{}", headers=key_headers("k-late"))
        retried = client.post("/charge", content=b"{}", headers=key_headers("k-late"))
    if protocol == "asgi":
        assert (response.status_code, response.content) == (201, b"s" * sum(sizes))
    else:
        assert problem_type(response) == "attempt-superseded"
    op = operation_id("http", "k-late", "tenant:acme", "principal")
    assert [e.kind.value for e in settler.quarantine.list(operation_id=op)] == ["stale_generation"]
    assert problem_type(retried) == "request-in-progress"  # the newer attempt's


def _lapse(settler: Settler, operation: str) -> None:
    """The running attempt's lease lapses on the server's clock (a long pause, a blocked
    loop, a slow Redis) and nobody takes the key over: the record stays pending at the
    attempt's generation, its lease passed."""
    assert settler.renew(_holder(settler, operation), lease=0.05).renewed
    time.sleep(0.15)


@pytest.mark.parametrize("protocol", ["asgi", "wsgi"])
@pytest.mark.parametrize("sizes", LARGE.values(), ids=LARGE.keys())
def test_a_lapsed_lease_without_a_takeover_still_gets_its_large_response(
    protocol: str, sizes: list[int], redis_url: str, namespace: str, settler: Settler
) -> None:
    """The renewal asked before a large response goes on finds the lease lapsed, but no
    newer attempt: the attempt still owns the operation (its ``complete`` of the "not
    stored" marker is accepted, SPEC 2), so its client gets the response, as under WSGI,
    and a retry gets 410. (ASGI answered 409 attempt-superseded, then completed the
    operation with the marker: the response was lost for good, every retry got 410.)"""
    with contextlib.ExitStack() as stack:
        client = _large_endpoint(
            stack, protocol, redis_url, namespace, sizes, lambda op: _lapse(settler, op)
        )
        with capture_logs() as logs:
            first = client.post("/charge", content=b"{}", headers=key_headers("k-lapse"))
        retried = client.post("/charge", content=b"{}", headers=key_headers("k-lapse"))
    assert (first.status_code, first.content) == (201, b"s" * sum(sizes))
    assert problem_type(retried) == "response-not-stored"
    op = operation_id("http", "k-lapse", "tenant:acme", "principal")
    record = settler.get(op)
    assert record is not None
    assert record.state is State.COMPLETED
    assert settler.quarantine.list(operation_id=op) == []
    events = [e["event"] for e in logs]
    assert "settle.http.lease_lost" not in events
    asked = sizes in (
        LARGE["crossed-by-the-first"],
        LARGE["crossed-in-the-middle"],
    )
    assert ("settle.http.lease_lapsed" in events) is asked  # the renewal before the first byte


@pytest.mark.parametrize("protocol", ["asgi", "wsgi"])
@pytest.mark.parametrize("sizes", LARGE.values(), ids=LARGE.keys())
def test_a_large_response_goes_out_when_redis_is_down_before_its_first_byte(
    protocol: str, sizes: list[int], namespace: str
) -> None:
    """The store goes away after the reservation, before the response: the renewal before
    a large response's first byte cannot be asked, and the response goes on (an unanswered
    renewal is not a newer attempt); nothing can be stored anyway."""
    server = EmbeddedRedis().start()
    try:
        with contextlib.ExitStack() as stack:
            client = _large_endpoint(
                stack, protocol, server.url, namespace, sizes, lambda _: server.stop(kill=True)
            )
            response = client.post("/charge", content=b"{}", headers=key_headers("k-down"))
    finally:
        server.close()
    assert (response.status_code, response.content) == (201, b"s" * sum(sizes))


def test_the_handler_learns_its_attempt_was_superseded_by_the_renewal_before_its_first_byte(
    redis_url: str, namespace: str, settler: Settler
) -> None:
    """Once the renewal asked before a large response's first byte found a newer attempt,
    the handler's ``attempt.lost`` is True (so ``attempt.check()`` between its chunks
    stops it), and its client gets the 409."""
    seen: list[bool] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        attempt = asgi_attempt(scope)
        _take_over(settler, attempt.operation_id)
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"s" * 5000, "more_body": True})
        seen.append(attempt.lost)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async_settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
    guarded = IdempotencyMiddleware(
        app, settler=async_settler, principal=principal_from_header, **OPTIONS
    )
    with serve(guarded, async_settler) as base, httpx.Client(base_url=base, timeout=30) as client:
        response = client.post("/charge", content=b"{}", headers=key_headers("k-lost"))
    assert problem_type(response) == "attempt-superseded"
    assert seen == [True]


@pytest.mark.parametrize("protocol", ["asgi", "wsgi"])
def test_a_superseded_attempts_unstored_answer_goes_out_as_it_was_sent(
    protocol: str, redis_url: str, namespace: str, settler: Settler
) -> None:
    """A status that is never stored (here a 503) goes out as the stale attempt sent it
    (under ASGI it streams from its first byte): it tells the client to retry, and the
    record stays the newer attempt's (docs/http-endpoints.md, "What is stored, what runs
    again")."""
    newer: list[Reserved] = []

    def supersede(operation: str) -> None:
        newer.append(_take_over(settler, operation))

    with contextlib.ExitStack() as stack:
        client = _large_endpoint(stack, protocol, redis_url, namespace, [10], supersede, 0, 503)
        response = client.post("/charge", content=b"{}", headers=key_headers("k-503"))
    assert (response.status_code, response.content) == (503, b"s" * 10)
    record = settler.get(operation_id("http", "k-503", "tenant:acme", "principal"))
    assert record is not None
    assert (record.state, record.generation) == (State.PENDING, newer[0].reservation.generation)


@pytest.mark.parametrize("protocol", ["asgi", "wsgi"])
def test_a_global_key_tells_another_principal_whether_it_guessed_the_request(
    protocol: str, redis_url: str, namespace: str
) -> None:
    """What docs/http-endpoints.md says of ``key_scope="global"`` (step 2), and why its keys
    must be unguessable: another principal never gets the stored response, but gets
    idempotency-key-bound for the first principal's exact request and
    idempotency-key-reused for any other (the request is compared first, SPEC 2)."""
    ledger = Ledger()
    with contextlib.ExitStack() as stack:
        if protocol == "asgi":
            async_settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
            app = starlette_app(async_settler, ledger, key_scope="global")
            base = stack.enter_context(serve(app, async_settler))
        else:
            settler = stack.enter_context(
                contextlib.closing(Settler.from_url(redis_url, namespace=namespace, shards=4))
            )
            base = stack.enter_context(serve_wsgi(wsgi_app(settler, ledger, key_scope="global")))
        client = stack.enter_context(httpx.Client(base_url=base, timeout=30))

        def pay(amount: int, principal: str) -> httpx.Response:
            headers = key_headers("order-42", principal)
            return client.post("/payments", json={"amount": amount}, headers=headers)

        first = pay(4200, "tenant:acme")
        right_guess = pay(4200, "tenant:evil")
        wrong_guess = pay(1, "tenant:evil")
    assert first.status_code == 201
    assert (right_guess.status_code, problem_type(right_guess)) == (422, "idempotency-key-bound")
    assert (wrong_guess.status_code, problem_type(wrong_guess)) == (422, "idempotency-key-reused")
    assert first.content not in (right_guess.content, wrong_guess.content)
    assert ledger.count("/payments") == 1
