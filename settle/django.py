"""Django integration: the ``Idempotency-Key`` middleware and a view decorator.

    # settings.py
    SETTLE = {"url": "redis://localhost:6379/0", "namespace": "payments", "paths": ["/payments"]}
    MIDDLEWARE = [..., "django.contrib.auth.middleware.AuthenticationMiddleware",
                  "settle.django.IdempotencyMiddleware", ...]

    # or per view (Django REST framework views too)
    from settle.django import idempotent
    urlpatterns = [path("refunds", idempotent(RefundView.as_view()))]

The rules are :mod:`settle.http`'s, carried out by the same sync driver as
:mod:`settle.wsgi`. The guarded view finds its :class:`~settle.Attempt` in
``request.settle``. Only this module imports Django. See ``docs/http-endpoints.md``.
"""

from __future__ import annotations

import contextlib
import functools
import io
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from asgiref.sync import async_to_sync, iscoroutinefunction
from django.conf import settings
from django.core.exceptions import BadRequest, PermissionDenied, SuspiciousOperation
from django.core.handlers.exception import response_for_exception
from django.core.handlers.wsgi import LimitedStream
from django.core.signals import got_request_exception, setting_changed
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    StreamingHttpResponse,
    UnreadablePostError,
)
from django.http.multipartparser import MultiPartParserError
from django.http.request import RawPostDataException
from django.middleware.csrf import CsrfViewMiddleware
from django.utils.module_loading import import_string

from settle._input import is_decimal
from settle._log import logger
from settle.attempt import Attempt
from settle.errors import ConfigurationError
from settle.http._sync import (
    NotReached,
    Raised,
    Streamed,
    Streaming,
    SyncGuard,
    configured_guard,
    write_traceback,
)
from settle.http.attempt import held_attempts
from settle.http.policy import PrincipalFn
from settle.http.problems import Response
from settle.http.request import BodyBuffer, ClientDisconnected, ParsedForm
from settle.wsgi.middleware import request_head

__all__ = ["IdempotencyMiddleware", "idempotent", "user_principal"]

View = TypeVar("View", bound=Callable[..., HttpResponseBase])
GetResponse = Callable[[HttpRequest], HttpResponseBase]

#: Bytes read from the body's stream at a time.
_CHUNK = 64 << 10

#: What Django itself answers with a 4xx wherever it escapes a view (its handler's
#: ``response_for_exception``): ``Http404``, ``PermissionDenied`` (403), ``BadRequest``,
#: ``MultiPartParserError`` and ``SuspiciousOperation`` (400; a body its own limits refuse,
#: ``DATA_UPLOAD_MAX_MEMORY_SIZE`` and the like, among them). Any other exception is its 500.
_DJANGO_4XX = (Http404, PermissionDenied, BadRequest, MultiPartParserError, SuspiciousOperation)


def user_principal(request: HttpRequest) -> str | None:
    """The default principal: ``user:<pk>`` of an authenticated ``request.user``, else None
    (401). Put ``settle.django.IdempotencyMiddleware`` after the authentication middleware."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    return f"user:{user.pk}"


class IdempotencyMiddleware:
    """Guards the configured methods and paths of a Django project (``settings.SETTLE``).

    ``SETTLE`` holds ``settler`` (a :class:`~settle.Settler` or its dotted path) or ``url``
    and ``namespace``; ``principal`` (a callable on the request or its dotted path; default
    :func:`user_principal`); and any option of :class:`settle.asgi.IdempotencyMiddleware`
    (``methods``, ``paths``, ``require_key``, ``key_scope``, ``lease``, ...).

    Put it after ``CsrfViewMiddleware`` and the authentication middleware: a response that
    another middleware gives before the view is reached (the CSRF check's 403, a 404 of
    URL resolution) is sent but never stored, so the same request sent again runs the view
    once what refused it is put right outside the request (the token in ``X-CSRFToken``);
    a changed request (the token added to the form body) is a 422, as always.
    """

    def __init__(self, get_response: GetResponse, **overrides: Any) -> None:
        self.get_response = get_response
        self._driver = _driver(overrides)
        _warn_if_before_csrf(type(self))

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        return _guarded(self._driver, request, self.get_response, reaching=True)

    def process_view(self, request: HttpRequest, *_: Any) -> None:
        """The view is about to run: every middleware before this one let it through."""
        request._settle_reached = True  # type: ignore[attr-defined]


#: The ``MIDDLEWARE`` lists already checked (and warned about) in this process: Django loads
#: the middleware anew for every handler (each test ``Client``, each ``WSGIHandler``), and an
#: operator needs the advice once per configuration, not once per load. Forgotten when
#: ``settings.MIDDLEWARE`` changes (``override_settings``).
_ORDER_CHECKED: set[tuple[object, ...]] = set()
_ORDER_CHECKED_LOCK = threading.Lock()


def _warn_if_before_csrf(guard: type) -> None:
    """Logs ``settle.django.middleware_order`` (WARNING) when ``settings.MIDDLEWARE`` puts
    this middleware before ``CsrfViewMiddleware`` (or a subclass of it): there the CSRF
    check's 403 comes after settle let the request through to the view, so it is stored as
    the key's answer and replayed, and the same request sent again with its token never
    reaches the view. Not refused: a project whose guarded views are all ``csrf_exempt``
    (REST framework's ``APIView`` is) loses nothing, and refusing it would stop it serving."""
    listed = list(getattr(settings, "MIDDLEWARE", None) or ())
    seen = (guard, *map(repr, listed))
    with _ORDER_CHECKED_LOCK:
        if seen in _ORDER_CHECKED:
            return
        _ORDER_CHECKED.add(seen)
    classes = [_middleware_class(path) for path in listed]
    mine = [i for i, cls in enumerate(classes) if cls is not None and issubclass(cls, guard)]
    csrf = [i for i, cls in enumerate(classes) if cls and issubclass(cls, CsrfViewMiddleware)]
    if mine and csrf and min(mine) < max(csrf):
        logger.warning(
            "settle.django.middleware_order",
            middleware=listed[min(mine)],
            before=listed[max(csrf)],
            advice="list settle.django.IdempotencyMiddleware after CsrfViewMiddleware: a CSRF "
            "403 given after settle's middleware is stored and replayed for the key",
        )


def _middleware_class(path: object) -> type | None:
    """The class a ``MIDDLEWARE`` entry names; None for a function-based middleware (a
    factory), an entry that is not a dotted path, or one that cannot be imported: the check
    is advice and never stops the project starting (Django itself reports a bad entry as it
    loads the middleware)."""
    if not isinstance(path, str):
        return None
    try:
        found = import_string(path)
    except Exception:  # noqa: BLE001  # Django raises it itself, as it imports the entry
        return None
    return found if isinstance(found, type) else None


def idempotent(view: View | None = None, **options: Any) -> Any:
    """Guard one view (``@idempotent`` or ``@idempotent(methods=["POST"], ...)``): the
    options of ``settings.SETTLE``, overridden by ``options``; every path of the view.

    Also a method decorator (``@method_decorator(idempotent)`` on a class-based view's
    ``post``, a REST framework ``APIView`` or ``ViewSet`` action). A view that the
    middleware guards too runs under the middleware's guard only, when both key the same
    operation (header, principal, ``key_scope``, ``operation_prefix``); a decorator that
    keys another reserves that one as well. Async views are refused: guard them with
    :class:`settle.asgi.IdempotencyMiddleware` under ASGI."""

    def decorate(view: View) -> View:
        if iscoroutinefunction(view) or getattr(view, "view_is_async", False):
            raise ConfigurationError(
                f"{getattr(view, '__qualname__', view)!r} is an async view: settle.django "
                "guards sync views; serve async views under ASGI with "
                "settle.asgi.IdempotencyMiddleware"
            )
        key = (_bound(view)[0], repr(sorted(options.items())))

        @functools.wraps(view)
        def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            driver = _view_guard(key, options)
            return _guarded(driver, request, _finalizing(view, args, kwargs))

        return guarded  # type: ignore[return-value]  # same signature as the view

    return decorate if view is None else decorate(view)


#: The decorated views' guards, built at their first request (settings are ready then) and
#: again after ``settings.SETTLE`` changes (``override_settings`` in tests).
_VIEW_GUARDS: dict[tuple[Any, str], SyncGuard] = {}
_VIEW_GUARDS_LOCK = threading.Lock()


#: More guards than any project has decorated views: a view wrapped anew on every request
#: by a decorator that does not say what it wraps (no ``__wrapped__``) would otherwise add
#: one per request. Past it the cache starts again (a guard is cheap to rebuild).
_VIEW_GUARDS_MAX = 1024


def _view_guard(key: tuple[Any, str], options: dict[str, Any]) -> SyncGuard:
    guard = _VIEW_GUARDS.get(key)
    if guard is None:
        with _VIEW_GUARDS_LOCK:
            guard = _VIEW_GUARDS.get(key)
            if guard is None:
                if len(_VIEW_GUARDS) >= _VIEW_GUARDS_MAX:
                    _VIEW_GUARDS.clear()
                guard = _VIEW_GUARDS[key] = _driver({**options, "paths": None})
    return guard


def _settings_changed(*, setting: str, **_: Any) -> None:
    if setting == "SETTLE":
        with _VIEW_GUARDS_LOCK:
            _VIEW_GUARDS.clear()
    elif setting == "MIDDLEWARE":
        with _ORDER_CHECKED_LOCK:
            _ORDER_CHECKED.clear()


setting_changed.connect(_settings_changed)


def _mark_raised(sender: object, request: HttpRequest | None = None, **_: Any) -> None:  # noqa: ARG001
    """Django's ``got_request_exception``: the 500 it answers is the view's exception
    (settled as ``exception``, as under ASGI and plain WSGI), not a status it chose. Sent
    before Django logs the exception and renders its 500: the deadline is asked of this."""
    if request is not None and getattr(request, "_settle_raised", None) is None:
        with contextlib.suppress(AttributeError):
            request._settle_raised = time.monotonic()  # type: ignore[attr-defined]
            # Sent from Django's except block: the exception it answers (its type is logged
            # if a 504 or a 409 replaces that 500; Django logs its traceback itself).
            request._settle_error = sys.exc_info()[1]  # type: ignore[attr-defined]


got_request_exception.connect(_mark_raised)


def _bound(view: Any) -> tuple[Any, Any]:
    """The function behind a view and, for a class-based view's handler method, its view
    instance. ``method_decorator`` hands each call a new partial of a bound method (under
    the wrappers of the decorators listed after this one, each pointing at the next by
    ``__wrapped__``); the bound method's function is the same every time."""
    seen = view
    for _ in range(64):  # a chain of wrappers, never a cycle in practice
        method = getattr(seen, "func", None)  # functools.partial
        instance = getattr(method, "__self__", None)
        if instance is not None:
            return getattr(method, "__func__", method), instance
        seen = getattr(seen, "__wrapped__", None)
        if seen is None:
            break
    return view, None


def _finalizing(view: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> GetResponse:
    """The decorated view's call. A REST framework view's handler method (decorated with
    ``method_decorator``) returns a ``Response`` the view finalizes only after the decorator
    returned: it is finalized here (its renderer chosen) so that it can be rendered and
    stored; the view's own finalizing then leaves it as it is. An exception Django answers
    with a 4xx (a 404, a 403, a body its limits refuse) gets Django's own answer, stored as
    under the middleware."""
    instance = _bound(view)[1]
    finalize = getattr(instance, "finalize_response", None)
    handle = getattr(instance, "handle_exception", None)

    def call(request: HttpRequest) -> HttpResponseBase:
        try:
            response: HttpResponseBase = view(request, *args, **kwargs)
        except _DJANGO_4XX as exc:
            # Django answers these with a 4xx wherever they escape, so the middleware's
            # get_response returns that 4xx and it is stored as any: the decorator asks
            # Django for the same answer, so that the view is not run again on every retry,
            # as after an exception (which Django answers with a 500). A REST framework
            # view answers Http404 and PermissionDenied itself (its JSON through its
            # renderer): the client gets, and the store keeps, that answer; it re-raises
            # what it does not handle, answered by Django then.
            answer = _drf_answer(handle, exc) if handle is not None else None
            if answer is None:
                django = request if isinstance(request, HttpRequest) else request._request
                answer = response_for_exception(django, exc)
            response = answer
        if finalize is not None and not hasattr(response, "accepted_renderer"):
            response = finalize(request, response, *args, **kwargs)
        return response

    return call


def _drf_answer(handle: Callable[[Exception], Any], exc: Exception) -> Any:
    """A REST framework view's own response to ``exc`` (its ``handle_exception``, as its
    ``dispatch`` would ask), or None when it does not handle ``exc`` (it re-raises it)."""
    try:
        return handle(exc)
    except _DJANGO_4XX as again:
        if again is not exc:
            raise
        return None


def _guarded(
    driver: SyncGuard, request: HttpRequest, get_response: GetResponse, *, reaching: bool = False
) -> HttpResponseBase:
    # The outer guards' attempts (settle.asgi.IdempotencyMiddleware around Django's
    # ASGIHandler, in its scope; settle.wsgi's around its WSGIHandler, in the environ that
    # is request.META; the middleware around a decorated view, in request.settle): the guard
    # passes the request through when one of them is of the operation it would reserve (a
    # second reservation would find it in progress and answer 409 forever).
    django = request if isinstance(request, HttpRequest) else request._request
    scope = getattr(django, "scope", None)  # Django's ASGIRequest
    held = held_attempts(scope if isinstance(scope, dict) else django.META)
    own = getattr(request, "settle", None)
    if isinstance(own, Attempt):
        held = (*held, own)
    elif held:
        # The view runs under it, in request.settle as under settle's own guard.
        request.settle = held[-1]  # type: ignore[attr-defined]
    exchange = _Exchange(request, get_response, driver.policy.principal, reaching=reaching)
    # Django decoded the path itself and wrote it back into META: hand it over as text (the
    # request as it came; request.path_info may have been rewritten by a middleware).
    meta = request.META
    decoded = (str(meta.get("SCRIPT_NAME", "")), str(meta.get("PATH_INFO", "")))
    head = request_head(meta, driver.policy.header, decoded=decoded)
    try:
        response = driver.handle(head, exchange, held)
        if response is not None:
            return exchange.sent(response)  # may raise: a stored header settle cannot send
    except BaseException:
        exchange.discard()
        raise
    return get_response(request)


def _driver(overrides: dict[str, Any]) -> SyncGuard:
    return configured_guard({**getattr(settings, "SETTLE", {}), **overrides}, user_principal)


def _form_of(request: HttpRequest, buffer: BodyBuffer) -> None:
    """The fingerprinted stand-in of a multipart body Django already parsed: every field
    and every file (name, file name, content type, content) in the order Django parsed
    them, each part length-prefixed so that no two different forms give the same bytes.
    The same request sent again gives the same bytes; a changed field or file does not.
    What Django's parsing drops is not seen: the order of fields across names (a form is a
    mapping of lists) and bytes of a field value that are not valid in its charset. The
    files are rewound for the view."""

    def part(*items: bytes) -> None:
        for item in items:
            buffer.add(b"%d:" % len(item))
            buffer.add(item)

    for name, values in request.POST.lists():
        for value in values:
            part(b"field", name.encode(), value.encode())
    for name, files in request.FILES.lists():
        for upload in files:
            part(
                b"file",
                name.encode(),
                (upload.name or "").encode(),
                (upload.content_type or "").encode(),
            )
            size = sum(len(chunk) for chunk in upload.chunks())  # not .size: may be None
            upload.seek(0)
            buffer.add(b"%d:" % size)
            for chunk in upload.chunks():
                buffer.add(chunk)
            upload.seek(0)


class _Exchange:
    """One Django request for :class:`~settle.http._sync.SyncGuard`."""

    def __init__(
        self,
        request: HttpRequest,
        get_response: GetResponse,
        principal: PrincipalFn,
        *,
        reaching: bool = False,
    ) -> None:
        self._request = request
        self._get_response = get_response
        self._principal = principal
        self._reaching = reaching  # the middleware: was the view reached?
        self.response: Response | None = None
        self.django: HttpResponseBase | None = None
        self.chosen: float | None = None

    def principal(self) -> object:
        return self._principal(self._request)

    def body(self, buffer: BodyBuffer) -> bytes:
        request = self._request
        # Django's own request (a REST framework Request wraps it) and its stream of the
        # body as the server handed it over.
        django = request if isinstance(request, HttpRequest) else request._request
        stream = getattr(django, "_stream", None)
        try:
            raw = _unread_body(django, stream, buffer)
        except RawPostDataException as exc:
            parsed = request.content_type == "multipart/form-data" and (
                # A form Django parsed: read as a stream first, or unparseable, it leaves
                # both empty, and two such bodies must not share one fingerprint.
                bool(getattr(request, "_post", None)) or bool(getattr(request, "_files", None))
            )
            if not parsed:
                # Read as a stream before settle (request.read(), a signature check): no
                # copy is left, and two different bodies must never share a fingerprint.
                raise ConfigurationError(
                    "the request body was read before settle could fingerprint it, and "
                    "Django keeps no copy: put settle.django.IdempotencyMiddleware before "
                    "the middleware that reads it, or read request.body there instead of "
                    "request.read()"
                ) from exc
            # Something parsed this multipart body before settle (CsrfViewMiddleware reads
            # request.POST for its token; so does REST framework's SessionAuthentication),
            # and Django keeps no multipart body once parsed: its parsed form stands for it.
            _refuse_cut(stream, request, None)  # the parser reads the stream to its end
            _form_of(request, buffer)
            # Compared as a form, without the boundary: the client makes a new one each
            # time it builds the body (a retry), and the bytes it framed are gone.
            return ParsedForm(buffer.body())
        _refuse_cut(stream, request, len(raw))
        return raw

    def call(self, attempt: Attempt, limit: int) -> Response | Streaming:
        self._request.settle = attempt  # type: ignore[attr-defined]
        # Kept at once: whatever happens from here on, the view's response is closed once
        # (:meth:`sent` or :meth:`discard`).
        response = self.django = self._get_response(self._request)
        self.chosen = time.monotonic()  # its status is chosen; a streamed body may run on
        render = getattr(response, "render", None)
        if render is not None and not getattr(response, "is_rendered", True):
            render()  # a TemplateResponse or DRF Response returned to a view decorator
        if isinstance(response, StreamingHttpResponse) and not response.is_async:
            streaming = self._streaming(response, limit)
            if streaming is not None:
                return streaming
            content = _collected(response)
        elif isinstance(response, StreamingHttpResponse):
            content = _collected(response)
        elif isinstance(response, HttpResponse):
            content = response.content
        else:
            raise ConfigurationError(
                f"a guarded view returned a {type(response).__name__}: return an HttpResponse "
                "or a StreamingHttpResponse, whose content settle can store and replay"
            )
        headers = tuple((n.encode("latin-1"), v.encode("latin-1")) for n, v in response.items())
        self.response = Response(response.status_code, headers, content)
        if self._reaching and not getattr(self._request, "_settle_reached", False):
            raise NotReached(self.response)
        django = self._request
        django = django if isinstance(django, HttpRequest) else django._request
        at = getattr(django, "_settle_raised", None)
        if self.response.status >= 500 and isinstance(at, float):
            # Django's 500 for the view's exception
            raise Raised(self.response, at, getattr(django, "_settle_error", None))
        return self.response

    def _streaming(self, response: StreamingHttpResponse, limit: int) -> Streaming | None:
        """A sync streaming response read up to ``limit`` bytes: a :class:`Streaming` of the
        rest when more follows (it streams on, never stored, as under ASGI), else None with
        what was read put back for :func:`_collected`. Not a response given without the
        view (:class:`NotReached`) nor Django's 500 for its exception (:class:`Raised`):
        those are collected whole."""
        parts: list[bytes] = []
        size = 0
        rest = iter(response.streaming_content)  # type: ignore[arg-type]
        for chunk in rest:
            parts.append(chunk)
            size += len(chunk)
            if size > limit and self._streams(response.status_code):
                # One that crossed the limit with its last part is settled before it is
                # sent, as a stored one is (and as the WSGI shell does): one part read ahead.
                following = next(rest, None)
                if following is None:
                    break
                parts.append(following)
                size += len(following)
                # The view's resources (its iterator's close()) are closed by the driver,
                # once; the server's close of the response then sends request_finished.
                closers = list(_closers(response))
                _closers(response).clear()
                headers = tuple(
                    (n.encode("latin-1"), v.encode("latin-1")) for n, v in response.items()
                )
                return Streaming(
                    response.status_code,
                    headers,
                    deque(parts),
                    size,
                    rest,
                    functools.partial(_run_all, closers),
                )
        response.streaming_content = parts
        return None

    def _streams(self, status: int) -> bool:
        if self._reaching and not getattr(self._request, "_settle_reached", False):
            return False
        django = self._request
        django = django if isinstance(django, HttpRequest) else django._request
        return status < 500 or not isinstance(getattr(django, "_settle_raised", None), float)

    def report(self, error: BaseException) -> None:
        """The handler's ``error`` is answered with settle's 504 or 409: its traceback goes to
        the server's error log (``wsgi.errors``), as under plain WSGI. Django logs an error
        of the view it catches (answered with its 500: :class:`Raised`), but never saw one
        that gets here: a streamed body's, raised as it is collected, or a
        ``TemplateResponse``'s, as it is rendered (raised on, it would have reached Django's
        handler around this middleware, which logs it), nor logged one it raised on under
        ``DEBUG_PROPAGATE_EXCEPTIONS`` (for the server to log)."""
        django = self._request
        django = django if isinstance(django, HttpRequest) else django._request
        write_traceback(django.META.get("wsgi.errors"), error)

    def sent(self, response: Response | Streamed) -> HttpResponseBase:
        """The Django response that goes out for ``response``: the view's own, as it made it
        (the server closes it), or settle's answer in its place (a superseded attempt's
        replay or 409), which takes over the view's resources: the server's one close of
        the answer releases them and sends ``request_finished`` once."""
        view = self.django
        if isinstance(response, Streamed):
            assert isinstance(view, StreamingHttpResponse)
            # Sent on as it streams; the server's close of the response closes it (Django
            # adds its close() to the response's closers).
            view.streaming_content = response
            return view
        if view is not None and response is self.response:
            return view
        answer = _to_django(response)
        if view is not None:
            self.django = None
            _closers(answer).extend(_closers(view))
            _closers(view).clear()
            view.closed = True
        return answer

    def discard(self) -> None:
        """An exception leaves settle after the view answered (its streaming body raised
        while it was collected, or its response cannot be stored): nothing else will send
        the view's response, so release its resources now (its files, its iterator's
        ``close()``; PEP 3333 asks that of whoever consumes it), once."""
        view, self.django = self.django, None
        if view is not None:
            _release(view)


def _collected(response: StreamingHttpResponse) -> bytes:
    """The whole body of a streaming response, put back as one chunk of the kind the view
    gave: an async iterator (collected through ``async_to_sync``, as Django collects one
    under WSGI) stays one, which Django's ASGI handler serves without its warning of a sync
    iterator; under WSGI Django consumes it as it would without settle."""
    if not response.is_async:
        content = b"".join(response.streaming_content)  # type: ignore[arg-type]
        response.streaming_content = [content]
        return content
    parts: list[bytes] = async_to_sync(_parts)(response.streaming_content)  # type: ignore[arg-type]
    content = b"".join(parts)
    response.streaming_content = _once(content)
    return content


async def _parts(chunks: AsyncIterator[bytes]) -> list[bytes]:
    return [chunk async for chunk in chunks]


async def _once(content: bytes) -> AsyncIterator[bytes]:
    yield content


def _unread_body(request: HttpRequest, stream: Any, buffer: BodyBuffer) -> bytes:
    """The body, read into ``buffer`` (under ``max_request_bytes``), and the request left
    as if it had not been read: the view's ``request.body``, ``request.POST`` and
    ``request.FILES`` read it from a copy as Django reads it, with Django's own limits
    (``DATA_UPLOAD_MAX_MEMORY_SIZE`` on ``request.body`` and on a form's fields, never on
    its files; the numbers of fields and files). ``request.body`` would apply the first of
    those to the whole body, an upload's files included, before the view could say
    otherwise. A body Django has read already (``request.body``) is that copy;
    :class:`RawPostDataException` if it was read as a stream or parsed, with no copy left.
    """
    if hasattr(request, "_body"):
        raw: bytes = request._body
        buffer.add(raw)
        return buffer.body()
    if getattr(request, "_read_started", False) or stream is None:
        raise RawPostDataException(
            "You cannot access body after reading from request's data stream"
        )
    try:
        while chunk := stream.read(_CHUNK):
            buffer.add(chunk)
    except OSError as exc:  # as Django's request.body: a 400, nothing reserved
        raise UnreadablePostError(*exc.args) from exc
    raw = buffer.body()
    # Not closed: the server's stream (Django 4.2's has no close(); an ASGI body file is
    # closed by Django's handler when the request ends).
    request._stream = io.BytesIO(raw)
    return raw


def _run_all(closers: list[Callable[[], object]]) -> None:
    for closer in closers:
        with contextlib.suppress(Exception):  # as HttpResponseBase.close() does
            closer()


def _release(response: HttpResponseBase) -> None:
    """What ``HttpResponseBase.close()`` does, without sending ``request_finished``: the
    request is not over (the exception goes on through the view's middlewares and
    Django's error handling). That signal ends it: ``close_old_connections`` closes the
    database connection (a ``TestCase``'s, or the one an error handler under
    ``ATOMIC_REQUESTS`` still uses) and ``reset_urlconf`` drops a per-request URLconf.
    Django's handler sends it once, when the server closes the response that goes out."""
    for closer in _closers(response):
        with contextlib.suppress(Exception):  # as HttpResponseBase.close() does
            closer()
    _closers(response).clear()
    response.closed = True


def _closers(response: HttpResponseBase) -> list[Callable[[], object]]:
    """What ``close()`` releases: a streaming body's or a file's ``close``, each added by
    Django as the response took it (not in Django's type stubs)."""
    closers: list[Callable[[], object]] = response._resource_closers  # type: ignore[attr-defined]
    return closers


def _refuse_cut(stream: object, request: HttpRequest, got: int | None) -> None:
    """:class:`ClientDisconnected` if the body stopped short of its ``CONTENT_LENGTH``:
    gunicorn and wsgiref end ``wsgi.input`` where a client stopped sending or left, and
    Django reads what arrived as the whole body (its multipart parser too, without
    complaint), so the view must never run on it. Django's own stream of the body tells:
    whoever reads the body through it (``request.body``, the multipart parser) reads it to
    its end when it is whole. A stream something replaced before settle (it read
    ``request.body``: the CSRF check on a urlencoded form) says nothing of the wire; then
    the body read (``got`` bytes) is compared with the declared length, unless the request
    declares a ``Content-Encoding`` (a middleware may have set ``request._body`` to the
    body decoded, of another length)."""
    if isinstance(stream, LimitedStream):
        limit = getattr(stream, "limit", 0)
        remaining = getattr(stream, "remaining", None)  # Django 4.2
        if remaining is None:
            remaining = limit - getattr(stream, "_pos", limit)  # Django 5
        sent = limit - remaining
    else:
        declared = str(request.META.get("CONTENT_LENGTH") or "").strip()
        encoded = str(request.META.get("HTTP_CONTENT_ENCODING") or "identity").strip()
        if got is None or not is_decimal(declared) or encoded.lower() != "identity":
            return
        limit, sent = int(declared), got
    if sent < limit:
        raise ClientDisconnected(
            f"the client sent {sent} of its {limit} body bytes and went away: nothing was "
            "run. It may retry with the same key."
        )


def _to_django(response: Response) -> HttpResponse:
    out = HttpResponse(response.body, status=response.status)
    del out["Content-Type"]  # only the stored headers, as they were
    for name, value in response.headers:
        out[name.decode("latin-1")] = value.decode("latin-1")
    return out
