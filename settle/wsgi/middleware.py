"""``IdempotencyMiddleware`` for WSGI: carries out :class:`settle.http._rules.Guard` on a
PEP 3333 ``environ`` and ``start_response``.

The guarded app's response is collected (a generator body included, and the iterable's
``close()`` is called) before it is settled: a finished response is stored with
``complete`` and only then sent, as under ASGI. One that passes ``max_response_bytes`` is
collected no further: what is held is sent and the rest streams through as the app yields
it (:class:`~settle.http._sync.Streamed`), as under ASGI. Requests that are not guarded
pass through untouched, streaming included.
"""

from __future__ import annotations

import io
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from settle._input import is_decimal
from settle.http._sync import (
    NotReached,
    Raised,
    Streamed,
    Streaming,
    SyncGuard,
    do_nothing,
    status_line,
    write_traceback,
)
from settle.http.attempt import carrying, held_attempts
from settle.http.attempt import current_attempt as _current_attempt
from settle.http.policy import IdempotencyPolicy, PrincipalFn
from settle.http.problems import Response
from settle.http.request import BodyBuffer, RequestHead, RequestMalformed

if TYPE_CHECKING:
    from settle._sync.settler import Settler
    from settle.attempt import Attempt

__all__ = ["IdempotencyMiddleware", "WSGIApp", "current_attempt", "request_head"]

Environ = dict[str, Any]
ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]
StartResponse = Callable[..., Callable[[bytes], object]]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]
Reached = Callable[[Environ], bool]
#: When the framework caught the guarded handler's exception (``time.monotonic()``), if it did,
#: and the exception, if the framework said.
RaisedAt = Callable[[Environ], tuple[float, BaseException | None] | None]

_CHUNK = 64 << 10


class IdempotencyMiddleware:
    """Makes retried unsafe requests safe: one execution per key, the same response after.

    ``principal`` maps the WSGI ``environ`` to the authenticated principal (None: 401).
    The other options are :class:`settle.asgi.IdempotencyMiddleware`'s (``methods``,
    ``paths``, ``require_key``, ``key_scope``, ``lease``, ``max_request_bytes``, ...).
    ``timeout`` sets ``attempt.deadline``: a WSGI handler's thread cannot be stopped, and one
    that ends in error past it (``attempt.check()``'s ``TimeoutError``) gets the 504 ASGI
    answers at its timeout.
    """

    def __init__(
        self, app: WSGIApp, *, settler: Settler, principal: PrincipalFn, **options: Any
    ) -> None:
        policy = IdempotencyPolicy.configure(principal=principal, **options)
        self._bind(app, SyncGuard(settler, policy))

    @classmethod
    def from_guard(
        cls,
        app: WSGIApp,
        driver: SyncGuard,
        *,
        reached: Reached | None = None,
        raised: RaisedAt | None = None,
    ) -> IdempotencyMiddleware:
        """The middleware around ``app`` with an already configured driver (Flask's).

        ``reached`` tells from the environ, once the app answered, whether the guarded
        handler ran (a framework's view, where hooks and routing may answer before it):
        a response given without it is sent but never stored (:class:`NotReached`).
        ``raised`` tells whether (when) the framework caught the handler's exception, which
        its 5xx answers: the attempt is then settled as that exception (:class:`Raised`)."""
        middleware = cls.__new__(cls)
        middleware._bind(app, driver, reached, raised)
        return middleware

    def _bind(
        self,
        app: WSGIApp,
        driver: SyncGuard,
        reached: Reached | None = None,
        raised: RaisedAt | None = None,
    ) -> None:
        self.app = app
        self.settler = driver.settler
        self.policy = driver.policy
        self._driver = driver
        self._reached = reached
        self._raised = raised

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        exchange = _Exchange(self.app, self.policy.principal, environ, self._reached, self._raised)
        head = request_head(environ, self.policy.header)
        response = self._driver.handle(head, exchange, held_attempts(environ))
        if response is None:
            return self.app(environ, start_response)
        if isinstance(response, Streamed):
            start_response(exchange.status, exchange.headers)  # the handler's, as it sent it
            return response
        if response is exchange.response:
            start_response(exchange.status, exchange.headers)  # the handler's, as it sent it
        else:
            headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in response.headers]
            start_response(status_line(response.status), headers)
        return [response.body]


def request_head(
    environ: Mapping[str, Any],
    header: str = "Idempotency-Key",
    *,
    decoded: tuple[str, str] | None = None,
) -> RequestHead:
    """What the rules need of a WSGI request (Django's ``request.META`` is one too).

    ``decoded``: the mount prefix and the path inside the application as text, from a
    framework that decoded them itself (Django writes its decoded ``SCRIPT_NAME`` and
    ``PATH_INFO`` back into ``request.META``, so they are no longer PEP 3333's latin-1 code
    points of the bytes)."""
    key = environ.get("HTTP_" + header.upper().replace("-", "_"))
    length = environ.get("CONTENT_LENGTH")
    if decoded is None:
        # PEP 3333 gives the path as latin-1 code points of its bytes; ASGI decodes UTF-8.
        mount = _latin1(environ.get("SCRIPT_NAME", "")).decode("utf-8", "replace")
        route = _latin1(environ.get("PATH_INFO", "")).decode("utf-8", "replace")
    else:
        mount, route = decoded
    return RequestHead(
        method=environ["REQUEST_METHOD"],
        path=mount + route,
        route=route if mount else None,
        query=_latin1(environ.get("QUERY_STRING", "")),
        content_type=_latin1(environ.get("CONTENT_TYPE", "")),
        key_values=() if key is None else (_latin1(key),),
        content_length=_latin1(length) if length else None,
    )


def current_attempt(environ: Mapping[str, Any]) -> Attempt:
    """The :class:`~settle.Attempt` of a guarded request, from its WSGI environ
    (:class:`~settle.errors.NotGuarded`, a ``LookupError``, when the request is not
    guarded)."""
    return _current_attempt(environ, "environ['settle']")


def _latin1(value: str) -> bytes:
    """The bytes of a PEP 3333 native string (latin-1 code points of the bytes). A server or
    framework that handed over text outside latin-1 broke that rule: its UTF-8, rather than
    a 500 for a request settle may not even guard."""
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape")


class _Exchange:
    """One WSGI request for :class:`~settle.http._sync.SyncGuard`."""

    def __init__(
        self,
        app: WSGIApp,
        principal: PrincipalFn,
        environ: Environ,
        reached: Reached | None = None,
        raised: RaisedAt | None = None,
    ) -> None:
        self._app = app
        self._principal = principal
        self._environ = environ
        self._reached = reached
        self._raised = raised
        self.status = ""
        self.headers: list[tuple[str, str]] = []
        self.response: Response | None = None
        self.chosen: float | None = None

    def principal(self) -> object:
        return self._principal(self._environ)

    def body(self, buffer: BodyBuffer) -> bytes:
        stream = self._environ["wsgi.input"]
        length = (self._environ.get("CONTENT_LENGTH") or "").strip(" \t")  # RFC 9110 OWS
        if length:
            if not is_decimal(length):
                # A server that passes a header such as "abc" or "10, 10" through: the body
                # cannot be delimited, so nothing is read (RFC 9112 6.3: a 400).
                raise RequestMalformed(
                    f"CONTENT_LENGTH is {length[:40]!r}, not a number of bytes: the body "
                    "cannot be read; nothing was run"
                )
            remaining = int(length)
            while remaining > 0:
                chunk = stream.read(min(_CHUNK, remaining))
                if not chunk:
                    break  # the client stopped sending: buffer.complete() tells
                buffer.add(chunk)
                remaining -= len(chunk)
        elif self._environ.get("wsgi.input_terminated"):
            while chunk := stream.read(_CHUNK):
                buffer.add(chunk)
        body = buffer.complete()
        self._environ["wsgi.input"] = io.BytesIO(body)
        self._environ["CONTENT_LENGTH"] = str(len(body))
        return body

    def call(self, attempt: Attempt, limit: int) -> Response | Streaming:
        self._environ.update(carrying(self._environ, attempt))  # environ["settle"]: attempt
        chunks = _Parts()
        started = handed = False

        def start_response(
            status: str, headers: list[tuple[str, str]], exc_info: ExcInfo | None = None
        ) -> Callable[[bytes], object]:
            # Nothing is sent before the whole response is settled, so an error page may
            # always replace what was started (PEP 3333, exc_info), body included: what the
            # app wrote or yielded of the response it abandons is dropped, never stored and
            # replayed in front of the error page. Without exc_info a second call is the
            # app's error (PEP 3333: "a fatal error"), as every server treats it.
            nonlocal started
            if handed and exc_info is not None:
                # Part of the response is on its way (it streams): PEP 3333 has the error
                # raised on, and the server breaks the response off.
                raise exc_info[1].with_traceback(exc_info[2])
            if started and exc_info is None:
                raise RuntimeError(
                    "start_response was called a second time without exc_info (PEP 3333)"
                )
            if started:
                chunks.clear()
            started = True
            self.status, self.headers = status, list(headers)
            self.chosen = time.monotonic()  # the status the deadline is asked of
            return chunks.append

        result = self._app(self._environ, start_response)
        close = getattr(result, "close", None)
        try:
            rest = iter(result)
            for chunk in rest:  # one at a time: an error page may clear what came before
                chunks.append(chunk)
                if chunks.size > limit and self._streams():
                    # Over max_response_bytes, never stored. One that crossed the limit
                    # with its last part is settled before it is sent, as a stored one is;
                    # one with more to come is held no further: what is held goes out and
                    # the rest streams through (closed by the driver), as under ASGI.
                    following = next(rest, _END)
                    if following is _END:
                        break
                    assert isinstance(following, bytes)
                    chunks.append(following)
                    handed = True
                    # What the app passes to write() from here on joins the parts that go
                    # out, in order, never dropped (PEP 3333 allows write() and an iterable).
                    held = chunks.hand_over()
                    size, done = chunks.size, close or do_nothing
                    return Streaming(self._status(), self._headers(), held, size, rest, done)
        finally:
            if close is not None and not handed:
                close()
        if not self.status:
            raise RuntimeError("the WSGI app returned without calling start_response")
        self.response = Response(self._status(), self._headers(), b"".join(chunks.parts))
        if self._reached is not None and not self._reached(self._environ):
            raise NotReached(self.response)  # sent as it is, never stored
        raised = None if self._raised is None else self._raised(self._environ)
        if raised is not None and self.response.status >= 500:
            # the framework's 500 for the handler's exception
            raise Raised(self.response, *raised)
        return self.response

    def _status(self) -> int:
        return int(self.status.split(" ", 1)[0])

    def _headers(self) -> tuple[tuple[bytes, bytes], ...]:
        return tuple((n.encode("latin-1"), v.encode("latin-1")) for n, v in self.headers)

    def _streams(self) -> bool:
        """Whether a response over the limit may stream on: its status is chosen, the
        guarded handler gave it (not a hook or the router: :class:`NotReached`), and it is
        not a framework's 5xx for the handler's exception (:class:`Raised`). Those are
        collected whole, as before."""
        if not self.status:
            return False
        if self._reached is not None and not self._reached(self._environ):
            return False
        return self._raised is None or self._raised(self._environ) is None or self._status() < 500

    def report(self, error: BaseException) -> None:
        """The handler's ``error`` is answered with settle's 504 or 409, never raised to the
        server: its traceback goes to the server's error log all the same (PEP 3333's
        ``wsgi.errors``), so that a bug is seen."""
        write_traceback(self._environ.get("wsgi.errors"), error)


class _Parts:
    """The parts of a response collected so far, and their size in bytes; once the response
    streams (:meth:`hand_over`), the queue the parts go out from."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self._queue: deque[bytes] | None = None

    def append(self, chunk: bytes) -> None:
        """A part the app yielded, or passed to ``write()``."""
        if self._queue is not None:
            self._queue.append(chunk)  # it streams: sent after what came before it
            return
        self.parts.append(chunk)
        self.size += len(chunk)

    def hand_over(self) -> deque[bytes]:
        """The parts held so far, as the queue they go out from; what the app writes later
        is added to it."""
        self._queue = deque(self.parts)
        self.parts = []
        return self._queue

    def clear(self) -> None:
        self.parts.clear()
        self.size = 0


_END = object()
