"""The quarantine console as an ASGI app: :func:`create_app` (docs/console.md).

Pages: the overview (records by state, quarantine by kind, a chart over time), the
quarantine list (filters, cursor paging across every shard), one entry (presented tuple
beside the current record, payload, attempt log, record), resolve, JSON lines export, and
the sign-in form. Reading needs nothing; resolving needs a principal that ``authorize``
granted at sign-in, and a CSRF token.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import secrets
import unicodedata
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlencode

import click
from jinja2 import Environment, PackageLoader, StrictUndefined
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from settle._async.settler import AsyncSettler
from settle._core.codec import UndecodableEntry
from settle._core.engine import MAX_NOTE_CHARS
from settle._core.keys import check_operation_id
from settle._input import has_control, is_decimal
from settle._log import binding_digest, logger
from settle.cli._context import REDIS_TIMEOUT  # one default for redis_timeout and the CLI
from settle.cli._params import SINCE, Ago, since_on
from settle.cli._render import entry_json, json_line, listed_json, record_json
from settle.errors import (
    BackendError,
    ConfigurationError,
    DurabilityError,
    InvalidInput,
    QuarantineNotFound,
    SettleError,
)
from settle.models import OperationRecord, QuarantineKind, State
from settle.web import _query
from settle.web._policy import Banner, EvictionBanner
from settle.web._security import (
    Authorize,
    SecurityHeaders,
    Sessions,
    SignedIn,
    add_security_headers,
    check_principal,
    csrf_ok,
    csrf_token,
    deadline,
    principal_of,
    resolved_by,
    restarting,
    sign_in,
    signed_in,
    timed_out,
)
from settle.web._sentinel import FollowingPrimary, behind_sentinel
from settle.web._text import (
    PayloadView,
    chart_svg,
    payload_view,
    shell_word,
    visible,
    visible_text,
    when,
)

__all__ = [
    "LOOPBACK_HOSTS",
    "REDIS_TIMEOUT",
    "check_allowed_hosts",
    "check_redis_timeout",
    "create_app",
]

#: Any note the engine accepts fits: 4 096 characters of up to 4 bytes of UTF-8, each byte
#: 3 characters urlencoded (48 KiB), and the CSRF token.
_FORM_LIMIT = 64 * 1024
_PAGE_SIZES = (10, 25, 50, 100, 200)
_STATUSES = ("all", "unresolved", "resolved")
#: The other entries of an operation an entry page lists (newest first; it links to the rest).
_RELATED = 20
#: A page's banner where the settler does not allow eviction (or nothing read it yet).
_NO_BANNER = Banner([], [])


def _console_key(secret_key: str, namespace: str) -> str:
    """The key that signs this console's sessions: derived from ``secret_key`` and the
    namespace, so that a session signed in on one console is not a session of another
    mounted with the same key (it would resolve there under a principal that console
    never granted)."""
    message = b"settle-console-session:" + namespace.encode("utf-8")
    return hmac.new(secret_key.encode("utf-8"), message, hashlib.sha256).hexdigest()


def _console_cookie(namespace: str) -> str:
    """The session cookie's name, one per namespace, so that signing in on one console does
    not overwrite (sign out of) another's session in the same browser."""
    return "settle_console_" + hashlib.sha256(namespace.encode("utf-8")).hexdigest()[:12]


def create_app(
    settler: AsyncSettler,
    *,
    authorize: Authorize | None = None,
    secret_key: str | None = None,
    https_only: bool = False,
    allowed_hosts: list[str] | None = None,
    session_max_age: int = 8 * 3600,
    record_limit: int = 10_000,
    overview_limit: int = 10_000,
    redis_timeout: float = REDIS_TIMEOUT,
) -> Starlette:
    """The console for ``settler``'s namespace, to serve or mount (``app.mount("/settle",
    create_app(settler))``).

    ``authorize`` receives the token typed in the sign-in form and returns the principal
    it grants (recorded in every resolution note) or None; without it the console is
    read-only. ``secret_key`` signs the session cookie (a random one per process by
    default: sessions then end with the process); ``https_only`` marks the cookie Secure.
    ``allowed_hosts`` are the Host header values served (default: localhost, 127.0.0.1 and
    ::1); any other is refused with 400, so a page on a domain that rebinds to a loopback
    address cannot read the console (DNS rebinding). Mounted in a service, pass the
    service's host names, or ``["*"]`` to leave the check to the service.
    The overview reads at most ``record_limit`` records and ``overview_limit`` quarantine
    entries, and says so when it stopped there. ``redis_timeout`` bounds the Redis calls
    of one request, in seconds (all of them together): a Redis that does not answer in
    time (paused, overloaded, cut off) gets a 503 page saying so, not a page that waits
    out the client's socket timeout and its retries. The settler stays the caller's to
    close.
    """
    if not isinstance(settler, AsyncSettler):
        # A sync Settler (or anything else) was taken here, and every page then answered
        # 500 "The console failed (TypeError)": the console awaits its calls.
        raise InvalidInput(
            "create_app needs an AsyncSettler (the console awaits its Redis calls), got "
            f"{type(settler).__name__}: AsyncSettler.from_url(...) opens one on the same Redis"
        )
    if authorize is not None and not callable(authorize):
        # authorize=5 was taken, and every sign-in answered 500.
        raise InvalidInput(
            "authorize must be a callable taking the sign-in token and returning the "
            f"principal it grants or None, got {type(authorize).__name__}"
        )
    if secret_key is not None and not isinstance(secret_key, str):
        # bytes (as a key file is read) ended here with an AttributeError.
        raise InvalidInput(
            "secret_key must be a str (it signs the session cookie), got "
            f"{type(secret_key).__name__}: decode a bytes key, or pass None for a random one"
        )
    if secret_key == "":
        # An empty key (an unset variable read as "") was taken as "no key", and each
        # process signed with a random one: sessions ended with every restart and did not
        # pass between the workers of one service.
        raise InvalidInput(
            "secret_key must not be empty (it signs the session cookie; every worker and "
            "restart of the console needs the same one): pass a random string, or None "
            "for a random key per process"
        )
    if not isinstance(https_only, bool):
        # "no" (an environment variable) was taken as True, "" as False.
        raise InvalidInput(f"https_only must be True or False, got {type(https_only).__name__}")
    if (
        isinstance(session_max_age, bool)
        or not isinstance(session_max_age, int)
        or session_max_age <= 0
    ):
        # 0 or less was taken here, and every sign-in failed later with a 503 that named
        # no option (Redis refuses the session's expiry).
        raise InvalidInput(
            "session_max_age must be a whole number of seconds above 0 (how long a sign-in "
            f"lasts), got {session_max_age!r}"
        )
    # Checked here, not at the first overview: "100" was a bare 500 there (a str compared
    # with an int), 0 a 400 that blamed the reader's filter.
    _check_limit("record_limit", record_limit, None)
    _check_limit("overview_limit", overview_limit, _query._LIST_MAX)
    check_redis_timeout(redis_timeout)
    hosts = check_allowed_hosts(allowed_hosts or list(LOOPBACK_HOSTS))
    sessions = Sessions(settler, session_max_age) if authorize is not None else None
    console = _Console(settler, authorize, sessions, record_limit, overview_limit, redis_timeout)
    namespace = settler.config.namespace
    bounded = console.bounded
    routes = [
        Route("/", bounded(console.overview), name="overview"),
        Route("/quarantine", bounded(console.listing), name="quarantine"),
        Route("/quarantine.jsonl", bounded(console.export), name="export"),
        Route("/entry/{shard:int}/{entry_id}", bounded(console.entry), name="entry"),
        Route(
            "/entry/{shard:int}/{entry_id}/resolve",
            bounded(console.resolve),
            methods=["POST"],
            name="resolve",
        ),
        Route("/signin", bounded(console.sign_in), methods=["GET", "POST"], name="signin"),
        Route("/signout", bounded(console.sign_out), methods=["POST"], name="signout"),
        Mount("/static", StaticFiles(packages=[("settle.web", "static")]), name="static"),
    ]
    middleware = [
        # Outermost: the 400 of a Host the console does not serve carries the headers too.
        Middleware(SecurityHeaders),
        # No www_redirect: a name not served is a 400, never a redirect to one that is.
        Middleware(TrustedHostMiddleware, allowed_hosts=hosts, www_redirect=False),
        Middleware(
            SessionMiddleware,
            secret_key=_console_key(secret_key or secrets.token_urlsafe(32), namespace),
            session_cookie=_console_cookie(namespace),
            max_age=session_max_age,
            same_site="lax",
            https_only=https_only,
        ),
        Middleware(SignedIn, sessions=sessions, redis_timeout=redis_timeout),
    ]
    if behind_sentinel(settler):
        # Before the sign-in's check, which reads Redis; after the Host check.
        middleware.insert(-1, Middleware(FollowingPrimary, settler=settler, timeout=redis_timeout))
    return Starlette(
        routes=routes,
        middleware=middleware,
        # Exception: the page of a fault settle did not foresee (the service's own
        # authorize failing); Starlette's was a bare text without the headers.
        exception_handlers={SettleError: console.failed, Exception: console.crashed},
    )


def _check_limit(name: str, value: object, most: int | None) -> None:
    """:class:`InvalidInput` naming ``name`` unless ``value`` is a whole number from 1 (to
    ``most``, when given)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < 1
        or (most is not None and value > most)
    ):
        bound = f"from 1 to {most}" if most is not None else "above 0"
        raise InvalidInput(
            f"{name} must be a whole number {bound} (how many the overview reads at most), "
            f"got {value!r}"
        )


def check_redis_timeout(seconds: object) -> float:
    """``seconds`` when it is a number of seconds above 0 and at most 300, else
    :class:`InvalidInput` naming ``redis_timeout``."""
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not 0 < seconds <= 300  # NaN fails too
    ):
        raise InvalidInput(
            "redis_timeout must be a number of seconds above 0 and at most 300 (how long "
            f"one console request waits for Redis), got {seconds!r}"
        )
    return float(seconds)


#: The Host header values a console serves by default: loopback only.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]", "::1")


async def _unused(scope: Any, receive: Any, send: Any) -> None:
    """The app a :class:`TrustedHostMiddleware` is built around only to check its hosts."""


def _host_header(host: str) -> str:
    """``host`` as a ``Host`` header names it: an IPv6 address in brackets, as browsers
    send it and Starlette compares it (``[2001:db8::1]``); any other name as it is."""
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


def check_allowed_hosts(hosts: object) -> list[str]:
    """``hosts`` when Starlette's ``TrustedHostMiddleware`` takes each of them, an IPv6
    address written in brackets (:func:`_host_header`), else :class:`InvalidInput` naming
    the first it refuses. Starlette builds the middleware at the first request: a pattern
    it refuses (``a*b``, ``*example.com``) made a console that answered every request with
    500; an IPv6 address without brackets one that answered 400 at that address."""
    if not isinstance(hosts, list | tuple) or not all(isinstance(h, str) for h in hosts):
        raise InvalidInput("allowed_hosts must be a list of str (Host header values)")
    for host in hosts:
        try:
            TrustedHostMiddleware(_unused, allowed_hosts=[host])
        except AssertionError:
            raise InvalidInput(
                "allowed_hosts must be host names, '*.' and a domain (any of its "
                f"subdomains), or '*' (any host); {host!r} is none of them"
            ) from None
    return [_host_header(host) for host in hosts]


_ENV = Environment(
    loader=PackageLoader("settle.web", "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
# shell_word: an operation id in a command the reader pastes into a shell.
_ENV.filters.update(visible=visible, visible_text=visible_text, when=when, shell_word=shell_word)
# An entry this settle version cannot decode, listed as a marked row (docs/console.md).
_ENV.tests["undecodable"] = lambda entry: isinstance(entry, UndecodableEntry)


class _Console:
    """The request handlers, sharing the settler and the access settings."""

    def __init__(
        self,
        settler: AsyncSettler,
        authorize: Authorize | None,
        sessions: Sessions | None,
        record_limit: int,
        overview_limit: int,
        redis_timeout: float,
    ) -> None:
        self.redis_timeout = float(redis_timeout)
        self.settler = settler
        self.authorize = authorize
        self.sessions = sessions
        self.record_limit = record_limit
        self.overview_limit = overview_limit
        #: An evicting policy the settler was let read (allow_eviction), named on each page
        self.banner = (
            EvictionBanner(settler, self.redis_timeout) if settler.config.allow_eviction else None
        )

    # -- rendering -------------------------------------------------------------------

    def render(
        self, request: Request, template: str, status_code: int = 200, **context: Any
    ) -> HTMLResponse:
        root = _root(request)
        principal = principal_of(request)
        html = _ENV.get_template(template).render(
            href=lambda path: root + path,
            namespace=self.settler.config.namespace,
            principal=principal,
            can_sign_in=self.authorize is not None,
            can_resolve=self.authorize is not None and principal is not None,
            # Why no resolution note can name whom authorize granted ("" when one can): the
            # resolve form is replaced by what to fix (a POST is refused with 400 saying so).
            unfit_principal=principal is not None and _unfit(principal),
            # A read-only console sets no cookie at all.
            csrf=csrf_token(request) if self.authorize is not None else "",
            path=_path(request),
            here=_here(request),
            # An evicting maxmemory-policy the settler was let read (allow_eviction): said
            # on every page, as doctor fails it; and the primaries whose policy could not
            # be read (INFO denied), where the evidence may be evicted without a word.
            evicting=getattr(request.state, "banner", _NO_BANNER).evicting,
            policy_unread=getattr(request.state, "banner", _NO_BANNER).unread,
            **context,
        )
        return HTMLResponse(html, status_code=status_code)

    def refuse(self, request: Request, status: int, reason: str, message: str) -> HTMLResponse:
        logger.warning("settle.web.refused", reason=reason, status=status)
        return self.render(request, "error.html", status, status=status, message=message)

    async def failed(self, request: Request, exc: Exception) -> Response:
        if isinstance(exc, QuarantineNotFound):
            status = 404
        elif isinstance(exc, InvalidInput):
            status = 400
        elif isinstance(exc, BackendError | ConfigurationError | DurabilityError):
            # Redis unreachable, the namespace does not fit, or too few replicas
            # acknowledged a write (min_replicas): the service cannot serve this now, and
            # the page says which; a 500 would read as a fault of the console itself.
            status = 503
        else:
            status = 500
        logger.warning("settle.web.failed", error=type(exc).__name__, status=status)
        return self.render(request, "error.html", status, status=status, message=str(exc))

    async def crashed(self, request: Request, exc: Exception) -> Response:
        """The error page of an exception settle does not raise. Starlette sends it from
        its outermost middleware, outside :class:`SecurityHeaders` and the session's:
        the headers are added here, and the page names the exception's type only (its
        text may hold what a user typed); the server's log has the traceback."""
        logger.warning("settle.web.failed", error=type(exc).__name__, status=500)
        message = (
            f"The console failed ({type(exc).__name__}) and could not answer this request; "
            "the server's log has the details. Reload to see what stands."
        )
        try:
            response: Response = self.render(
                request, "error.html", 500, status=500, message=message
            )
        except Exception:  # noqa: BLE001 - the page of a failure must not fail
            response = HTMLResponse(f"<!doctype html><title>500</title><p>{message}</p>", 500)
        return add_security_headers(response)

    def bounded(
        self, endpoint: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """``endpoint`` with its Redis calls bounded by the request's deadline
        (:func:`deadline`, shared with the sign-in check): past it, the 503 page of
        :meth:`timed_out`, at once, rather than the client's socket timeout (about 120 s
        with its retries, after the browser gave up)."""

        async def run(request: Request) -> Response:
            bound = asyncio.timeout_at(deadline(request.scope, self.redis_timeout))
            request.state.bound = bound  # the sign-in lifts it while authorize runs
            try:
                async with bound:
                    with restarting(bound, self.redis_timeout):
                        if self.banner is not None:
                            request.state.banner = await self.banner.banner()
                        return await endpoint(request)
            except TimeoutError:
                if not bound.expired():
                    raise
                return self.timed_out(request)

        return run

    def timed_out(self, request: Request) -> HTMLResponse:
        """The 503 page of a request whose Redis calls did not answer in time. A resolve
        whose write was sent may have been applied: its outcome is unknown, not failed."""
        unknown = bool(getattr(request.state, "resolving", False))
        logger.warning(
            "settle.web.redis_timeout", seconds=self.redis_timeout, outcome_unknown=unknown
        )
        waited = f"Redis did not answer within {self.redis_timeout:g} s"
        signing_out = request.method == "POST" and _path(request).endswith("/signout")
        signing_in = request.method == "POST" and _path(request).endswith("/signin")
        if unknown:
            message = (
                f"{waited}, so the outcome of this resolve is unknown: it may have been "
                "applied. Reload the entry to see; resolving again with the same note is "
                "safe (a note already on record stands)."
            )
        elif signing_out:
            message = f"{waited}: the sign-out is not confirmed. Sign out again in a moment."
        elif signing_in:  # its session may have been written: not "nothing changed"
            message = f"{waited}: the sign-in is not confirmed. Sign in again in a moment."
        elif request.method == "POST":
            message = f"{waited}; nothing was changed. Retry in a moment."
        else:
            message = f"{waited} (it may be paused, overloaded or cut off). Reload in a moment."
        return self.render(
            request, "error.html", 503, status=503, message=message, sign_out_again=signing_out
        )

    # -- pages -----------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        window = _query_params(request).get("window", "24h")
        if window not in _query.WINDOWS:
            raise InvalidInput(f"window must be one of {', '.join(_query.WINDOWS)}")
        data = await _query.overview(
            self.settler,
            window=window,
            now=await _query.server_now(self.settler),
            record_limit=self.record_limit,
            entry_limit=self.overview_limit,
        )
        return self.render(
            request,
            "overview.html",
            data=data,
            window=window,
            windows=list(_query.WINDOWS),
            states=[s.value for s in State],
            chart=chart_svg(data.buckets),
            since_param=data.since.isoformat(),
        )

    async def listing(self, request: Request) -> Response:
        q = _query_params(request)
        flt, form = await _filter(q, self.settler)
        size = _size(q)
        after = q.get("after") or None
        result = await _query.page(self.settler, flt, after=after, size=size)
        if not result.entries:  # an empty list is "all clear" only if the namespace exists
            await _query.check_namespace(self.settler)
        next_href = None
        if result.next is not None:
            # A duration ago ("since=6s") is pinned to the instant this page resolved it to:
            # counted again on the next page, the window would move under the reader.
            pinned = _pinned(form, flt)
            next_href = _query_string(pinned, size=str(size), after=result.next)
        return self.render(
            request,
            "quarantine.html",
            page=result,
            form=form,
            size=size,
            sizes=_PAGE_SIZES,
            kinds=[k.value for k in QuarantineKind],
            statuses=_STATUSES,
            first_page=after is None,
            first_href=_query_string(form, size=str(size)),
            next_href=next_href,
            export_href=_query_string(form),
        )

    async def export(self, request: Request) -> Response:
        flt, _ = await _filter(_query_params(request), self.settler)
        entries = aiter(_query.export_entries(self.settler, flt))
        # Read the first entry before the response starts, so that an error on the first
        # page (Redis down, an entry settle cannot decode) is an error page, not a 200
        # whose download breaks off.
        first = await anext(entries, None)
        if first is None:  # an empty export is "all clear" only if the namespace exists
            await _query.check_namespace(self.settler)

        async def lines() -> AsyncIterator[str]:
            count = 0
            if first is not None:
                count += 1
                yield json_line(listed_json(first)) + "\n"
            while True:
                # Each later read bounded anew (the request's deadline is for its first
                # page): a Redis that stops answering ends the download early, as any
                # failure there does, rather than hold it open for minutes.
                try:
                    async with asyncio.timeout(self.redis_timeout):
                        entry = await anext(entries, None)
                except TimeoutError:
                    logger.warning(
                        "settle.web.redis_timeout",
                        seconds=self.redis_timeout,
                        outcome_unknown=False,
                    )
                    raise timed_out(self.redis_timeout) from None
                if entry is None:
                    break
                count += 1
                yield json_line(listed_json(entry)) + "\n"
            logger.info("settle.web.exported", entries=count)

        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")  # UTC, as every time shown
        name = f"quarantine-{stamp}.jsonl"
        return StreamingResponse(
            lines(),
            media_type="application/x-ndjson",
            headers={"content-disposition": f'attachment; filename="{name}"'},
        )

    async def _entry(self, ref: str) -> _query.Listed:
        """The entry ``ref``, or the mark of one this version cannot decode."""
        core = self.settler._core
        calls = core.plan_quarantine_lookup(ref)
        raws = await self.settler.quarantine._run_many(calls)
        try:
            return core.decode_quarantine_lookup_or_mark(ref, calls, raws)
        except QuarantineNotFound:
            await _query.check_namespace(self.settler)  # lost with its namespace: said so
            raise

    async def entry(self, request: Request) -> Response:
        ref = _ref(request)
        entry = await self._entry(ref)
        if isinstance(entry, UndecodableEntry):
            # What could be read of it, and no resolve form (docs/console.md: a resolved
            # entry is what a routine trim deletes, and nobody could read this evidence).
            return self.render(request, "undecodable.html", entry=entry)
        record, attempts, others = None, [], []
        # An id settle refuses today (a line break, a bidi override, too long: written by
        # an earlier version or another program) has no record, attempt log or filter
        # settle can read; asked for them, the page was a 400 blaming the reader, and the
        # entry could be neither seen nor resolved (the CLI shows it).
        readable = _readable_id(entry.operation_id)
        if readable:
            record = await self.settler.get(entry.operation_id)
            attempts = await self.settler.attempts(entry.operation_id)
            # One more than shown besides this entry: whether there are more to link to.
            # Marking: another entry of the operation that settle cannot decode made this
            # readable entry's page a 500.
            planned = self.settler._core.quarantine_query(
                operation_id=entry.operation_id, limit=_RELATED + 2
            )
            related = await self.settler.quarantine._listed(planned.marking())
            others = [e for e in related if e.ref != entry.ref]
        data = entry_json(entry)
        # The notice of a resolve is the redirect's own (kept in the signed session for
        # the next page), never a query parameter a crafted link could carry.
        flash = request.session.pop("done", None) if self.authorize is not None else None
        done = flash.get("outcome") if isinstance(flash, dict) and flash.get("ref") == ref else None
        return self.render(
            request,
            "entry.html",
            entry=entry,
            payload=payload_view(
                entry.payload.data, data["payload"]["json"], whole=not entry.payload.truncated
            ),
            record=record,
            record_result=_result_view(record),
            attempts=attempts,
            related=others[:_RELATED],
            related_more=len(others) > _RELATED,
            readable=readable,
            done=done,
        )

    async def resolve(self, request: Request) -> Response:
        ref = _ref(request)
        form = await _form(request)
        if self.authorize is None:
            return self.refuse(
                request, 403, "read_only", "This console is read-only: nobody can resolve here."
            )
        principal = signed_in(request)  # Redis cannot say who: refused (503), fail closed
        if principal is None:
            return self.refuse(request, 403, "signed_out", "Sign in to resolve entries.")
        if not csrf_ok(request, form):
            return self.refuse(
                request,
                403,
                "csrf",
                "The form was stale or not sent by this console; reload the entry and "
                "resolve it again.",
            )
        # The form's textarea lets a line break in (Enter); a note is one line of text.
        typed = str(form.get("note", ""))
        note = " ".join(typed.split())
        if not note:
            raise InvalidInput("a resolution needs a note saying what was decided")
        if has_control(note):
            raise InvalidInput(_refused_in_note(typed))
        if _unfit(principal):
            # The service's authorize granted it; the page showed no resolve form for it.
            raise InvalidInput(
                f"this console cannot resolve as the principal you are signed in as: "
                f"{_unfit(principal)} The service's authorize must grant another; nothing "
                "was resolved."
            )
        if isinstance(await self._entry(ref), UndecodableEntry):
            return self.refuse(
                request,
                409,
                "undecodable",
                f"Quarantine entry {ref} cannot be decoded by this settle version, so the "
                "console does not resolve it: nobody here could read the evidence, and a "
                "resolved entry is what a routine trim deletes. Nothing was resolved; "
                "read it with the settle version that wrote it.",
            )
        text = resolved_by(principal, note)
        if len(text) > MAX_NOTE_CHARS:
            room = MAX_NOTE_CHARS - len(text) + len(note)
            raise InvalidInput(
                f"the note is {len(note)} characters; at most {room} characters fit (a note "
                f"holds {MAX_NOTE_CHARS}, with the [resolved by ...] prefix); shorten it, "
                "nothing was resolved"
            )
        request.state.resolving = True  # from here a timeout leaves the outcome unknown
        try:
            resolution = await self.settler.quarantine.resolve(ref, note=text)
        except (DurabilityError, BackendError) as exc:
            # The resolve may have been written (on the primary, unconfirmed; or before the
            # reply was lost): the error's own words were for a program ("read the record
            # back"), and the reader needs to know what to do.
            logger.warning("settle.web.failed", error=type(exc).__name__, status=503)
            return self.render(
                request,
                "error.html",
                503,
                status=503,
                message=(
                    f"The resolution is not confirmed ({exc}). It may or may not stand: "
                    "reload the entry to see. Resolving again with the same note is safe."
                ),
            )
        done = "resolved" if resolution.note == text else "already"
        logger.info(
            "settle.web.resolved",
            quarantine_id=ref,
            binding_digest=binding_digest(principal),
            already_resolved=done == "already",
        )
        request.session["done"] = {"ref": ref, "outcome": done}
        root = _root(request)
        return RedirectResponse(f"{root}/entry/{ref}", status_code=303)

    async def sign_in(self, request: Request) -> Response:
        if self.authorize is None or self.sessions is None:  # both or neither
            return self.refuse(
                request, 404, "read_only", "This console is read-only: there is no sign-in."
            )
        target = _local(_query_params(request).get("next", ""), request)
        if request.method == "GET":
            return self.render(request, "signin.html", next=target, failed=False)
        form = await _form(request)
        if not csrf_ok(request, form):
            return self.refuse(
                request, 403, "csrf", "The sign-in form was stale; open it again and retry."
            )
        # The service's authorize is not Redis (it may ask an identity provider): the
        # deadline is lifted while it runs, and the Redis calls after it get their own.
        bound: asyncio.Timeout | None = getattr(request.state, "bound", None)
        if bound is not None:
            bound.reschedule(None)
        principal = await sign_in(self.authorize, form.get("token", ""))
        if bound is not None:
            bound.reschedule(asyncio.get_running_loop().time() + self.redis_timeout)
        if principal is None:
            logger.warning("settle.web.sign_in_refused")
            return self.render(request, "signin.html", 403, next=target, failed=True)
        replaced = request.session.get("sid")
        if isinstance(replaced, str):
            # The browser leaves the session it held (another user on a shared machine):
            # it ends, or a copy of its cookie would act on until its max age.
            await self.sessions.end(replaced)  # Redis down: the error page, nothing changed
        csrf = secrets.token_urlsafe(32)  # a fresh session and CSRF token for the user
        sid = await self.sessions.start(principal, csrf)  # Redis down: the error page
        request.session.clear()
        request.session.update(sid=sid, csrf=csrf)
        logger.info("settle.web.signed_in", binding_digest=binding_digest(principal))
        return RedirectResponse(target, status_code=303)

    async def sign_out(self, request: Request) -> Response:
        form = await _form(request)
        if not csrf_ok(request, form):
            try:
                live = signed_in(request) is not None
            except SettleError as exc:
                # Redis could not say whether the session is over: a form without its
                # token signs out nothing (fail closed), and the page says why, not "stale".
                return self.not_signed_out(request, exc)
            if live:  # a live session: only its own forms sign it out
                return self.refuse(request, 403, "csrf", "The form was stale; reload and retry.")
            # Its session is over (signed out in another tab, ended, expired), and so was
            # the CSRF token the form carried: signing out of it changes nothing, so the
            # form does what it says rather than answer 403.
            logger.info("settle.web.signed_out_already")
        sid = request.session.get("sid")
        if self.sessions is not None and isinstance(sid, str):
            try:
                await self.sessions.end(sid)
            except SettleError as exc:
                return self.not_signed_out(request, exc)
        request.session.clear()
        root = _root(request)
        return RedirectResponse(f"{root}/", status_code=303)

    def not_signed_out(self, request: Request, exc: SettleError) -> HTMLResponse:
        logger.warning("settle.web.sign_out_failed", error=type(exc).__name__)
        message = (
            # The primary ended the session; a failover before a replica has it revives it.
            # The error's own text is written for settlements ("read the record back").
            "The sign-out is not confirmed. The session was ended on the Redis primary, "
            "but too few of its replicas confirmed it in time: if a replica takes over "
            "now, this session could be signed in again. Sign out again; if this keeps "
            "happening, ask an operator to end your sessions once the replicas are back."
            if isinstance(exc, DurabilityError)
            else "Could not sign out: Redis cannot be reached, so the session is still "
            "signed in. Retry in a moment."
            # No error code: no answer (a connection lost or refused, a timeout).
            if isinstance(exc, BackendError) and not exc.code
            # Reached, and refused: a replica now (a failover), a user its ACL refuses, a
            # write it refuses (NOREPLICAS, OOM, MISCONF). "Cannot be reached" sent the
            # operator looking for a network fault.
            else f"Could not sign out, so the session is still signed in: {exc}"
        )
        return self.render(
            request, "error.html", 503, status=503, message=message, sign_out_again=True
        )


async def _filter(q: dict[str, str], settler: AsyncSettler) -> tuple[_query.Filter, dict[str, str]]:
    """The filter of a list or export request's query parameters ``q``
    (:func:`_query_params`), and those parameters as given; a duration ago counts back from
    the server's clock, as in the CLI."""
    form = {k: q.get(k, "").strip() for k in ("kind", "since", "until", "status")}
    # An operation id is matched as it is: one may start or end with a space, and stripped,
    # the filter listed (and exported) another operation's entries under this one's name.
    form["operation"] = q.get("operation", "")
    kind = None
    if form["kind"]:
        try:
            kind = QuarantineKind(form["kind"])
        except ValueError:
            raise InvalidInput(
                f"kind must be one of {', '.join(k.value for k in QuarantineKind)}"
            ) from None
    status = form["status"] or "all"
    if status not in _STATUSES:
        raise InvalidInput(f"status must be one of {', '.join(_STATUSES)}")
    since, until = _instant(form["since"], "since"), _instant(form["until"], "until")
    now = datetime.now(UTC)  # read only for a duration ago, which takes the server's clock
    if isinstance(since, Ago) or isinstance(until, Ago):
        now = await _query.server_now(settler)
    # Before 1970 means "from the start" (since_on: stream ids count from it).
    since, until = since_on(since, now), since_on(until, now)
    flt = _query.Filter(
        kind=kind,
        operation_id=form["operation"] or None,
        since=since,
        until=until,
        status=status,
    )
    return flt, form


def _query_params(request: Request) -> dict[str, str]:
    """The query's parameters (the last value of each, a blank one kept, as Starlette's),
    read as UTF-8 or refused: Starlette reads a percent escape that is not UTF-8 as U+FFFD,
    so a filter of ``order-7%FF`` listed the entries of operation ``order-7\ufffd``, another
    one. Every parameter the console reads comes from here, never ``request.query_params``:
    the sign-in's ``next=/quarantine?operation=order-7%FF`` led there too."""
    try:
        raw = request.scope.get("query_string", b"").decode("utf-8")
        return dict(parse_qsl(raw, keep_blank_values=True, errors="strict"))
    except UnicodeDecodeError:
        raise InvalidInput(
            "the query is not UTF-8 (a percent escape spells bytes that are no text)"
        ) from None


def _pinned(form: dict[str, str], flt: _query.Filter) -> dict[str, str]:
    """``form`` with each duration ago (``since=6s``) replaced by the instant ``flt``
    resolved it to, in ISO 8601."""
    pinned = dict(form)
    for name, instant in (("since", flt.since), ("until", flt.until)):
        if instant is not None and isinstance(_instant(form[name], name), Ago):
            pinned[name] = instant.isoformat()
    return pinned


def _query_string(form: dict[str, str], **more: str) -> str:
    """``?a=1&b=2`` of the filter's non-empty fields and ``more``."""
    return "?" + urlencode({k: v for k, v in {**form, **more}.items() if v})


def _instant(text: str, name: str) -> datetime | Ago | None:
    """ISO 8601 (naive = UTC; a browser's datetime-local) or a duration ago, as in the CLI."""
    if not text:
        return None
    try:
        value: datetime | Ago = SINCE.convert(text, None, None)
    except click.BadParameter as exc:
        raise InvalidInput(f"{name}: {exc.message}") from None
    return value


def _size(q: dict[str, str]) -> int:
    text = q.get("size", "50")
    # Length first: int() refuses 4300 digits with a ValueError (a 500).
    if not (is_decimal(text) and len(text) <= 6) or int(text) not in _PAGE_SIZES:
        raise InvalidInput(f"size must be one of {', '.join(map(str, _PAGE_SIZES))}")
    return int(text)


def _refused_in_note(typed: str) -> str:
    """Which characters of the note box's ``typed`` text settle refuses in a note, each
    named with where it is in the box (a line break, which a browser sends as CRLF, one
    character; whitespace, which the note folds, never refused): invisible ones (a
    zero-width non-joiner of Persian spelling, an emoji's joiner, a direction mark), which
    the engine's words, "control characters or line breaks", did not let the user find."""
    found: dict[str, int] = {}
    for at, ch in enumerate(typed.replace("\r\n", "\n"), 1):
        if ch not in found and not ch.isspace() and has_control(ch):
            found[ch] = at
    named = "; ".join(
        f"U+{ord(ch):04X} {unicodedata.name(ch, 'unnamed')} (character {at})"
        for ch, at in list(found.items())[:5]
    )
    return (
        f"the note holds characters settle does not keep in a note, invisible ones "
        f"included: {named}. Remove them and resolve again; nothing was resolved."
    )


def _unfit(principal: str) -> str:
    """Why ``principal`` cannot be written into a resolution note ("" when it can)."""
    try:
        check_principal(principal)
    except InvalidInput as exc:
        return str(exc)
    return ""


def _readable_id(operation_id: str) -> bool:
    """Whether settle's API takes ``operation_id`` (and so can read its record)."""
    try:
        check_operation_id(operation_id)
    except InvalidInput:
        return False
    return True


def _ref(request: Request) -> str:
    return f"{request.path_params['shard']}/{request.path_params['entry_id']}"


async def _form(request: Request) -> dict[str, str]:
    """A small urlencoded form (no multipart, no dependency), first value of each field."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > _FORM_LIMIT:
            raise InvalidInput(
                f"the form is larger than {_FORM_LIMIT // 1024} KiB; shorten the note"
            )
    try:
        # Strict: a percent escape that spells no UTF-8 (note=refunded%FF) was read as
        # U+FFFD, and the entry resolved with a note nobody sent.
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, errors="strict")
    except UnicodeDecodeError:
        raise InvalidInput("the form is not UTF-8; nothing was changed") from None
    return {k: v[0] for k, v in fields.items()}


def _local(target: str, request: Request) -> str:
    """Where to go after signing in: a path of this console, never another site."""
    root = _root(request)
    if target.startswith(root + "/") and not target.startswith("//") and "\\" not in target:
        return target
    return root + "/"


def _root(request: Request) -> str:
    """The path the console is mounted at ("" when served on its own)."""
    return str(request.scope.get("root_path", ""))


def _path(request: Request) -> str:
    """The request's path (the mount's prefix included), never read from ``request.url``:
    Starlette decodes the query as UTF-8 to make it, and a byte that is none, which an ASGI
    server may pass on unescaped, made every page a bare 500 (the one that refuses it with
    400 included)."""
    return str(request.scope["path"])


def _here(request: Request) -> str:
    """The page as requested, its query included: where a sign-in returns to (the path
    alone lost a list's filter). A query that is no UTF-8 (its page is a 400) is left out.
    The answer of a form (a resolve refused as its session was over) returns to the page
    the form was on: its POST-only address answered 405 after the sign-in."""
    if request.method not in ("GET", "HEAD"):
        is_entry = "entry_id" in request.scope.get("path_params", {})
        return f"{_root(request)}/entry/{_ref(request)}" if is_entry else f"{_root(request)}/"
    try:
        query = _query_params(request)
    except InvalidInput:
        query = {}
    path = _path(request)
    return path + "?" + urlencode(query) if query else path


def _result_view(record: OperationRecord | None) -> PayloadView | None:
    """The record's stored result shown as a payload is (pretty JSON when it is strict
    JSON, else its text with invisible characters marked, else a hex dump), never as the
    base64 of its JSON form."""
    if record is None or record.result is None:
        return None
    return payload_view(record.result, record_json(record)["result_json"])
