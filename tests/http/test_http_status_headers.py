"""A replayed response keeps the headers its status cannot go without (RFC 9110), under real
servers (uvicorn for ASGI, the stdlib's WSGI server) on a real Redis.

SPEC 7 stores a finished response (2xx, 3xx but 304, 4xx but 408/409/429) and replays it
byte for byte. RFC 9110 makes some headers part of what a status means: a 401 MUST carry
``WWW-Authenticate`` (15.5.2), a 405 MUST carry ``Allow`` (15.5.6), a 206 MUST carry
``Content-Range`` (15.3.7), a 416 of a byte range SHOULD (15.5.17), and a redirect names
where to go with ``Location`` (15.4). The first response had them; the replay dropped each
one the replay allow-list did not name (all but ``Location``, and that one too under an
own list), so a retried POST to a GET-only route got a 405 with no ``Allow``, and a
retried request refused by the handler's bearer check got a 401 with no challenge: a
client library that follows challenges could no longer tell how to authenticate.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from settle import AsyncSettler, Settler
from settle.asgi import IdempotencyMiddleware
from settle.wsgi import IdempotencyMiddleware as WSGIMiddleware
from tests.http.apps import principal_from_environ, principal_from_header, serve, serve_wsgi

TENANT = {"X-Principal": "tenant:acme"}

#: path -> (status, the headers its status needs, as the handler sends them)
CASES: dict[str, tuple[int, list[tuple[str, str]]]] = {
    "/secure": (
        401,
        [
            ("WWW-Authenticate", 'Bearer realm="api", error="invalid_token"'),
            ("WWW-Authenticate", 'Basic realm="api"'),
        ],
    ),
    "/range": (416, [("Content-Range", "bytes */100")]),
    "/partial": (206, [("Content-Range", "bytes 0-9/100")]),
    "/receipt": (303, [("Location", "/receipts/rc_1")]),
    # The redirects that keep the method: a POST sent on to where the payment is taken.
    "/temporary": (307, [("Location", "/v2/payments")]),
    "/moved": (308, [("Location", "/v2/payments")]),
}


def _extra() -> list[tuple[str, str]]:
    """Headers that must never be replayed: another client's cookie, a per-response trace."""
    return [("Set-Cookie", f"session={uuid.uuid4().hex}"), ("X-Trace", uuid.uuid4().hex)]


def _asgi_app(calls: list[str]) -> Starlette:
    async def answer(request: Request) -> Response:
        await request.body()
        calls.append(request.url.path)
        status, needed = CASES[request.url.path]
        response = Response(f'{{"n":"{uuid.uuid4().hex}"}}', status, media_type="application/json")
        for name, value in [*needed, *_extra()]:
            response.raw_headers.append((name.lower().encode(), value.encode()))
        return response

    async def items(request: Request) -> Response:
        calls.append(request.url.path)
        return JSONResponse([])

    routes = [Route(path, answer, methods=["POST"]) for path in CASES]
    # A GET-only route: Starlette's router answers a POST with 405 and `Allow: GET, HEAD`.
    routes.append(Route("/items", items, methods=["GET"]))
    return Starlette(routes=routes)


def _wsgi_app(calls: list[str]) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        path = environ["PATH_INFO"]
        calls.append(path)
        if path == "/items":
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"), *_extra()])
            return [b"Method Not Allowed"]
        status, needed = CASES[path]
        headers = [("Content-Type", "application/json"), *needed, *_extra()]
        start_response(f"{status} Whatever", headers)
        return [f'{{"n":"{uuid.uuid4().hex}"}}'.encode()]

    return app


@contextlib.contextmanager
def _server(
    protocol: str, redis_url: str, namespace: str, calls: list[str], **options: Any
) -> Iterator[str]:
    if protocol == "asgi":
        settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
        app = _asgi_app(calls)
        middleware = Middleware(
            IdempotencyMiddleware, settler=settler, principal=principal_from_header, **options
        )
        app.user_middleware.insert(0, middleware)
        with serve(app, settler) as base:
            yield base
        return
    with Settler.from_url(redis_url, namespace=namespace, shards=4) as sync:
        guarded = WSGIMiddleware(
            _wsgi_app(calls), settler=sync, principal=principal_from_environ, **options
        )
        with serve_wsgi(guarded) as base:
            yield base


def _needed(path: str, response: httpx.Response) -> list[tuple[str, str]]:
    names = {"/items": "allow"}.get(path) or CASES[path][1][0][0].lower()
    return [(n, v) for n, v in response.headers.multi_items() if n == names]


@pytest.mark.parametrize("protocol", ["asgi", "wsgi"])
@pytest.mark.parametrize(
    "replay_headers", [None, ["content-type"]], ids=["default-allow-list", "own-allow-list"]
)
@pytest.mark.parametrize("path", ["/items", *CASES])
def test_a_replay_keeps_the_headers_its_status_needs(
    protocol: str, replay_headers: list[str] | None, path: str, redis_url: str, namespace: str
) -> None:
    calls: list[str] = []
    options = {} if replay_headers is None else {"replay_headers": replay_headers}
    headers = {**TENANT, "Idempotency-Key": f"k-{uuid.uuid4().hex}"}
    with (
        _server(protocol, redis_url, namespace, calls, **options) as base,
        httpx.Client(base_url=base, timeout=30) as client,
    ):
        first = client.post(path, content=b"{}", headers=headers)
        again = client.post(path, content=b"{}", headers=headers)
    # Ran once (Starlette's router answers the 405 itself, with no handler): the retry is a
    # replay.
    assert calls == ([] if (protocol, path) == ("asgi", "/items") else [path])
    assert again.headers.get("idempotent-replayed") == "true"
    assert again.status_code == first.status_code
    assert again.content == first.content
    needed = _needed(path, first)
    assert needed, f"the first {first.status_code} carries {dict(first.headers)}"
    assert _needed(path, again) == needed, dict(again.headers)
    # Only those: a cookie or a header nobody listed is still never replayed.
    assert "set-cookie" not in again.headers
    assert "x-trace" not in again.headers
