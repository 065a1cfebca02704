"""Real apps, a real server and a side-effect ledger for the middleware tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socketserver
import threading
import time
import uuid
import wsgiref.simple_server
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from settle import AsyncSettler, Settler
from settle.asgi import IdempotencyMiddleware, current_attempt
from settle.embedded import free_port
from settle.wsgi import IdempotencyMiddleware as WSGIMiddleware
from settle.wsgi import current_attempt as wsgi_current_attempt

PRINCIPAL_HEADER = b"x-principal"

MakeClient = Callable[..., httpx.AsyncClient]


def key_headers(key: str | None, principal: str | None = "tenant:acme") -> dict[str, str]:
    headers = {}
    if key is not None:
        headers["Idempotency-Key"] = key
    if principal is not None:
        headers["X-Principal"] = principal
    return headers


def post_scope(key: bytes) -> dict[str, Any]:
    """The ASGI scope of a ``POST /pay`` with the idempotency key ``key``, for a test that
    calls the middleware itself, without a server."""
    return {
        "type": "http",
        "method": "POST",
        "path": "/pay",
        "query_string": b"",
        "headers": [(b"idempotency-key", key)],
    }


def principal_from_header(scope: Any) -> str | None:
    """Test stand-in for authentication: the principal named by ``X-Principal``."""
    for name, value in scope["headers"]:
        if name == PRINCIPAL_HEADER:
            return str(value.decode("latin-1"))
    return None


class Ledger:
    """Every side effect a handler performed (thread-safe: uvicorn serves from a thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.effects: list[dict[str, Any]] = []
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.cancelled: list[int] = []

    def record(self, path: str, **fields: Any) -> int:
        with self._lock:
            self.effects.append({"path": path, **fields})
            return sum(1 for e in self.effects if e["path"] == path)

    def count(self, path: str | None = None) -> int:
        with self._lock:
            return sum(1 for e in self.effects if path is None or e["path"] == path)

    def generations(self, path: str) -> list[int]:
        with self._lock:
            return [e["generation"] for e in self.effects if e["path"] == path]


def starlette_app(settler: AsyncSettler, ledger: Ledger, **options: Any) -> Starlette:
    """A payments-style Starlette app guarded by the middleware."""

    async def payments(request: Request) -> Response:
        attempt = current_attempt(request.scope)
        data = await request.json()
        ledger.record("/payments", generation=attempt.generation, amount=data.get("amount"))
        payment_id = uuid.uuid4().hex
        return JSONResponse(
            {"id": payment_id, "amount": data.get("amount"), "generation": attempt.generation},
            status_code=201,
            headers={
                "location": f"/payments/{payment_id}",
                "set-cookie": f"session={uuid.uuid4().hex}",
                "x-trace": uuid.uuid4().hex,
            },
        )

    async def echo(request: Request) -> Response:
        attempt = current_attempt(request.scope)
        body = await request.body()
        ledger.record("/echo", generation=attempt.generation, size=len(body))
        media = request.headers.get("content-type", "application/octet-stream")
        return Response(body + uuid.uuid4().hex.encode(), media_type=media)

    async def flaky(request: Request) -> Response:
        attempt = current_attempt(request.scope)
        n = ledger.record("/flaky", generation=attempt.generation)
        if n == 1:
            return JSONResponse({"error": "database unavailable"}, status_code=500)
        return JSONResponse({"id": uuid.uuid4().hex, "run": n}, status_code=201)

    async def boom(request: Request) -> Response:
        attempt = current_attempt(request.scope)
        n = ledger.record("/boom", generation=attempt.generation)
        if n == 1:
            raise RuntimeError("handler crashed after its side effect")
        return JSONResponse({"id": uuid.uuid4().hex, "run": n}, status_code=201)

    async def status(request: Request) -> Response:
        attempt = current_attempt(request.scope)
        code = int(request.path_params["code"])
        ledger.record(f"/status/{code}", generation=attempt.generation)
        return JSONResponse({"status": code, "nonce": uuid.uuid4().hex}, status_code=code)

    async def checkout(request: Request) -> Response:
        """Post/Redirect/Get: charge, then 303 to the receipt."""
        attempt = current_attempt(request.scope)
        ledger.record("/checkout", generation=attempt.generation)
        return Response(status_code=303, headers={"location": f"/receipts/{uuid.uuid4().hex}"})

    async def stream(request: Request) -> Response:
        attempt = current_attempt(request.scope)
        size = int(request.query_params["size"])
        ledger.record("/stream", generation=attempt.generation)
        nonce = uuid.uuid4().hex.encode()

        async def chunks() -> AsyncIterator[bytes]:
            yield nonce
            sent = 0
            while sent < size:
                part = min(8192, size - sent)
                yield b"x" * part
                sent += part

        return StreamingResponse(chunks(), media_type="application/octet-stream")

    async def gated(request: Request) -> Response:
        """The first attempt holds until the test opens the gate (or it is cancelled)."""
        attempt = current_attempt(request.scope)
        ledger.entered.set()
        try:
            # The gate is a threading.Event: the test opens it from outside uvicorn's loop.
            while attempt.number == 1 and not ledger.gate.is_set():  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            ledger.cancelled.append(attempt.generation)
            raise
        ledger.record("/gated", generation=attempt.generation)
        return JSONResponse({"id": uuid.uuid4().hex, "generation": attempt.generation}, 201)

    async def with_background(request: Request) -> Response:
        attempt = current_attempt(request.scope)
        ledger.record("/background", generation=attempt.generation)

        async def after_response() -> None:
            ledger.record("/background:task", generation=attempt.generation)
            raise RuntimeError("background task failed after the response was sent")

        task = BackgroundTask(after_response)
        return JSONResponse({"id": uuid.uuid4().hex}, status_code=201, background=task)

    async def unguarded(request: Request) -> Response:
        ledger.record("/open", guarded="settle" in request.scope)
        return JSONResponse({"guarded": "settle" in request.scope})

    routes = [
        Route("/payments", payments, methods=["POST"]),
        Route("/echo", echo, methods=["POST", "PATCH"]),
        Route("/flaky", flaky, methods=["POST"]),
        Route("/boom", boom, methods=["POST"]),
        Route("/status/{code:int}", status, methods=["POST"]),
        Route("/stream", stream, methods=["POST"]),
        Route("/checkout", checkout, methods=["POST"]),
        Route("/gated", gated, methods=["POST"]),
        Route("/background", with_background, methods=["POST"]),
        Route("/open", unguarded, methods=["GET", "POST", "PUT"]),
    ]
    options.setdefault("principal", principal_from_header)
    middleware = [Middleware(IdempotencyMiddleware, settler=settler, **options)]
    return Starlette(routes=routes, middleware=middleware)


@contextlib.contextmanager
def serve(app: Any, settler: AsyncSettler, root_path: str = "") -> Iterator[str]:
    """Run ``app`` under a real uvicorn server on a free loopback port, in a thread.

    ``settler`` is used from the server's event loop only, and closed there at shutdown.
    ``root_path``: uvicorn's ``--root-path`` (an application behind a proxy that strips it).
    """

    async def with_lifespan(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await settler.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    port = free_port()
    config = uvicorn.Config(
        with_lifespan,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        access_log=False,
        root_path=root_path,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    try:
        while not server.started and thread.is_alive():
            time.sleep(0.01)
        if not server.started:
            raise RuntimeError("uvicorn did not start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def wsgi_app(settler: Settler, ledger: Ledger, **options: Any) -> WSGIMiddleware:
    """The payments-style routes of :func:`starlette_app` as a bare PEP 3333 app."""

    def respond(
        start_response: Any, status: str, body: bytes, headers: list[tuple[str, str]]
    ) -> list[bytes]:
        start_response(status, [("Content-Length", str(len(body))), *headers])
        return [body]

    def json_response(start_response: Any, status: str, data: Any, *extra: Any) -> list[bytes]:
        body = json.dumps(data).encode()
        return respond(start_response, status, body, [("Content-Type", "application/json"), *extra])

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        path = environ["PATH_INFO"]
        if path == "/open":
            ledger.record("/open", guarded="settle" in environ)
            return json_response(start_response, "200 OK", {"guarded": "settle" in environ})
        attempt = wsgi_current_attempt(environ)
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        if path == "/payments":
            data = json.loads(body)
            ledger.record("/payments", generation=attempt.generation, amount=data.get("amount"))
            payment_id = uuid.uuid4().hex
            return json_response(
                start_response,
                "201 Created",
                {"id": payment_id, "amount": data.get("amount"), "generation": attempt.generation},
                ("Location", f"/payments/{payment_id}"),
                ("Set-Cookie", f"session={uuid.uuid4().hex}"),
                ("X-Trace", uuid.uuid4().hex),
            )
        if path == "/flaky":
            n = ledger.record("/flaky", generation=attempt.generation)
            if n == 1:
                return json_response(start_response, "500 Internal Server Error", {"error": "db"})
            return json_response(start_response, "201 Created", {"id": uuid.uuid4().hex, "run": n})
        if path == "/boom":
            n = ledger.record("/boom", generation=attempt.generation)
            if n == 1:
                raise RuntimeError("handler crashed after its side effect")
            return json_response(start_response, "201 Created", {"id": uuid.uuid4().hex, "run": n})
        if path == "/gated":
            ledger.entered.set()
            while attempt.number == 1 and not ledger.gate.is_set():
                time.sleep(0.01)
            ledger.record("/gated", generation=attempt.generation)
            data = {"id": uuid.uuid4().hex, "generation": attempt.generation}
            return json_response(start_response, "201 Created", data)
        if path == "/checkout":  # Post/Redirect/Get: charge, then 303 to the receipt
            ledger.record("/checkout", generation=attempt.generation)
            receipt = f"/receipts/{uuid.uuid4().hex}"
            return respond(start_response, "303 See Other", b"", [("Location", receipt)])
        if path == "/stream":
            size = int(environ["QUERY_STRING"].removeprefix("size="))
            ledger.record("/stream", generation=attempt.generation)
            start_response("200 OK", [("Content-Type", "application/octet-stream")])
            return _chunks(uuid.uuid4().hex.encode(), size)  # a generator: collected whole
        return respond(start_response, "404 Not Found", b"", [])

    options.setdefault("principal", principal_from_environ)
    return WSGIMiddleware(app, settler=settler, **options)


def _chunks(nonce: bytes, size: int) -> Iterator[bytes]:
    yield nonce
    yield from (b"x" * min(8192, size - start) for start in range(0, size, 8192))


def principal_from_environ(environ: dict[str, Any]) -> str | None:
    """The WSGI twin of :func:`principal_from_header`."""
    value = environ.get("HTTP_X_PRINCIPAL")
    return None if value is None else str(value)


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, wsgiref.simple_server.WSGIServer):
    daemon_threads = True


class _QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass


@contextlib.contextmanager
def serve_wsgi(app: Any) -> Iterator[str]:
    """Run a WSGI ``app`` under the stdlib's threading WSGI server on a loopback port."""
    server = wsgiref.simple_server.make_server(
        "127.0.0.1", 0, app, server_class=_ThreadingWSGIServer, handler_class=_QuietHandler
    )
    thread = threading.Thread(target=server.serve_forever, name="wsgiref", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
