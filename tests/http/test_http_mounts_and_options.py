"""The guard where an application is mounted or configured the short way, under real servers
(uvicorn, with and without --root-path, a Starlette Mount; the stdlib WSGI server) on a real
Redis: each case once ran the handler again on a retry (a second charge) or broke a replay.
Written from SPEC section 7, RFC 9110 and the peers' documented behaviour."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from typing import Any
from wsgiref.util import setup_testing_defaults

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from settle import AsyncSettler, Settler
from settle.asgi import IdempotencyMiddleware
from settle.http.policy import IdempotencyPolicy
from settle.wsgi import IdempotencyMiddleware as WSGIMiddleware
from tests.http.apps import principal_from_environ, principal_from_header, serve, serve_wsgi


@pytest.fixture
def sync_settler(redis_url: str, namespace: str) -> Iterator[Settler]:
    """The sync settler of a WSGI case, closed after it (its sockets are not left to GC)."""
    with Settler.from_url(redis_url, namespace=namespace, shards=4) as settler:
        yield settler


TENANT = {"X-Principal": "tenant:acme"}


def _charge_app(calls: list[str]) -> Starlette:
    """A bare payments app: every call of the handler is one charge."""

    async def charge(request: Request) -> Response:
        await request.body()
        calls.append(request.url.path)
        return Response(f'{{"charge":"ch_{uuid.uuid4().hex}"}}', 201, media_type="application/json")

    async def nothing(request: Request) -> Response:
        await request.body()
        calls.append(request.url.path)
        return Response(status_code=204)

    return Starlette(
        routes=[
            Route("/payments", charge, methods=["POST"]),
            Route("/ack", nothing, methods=["POST"]),
        ]
    )


def _wsgi_charge_app(calls: list[str]) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        calls.append(environ["PATH_INFO"])
        if environ["PATH_INFO"] == "/ack":
            start_response("204 No Content", [])
            return []
        body = f'{{"charge":"ch_{uuid.uuid4().hex}"}}'.encode()
        start_response("201 Created", [("Content-Type", "application/json")])
        return [body]

    return app


# -- 1. paths= under a mount / root_path: the guard silently switches off --------------------


@pytest.mark.parametrize("pattern", ["/payments", "/v1/payments"])
def test_asgi_paths_still_guard_an_app_mounted_under_a_prefix(
    redis_url: str, namespace: str, pattern: str
) -> None:
    """SPEC 7: "Applies to configured methods/paths". A sub-application mounted at /v1 is
    guarded by a pattern naming its own route (/payments, as its routing reads it) or the
    whole path (/v1/payments)."""
    calls: list[str] = []
    settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
    v1 = _charge_app(calls)
    v1.user_middleware.insert(  # = v1.add_middleware(...)
        0,
        Middleware(
            IdempotencyMiddleware,
            settler=settler,
            principal=principal_from_header,
            paths=[pattern],
        ),
    )
    app = Starlette(routes=[Mount("/v1", app=v1)])
    headers = {**TENANT, "Idempotency-Key": "mounted-1"}
    with serve(app, settler) as base, httpx.Client(base_url=base, timeout=30) as client:
        first = client.post("/v1/payments", json={"amount": 100}, headers=headers)
        again = client.post("/v1/payments", json={"amount": 100}, headers=headers)
        missing = client.post("/v1/payments", json={"amount": 100}, headers=TENANT)
    assert first.status_code == 201
    assert again.headers.get("idempotent-replayed") == "true", "the retry charged again"
    assert again.content == first.content
    assert missing.status_code == 400  # a guarded path needs a key
    assert len(calls) == 1


def test_asgi_paths_still_guard_behind_uvicorn_root_path(redis_url: str, namespace: str) -> None:
    """The same app served by `uvicorn --root-path /api` (a proxy strips /api): uvicorn puts
    the root path into scope["path"] (ASGI), Starlette routes on the rest. The guard on
    paths=["/payments"] must not silently stop applying."""
    calls: list[str] = []
    settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
    app = _charge_app(calls)
    app.user_middleware.insert(
        0,
        Middleware(
            IdempotencyMiddleware,
            settler=settler,
            principal=principal_from_header,
            paths=["/payments"],
        ),
    )
    headers = {**TENANT, "Idempotency-Key": "root-path-1"}
    with (
        serve(app, settler, root_path="/api") as base,
        httpx.Client(base_url=base, timeout=30) as client,
    ):
        first = client.post("/payments", json={"amount": 100}, headers=headers)
        again = client.post("/payments", json={"amount": 100}, headers=headers)
    assert first.status_code == 201
    assert again.headers.get("idempotent-replayed") == "true", "the retry charged again"
    assert len(calls) == 1


# -- 2. methods="POST" (one string, as paths= accepts) switches the guard off ---------------


@pytest.mark.parametrize("protocol", ["asgi", "wsgi"])
def test_methods_given_as_one_string_guards_that_method(
    protocol: str, redis_url: str, namespace: str, sync_settler: Settler
) -> None:
    """paths= and require_key= accept one plain string; methods="POST" was read as the
    methods {"P","O","S","T"}: no request was guarded and every retry charged again."""
    calls: list[str] = []
    if protocol == "asgi":
        settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
        app: Any = _charge_app(calls)
        app.user_middleware.insert(
            0,
            Middleware(
                IdempotencyMiddleware,
                settler=settler,
                principal=principal_from_header,
                methods="POST",
            ),
        )
        server = serve(app, settler)
    else:
        sync = sync_settler
        app = WSGIMiddleware(
            _wsgi_charge_app(calls),
            settler=sync,
            principal=principal_from_environ,
            methods="POST",
        )
        server = serve_wsgi(app)
    headers = {**TENANT, "Idempotency-Key": "m-1"}
    with server as base, httpx.Client(base_url=base, timeout=30) as client:
        first = client.post("/payments", json={"amount": 100}, headers=headers)
        again = client.post("/payments", json={"amount": 100}, headers=headers)
    assert first.status_code == 201
    assert again.headers.get("idempotent-replayed") == "true", "the retry charged again"
    assert len(calls) == 1


# -- 3. a replayed 204 carries Content-Length (RFC 9110 8.6: MUST NOT) -----------------------


@pytest.mark.parametrize("protocol", ["asgi"])  # wsgiref adds Content-Length: 0 itself
def test_a_replayed_204_has_the_first_responses_headers(
    protocol: str, redis_url: str, namespace: str, sync_settler: Settler
) -> None:
    """SPEC 7: replayed byte for byte (status, allow-listed headers, body). RFC 9110 8.6:
    a server MUST NOT send Content-Length in a 204. The first 204 has none; the replay
    adds `content-length: 0`."""
    calls: list[str] = []
    if protocol == "asgi":
        settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
        app: Any = _charge_app(calls)
        app.user_middleware.insert(
            0, Middleware(IdempotencyMiddleware, settler=settler, principal=principal_from_header)
        )
        server = serve(app, settler)
    else:
        sync = sync_settler
        server = serve_wsgi(
            WSGIMiddleware(_wsgi_charge_app(calls), settler=sync, principal=principal_from_environ)
        )
    headers = {**TENANT, "Idempotency-Key": "ack-1"}
    with server as base, httpx.Client(base_url=base, timeout=30) as client:
        first = client.post("/ack", headers=headers)
        again = client.post("/ack", headers=headers)
    assert first.status_code == again.status_code == 204
    assert again.headers.get("idempotent-replayed") == "true"
    assert len(calls) == 1
    assert "content-length" not in first.headers
    assert "content-length" not in again.headers, dict(again.headers)


# -- 4. WSGI: two Idempotency-Key headers can be accepted as one key -------------------------


def test_wsgi_two_key_headers_are_malformed(sync_settler: Settler) -> None:
    """docs/http-endpoints.md (What the middleware does, 1): "Malformed (... two headers
    ...): 400" (the ASGI shell checks it, tests/http/test_http_starlette.py two-headers).
    A PEP 3333 server joins repeated headers with a comma, so under WSGI two headers that
    join into one valid sf-string are taken as one key."""
    calls: list[str] = []
    sync = sync_settler
    app = WSGIMiddleware(_wsgi_charge_app(calls), settler=sync, principal=principal_from_environ)
    headers = [
        (b"x-principal", b"tenant:acme"),
        (b"idempotency-key", b'"order-1'),
        (b"idempotency-key", b'retry"'),
    ]
    with serve_wsgi(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        response = client.post("/payments", json={"amount": 1}, headers=headers)
    assert response.status_code == 400, (response.status_code, calls)
    assert calls == []


def test_one_string_is_one_method_or_header_in_every_way_to_configure() -> None:
    policy = IdempotencyPolicy.configure(
        principal=lambda _: "p", methods="put", replay_headers="Location"
    )
    assert policy.methods == frozenset({"PUT"})
    assert policy.replay_headers == frozenset({"location"})
    direct = IdempotencyPolicy(principal=lambda _: "p", methods="POST")  # type: ignore[arg-type]
    assert direct.methods == frozenset({"POST"})


def _sub(name: str, calls: list[str], settler: AsyncSettler) -> Starlette:
    async def create(request: Request) -> JSONResponse:
        await request.body()
        calls.append(name)
        return JSONResponse({"created": name}, status_code=201)

    app = Starlette(routes=[Route("/create", create, methods=["POST"])])
    app.user_middleware.insert(
        0, Middleware(IdempotencyMiddleware, settler=settler, principal=principal_from_header)
    )
    return app


def test_two_mounted_apps_do_not_share_a_stored_response(redis_url: str, namespace: str) -> None:
    calls: list[str] = []
    settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
    app = Starlette(
        routes=[
            Mount("/payments", app=_sub("payment", calls, settler)),
            Mount("/refunds", app=_sub("refund", calls, settler)),
        ]
    )
    headers = {"X-Principal": "tenant:acme", "Idempotency-Key": "k-1"}
    body: dict[str, Any] = {"order": "o-1", "amount": 100}
    with serve(app, settler) as base, httpx.Client(base_url=base, timeout=30) as client:
        pay = client.post("/payments/create", json=body, headers=headers)
        refund = client.post("/refunds/create", json=body, headers=headers)
    assert pay.status_code == 201
    assert pay.json() == {"created": "payment"}
    # The fingerprint covers the whole path: another mounted app's request is another
    # request (422), never the first one's stored response.
    assert refund.headers.get("idempotent-replayed") != "true", (refund.json(), calls)
    assert refund.status_code == 422
    assert calls == ["payment"]


def test_wsgi_under_a_script_name_guards_its_routes_and_keeps_mounts_apart(
    sync_settler: Settler,
) -> None:
    """WSGI: ``paths`` match PATH_INFO (or the whole path); the fingerprint covers
    SCRIPT_NAME + PATH_INFO, so two applications mounted apart never share a response."""
    calls: list[str] = []
    sync = sync_settler
    app = WSGIMiddleware(
        _wsgi_charge_app(calls), settler=sync, principal=principal_from_environ, paths="/payments"
    )

    def call(script_name: str) -> tuple[str, dict[str, str]]:
        environ: dict[str, Any] = {
            "REQUEST_METHOD": "POST",
            "SCRIPT_NAME": script_name,
            "PATH_INFO": "/payments",
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": "2",
            "HTTP_X_PRINCIPAL": "tenant:acme",
            "HTTP_IDEMPOTENCY_KEY": "w-1",
        }
        setup_testing_defaults(environ)
        environ["wsgi.input"] = io.BytesIO(b"{}")
        seen: dict[str, Any] = {}

        def start_response(status: str, headers: list[tuple[str, str]]) -> None:
            seen["status"], seen["headers"] = status, dict(headers)

        b"".join(app(environ, start_response))
        return seen["status"], {k.lower(): v for k, v in seen["headers"].items()}

    first = call("/v1")
    again = call("/v1")
    other = call("/v2")
    assert first[0].startswith("201")
    assert again[1].get("idempotent-replayed") == "true"
    assert other[0].startswith("422")
    assert calls == ["/payments"]


# -- 5. a guard inside a guard: the inner one found the key in progress, forever -------------


def test_a_guarded_app_mounted_under_a_guarded_app_runs_its_handler_once(
    redis_url: str, namespace: str
) -> None:
    """A guarded sub-application mounted in a guarded application (a package that ships
    its routes with the middleware, under a project that guards every route): the outer
    guard holds the key, so the inner one passes the request through under the outer's
    attempt, as settle.django's decorator does under its middleware. It reserved the same
    key, found it in progress and answered 409 to every attempt: nothing could be paid."""
    calls: list[str] = []
    settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
    app = Starlette(
        routes=[Mount("/v1", app=_sub("payment", calls, settler))],
        middleware=[
            Middleware(IdempotencyMiddleware, settler=settler, principal=principal_from_header)
        ],
    )
    headers = {**TENANT, "Idempotency-Key": "nested-1"}
    with serve(app, settler) as base, httpx.Client(base_url=base, timeout=30) as client:
        first = client.post("/v1/create", json={"amount": 100}, headers=headers)
        again = client.post("/v1/create", json={"amount": 100}, headers=headers)
        changed = client.post("/v1/create", json={"amount": 999}, headers=headers)
    assert (first.status_code, first.json()) == (201, {"created": "payment"}), first.text
    assert "idempotent-replayed" not in first.headers
    assert (again.status_code, again.content) == (201, first.content)
    assert again.headers["idempotent-replayed"] == "true"
    assert changed.status_code == 422  # still guarded: by the outer guard
    assert calls == ["payment"]


def test_a_wsgi_guard_inside_a_wsgi_guard_runs_the_app_once(sync_settler: Settler) -> None:
    """WSGI: the same, for one middleware wrapped in another (a guarded sub-application
    dispatched to by a guarded project)."""
    calls: list[str] = []
    inner = WSGIMiddleware(
        _wsgi_charge_app(calls), settler=sync_settler, principal=principal_from_environ
    )
    app = WSGIMiddleware(inner, settler=sync_settler, principal=principal_from_environ)
    headers = {**TENANT, "Idempotency-Key": "nested-w-1"}
    with serve_wsgi(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        first = client.post("/payments", json={"amount": 100}, headers=headers)
        again = client.post("/payments", json={"amount": 100}, headers=headers)
    assert first.status_code == 201, first.text
    assert "idempotent-replayed" not in first.headers
    assert (again.status_code, again.content) == (201, first.content)
    assert again.headers["idempotent-replayed"] == "true"
    assert calls == ["/payments"]


def test_an_inner_guard_of_another_operation_still_guards_it(
    redis_url: str, namespace: str
) -> None:
    """The pass-through is for the operation the outer guard holds, and no other. A refunds
    sub-application guards its refunds by its own header (``X-Refund-Key``) under a project
    that guards every POST by ``Idempotency-Key`` when one is sent (a client SDK sends a
    fresh one on every call). The application retries the refund as a new call: a new
    ``Idempotency-Key``, the same refund key. The inner guard passed every request the outer
    one held through, whatever its own key: it reserved nothing, and the retry refunded
    again."""
    calls: list[str] = []
    settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)

    async def refund(request: Request) -> JSONResponse:
        await request.body()
        calls.append("refund")
        return JSONResponse({"refund": uuid.uuid4().hex}, status_code=201)

    refunds = Starlette(routes=[Route("/create", refund, methods=["POST"])])
    refunds.user_middleware.insert(
        0,
        Middleware(
            IdempotencyMiddleware,
            settler=settler,
            principal=principal_from_header,
            header="X-Refund-Key",
        ),
    )
    app = Starlette(
        routes=[Mount("/refunds", app=refunds)],
        middleware=[
            Middleware(
                IdempotencyMiddleware,
                settler=settler,
                principal=principal_from_header,
                require_key=False,
            )
        ],
    )
    with serve(app, settler) as base:
        _sent_twice_as_new_calls(base, "/refunds/create", "X-Refund-Key")
    assert calls == ["refund"]


def _sent_twice_as_new_calls(base: str, path: str, own_header: str) -> None:
    """The same request twice: the inner guard's key the same, the outer's new each time.
    The second is the first's response, replayed."""
    with httpx.Client(base_url=base, timeout=30) as client:
        first, again = (
            client.post(
                path,
                json={"amount": 100},
                headers={**TENANT, own_header: "own-1", "Idempotency-Key": sdk_key},
            )
            for sdk_key in ("sdk-1", "sdk-2")
        )
    assert first.status_code == 201, first.text
    assert (again.status_code, again.content) == (201, first.content)
    assert again.headers["idempotent-replayed"] == "true"


def test_a_wsgi_inner_guard_of_another_operation_still_guards_it(sync_settler: Settler) -> None:
    """WSGI: the same, for one middleware wrapped in another with its own header."""
    calls: list[str] = []
    inner = WSGIMiddleware(
        _wsgi_charge_app(calls),
        settler=sync_settler,
        principal=principal_from_environ,
        header="X-Charge-Key",
    )
    app = WSGIMiddleware(
        inner, settler=sync_settler, principal=principal_from_environ, require_key=False
    )
    with serve_wsgi(app) as base:
        _sent_twice_as_new_calls(base, "/payments", "X-Charge-Key")
    assert calls == ["/payments"]


def test_a_wsgi_guard_under_two_guards_passes_through_the_outer_ones_operation(
    sync_settler: Settler,
) -> None:
    """Three guards: the outer and the innermost key the same operation (the
    ``Idempotency-Key``), the middle one its own (``X-Charge-Key``), so that the environ
    holds the middle one's attempt when the innermost looks. The innermost saw only that
    one, reserved the outer guard's operation again, found it in progress and answered 409
    to every request: it passes through any outer guard's operation now."""
    calls: list[str] = []
    innermost = WSGIMiddleware(
        _wsgi_charge_app(calls), settler=sync_settler, principal=principal_from_environ
    )
    middle = WSGIMiddleware(
        innermost,
        settler=sync_settler,
        principal=principal_from_environ,
        header="X-Charge-Key",
    )
    app = WSGIMiddleware(middle, settler=sync_settler, principal=principal_from_environ)
    with serve_wsgi(app) as base:
        _run_once_under_three_guards(base, "/payments")
    assert calls == ["/payments"]


def test_an_asgi_guard_under_two_guards_passes_through_the_outer_ones_operation(
    redis_url: str, namespace: str
) -> None:
    """ASGI: the same, for three guarded applications mounted one in another; the middle
    one keys its own operation, and its attempt is the one in ``scope["settle"]``."""
    calls: list[str] = []
    settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)

    def guarded(app: Any, **options: Any) -> Any:
        return IdempotencyMiddleware(
            app, settler=settler, principal=principal_from_header, **options
        )

    innermost = guarded(_charge_app(calls))
    middle = Starlette(routes=[Mount("/m", app=guarded(innermost, header="X-Charge-Key"))])
    app = guarded(Starlette(routes=[Mount("/v1", app=middle)]))
    with serve(app, settler) as base:
        _run_once_under_three_guards(base, "/v1/m/payments")
    assert calls == ["/v1/m/payments"]


def _run_once_under_three_guards(base: str, path: str) -> None:
    """The same request twice, with both keys: the first is answered (never 409), the
    second is its response replayed."""
    sent = {**TENANT, "Idempotency-Key": "outer-1", "X-Charge-Key": "middle-1"}
    with httpx.Client(base_url=base, timeout=30) as client:
        first, again = (client.post(path, json={"amount": 1}, headers=sent) for _ in "12")
    assert first.status_code == 201, first.text
    assert (again.status_code, again.content) == (201, first.content)
    assert again.headers["idempotent-replayed"] == "true"
