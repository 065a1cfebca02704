"""The console's safety: response headers on every response, who may resolve, CSRF tokens,
and sign-ins that can end.

- Every response carries a strict Content-Security-Policy (no script at all, styles only
  from the shipped stylesheet) and headers that keep the pages out of frames and caches.
- Without an ``authorize`` callable the console is read-only. With one, the sign-in form's
  token is handed to it; the principal it returns is kept in the settler's Redis, in a
  session named by the SHA-256 of a random id (:class:`Sessions`). The browser holds that
  id and the CSRF token in the signed session cookie (Starlette's ``SessionMiddleware``:
  itsdangerous, HttpOnly, SameSite=Lax, so a link from a chat or a ticket keeps the
  session). A cookie alone grants nothing: sign-out deletes the session, and
  :func:`end_sessions` ends every session of a principal (a session holds only under its
  principal's current epoch, and a lost epoch ends them all: fail closed), so a copy of
  the cookie taken before is worthless after.
- Every request's sign-in is asked of Redis (:class:`SignedIn`); when Redis cannot say, the
  page shows the user signed out and a POST that changes something is refused (fail closed).
- Every POST carries the session's CSRF token, compared in constant time.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import inspect
import json
import secrets
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from settle._async.settler import AsyncSettler
from settle._core.engine import MAX_NOTE_CHARS
from settle._core.keys import Keys
from settle._input import has_control
from settle._log import binding_digest, logger
from settle._runtime import Call
from settle._runtime._async import AsyncRunner
from settle._sessions import SCRIPTS
from settle._text import as_text
from settle.errors import BackendError, ConfigurationError, InvalidInput, SettleError

__all__ = [
    "CSP",
    "MAX_PRINCIPAL_CHARS",
    "Authorize",
    "SecurityHeaders",
    "Sessions",
    "SignIn",
    "SignedIn",
    "add_security_headers",
    "answered",
    "check_principal",
    "csrf_ok",
    "csrf_token",
    "deadline",
    "end_sessions",
    "principal_of",
    "resolved_by",
    "restarting",
    "sign_in",
    "signed_in",
    "token_authorizer",
]

CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-opener-policy", b"same-origin"),
]
_SET = {name for name, _ in _HEADERS}

#: Given the token typed in the sign-in form, the principal it grants, or None.
Authorize = Callable[[str], "str | Awaitable[str | None] | None"]


def add_security_headers(response: Response) -> Response:
    """``response`` with the headers above: for a response sent outside
    :class:`SecurityHeaders` (Starlette sends the one of an unexpected exception from
    its outermost middleware)."""
    for name, value in _HEADERS:
        response.headers[name.decode()] = value.decode()
    return response


class SecurityHeaders:
    """Pure ASGI: adds the headers above to every HTTP response of the wrapped app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _SET]
                message = {**message, "headers": kept + _HEADERS}
            await send(message)

        await self.app(scope, receive, send_with_headers)


#: What the console writes before the note a user typed: who resolved the entry.
_RESOLVED_BY = "[resolved by {}] "
#: The longest principal the console can resolve as: its prefix leaves room for a note.
MAX_PRINCIPAL_CHARS = MAX_NOTE_CHARS - len(_RESOLVED_BY.format("")) - 1


def check_principal(principal: object) -> str:
    """``principal`` when the console can resolve as it, else :class:`InvalidInput`.

    It is written into every resolution note (:func:`resolved_by`), which must be one line
    of at most ``MAX_NOTE_CHARS`` characters: a principal with a line break (or any control
    character), or one that leaves no room for a note, could sign in and resolve nothing
    (every resolve was refused, in words about the note the user typed)."""
    if (
        not isinstance(principal, str)
        or not 1 <= len(principal) <= MAX_PRINCIPAL_CHARS
        or has_control(principal)
    ):
        raise InvalidInput(
            f"principal must be 1 to {MAX_PRINCIPAL_CHARS} characters on one line, without "
            "control characters (it is written into every resolution note: "
            f"{_RESOLVED_BY.format('<principal>')}<note>)"
        )
    return principal


def resolved_by(principal: str, note: str) -> str:
    """The note the console records: ``[resolved by <principal>] <note>``."""
    return _RESOLVED_BY.format(check_principal(principal)) + note


def token_authorizer(token: str, principal: str = "operator") -> Callable[[str], str | None]:
    """An ``authorize`` for one shared token: the right token grants ``principal``.

    The comparison takes the same time whatever the typed token shares with the real one.
    A token a sign-in form cannot send (empty, or with a line break, a control character or
    a lone surrogate) and a principal :func:`check_principal` refuses are
    :class:`InvalidInput` (a ``ValueError``) here, not a console nobody can sign in to.
    """
    if not isinstance(token, str) or not token or has_control(token):
        raise InvalidInput(
            "token must not be empty, and must not contain line breaks or control "
            "characters (a sign-in form cannot send them)"
        )
    check_principal(principal)
    expected = token.encode("utf-8")

    def authorize(typed: str) -> str | None:
        return principal if hmac.compare_digest(typed.encode("utf-8"), expected) else None

    return authorize


async def sign_in(authorize: Authorize, token: str) -> str | None:
    """The principal ``authorize`` grants for ``token`` (sync or async), or None."""
    granted = authorize(token)
    if inspect.isawaitable(granted):
        granted = await granted
    return granted if isinstance(granted, str) and granted else None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _keys(settler: AsyncSettler) -> Keys:
    return Keys(settler.config.namespace, settler.config.shards)


def _new_epoch() -> str:
    """A principal's epoch: random, so that one made after the last was lost (a DEL, a
    failover, an eviction) never equals one an ended session holds."""
    return secrets.token_hex(16)


async def end_sessions(settler: AsyncSettler, principal: str) -> None:
    """End every console session of ``principal`` in ``settler``'s namespace, in every
    browser and every process serving the console: after revoking the token that granted
    it, so that a session started with the token (or a copy of its cookie) resolves nothing
    more. A sign-in after this call starts a session as usual.

    Raises :class:`~settle.errors.BackendError` when Redis cannot be reached (then nothing
    ended: call it again); with the settler's ``min_replicas``,
    :class:`~settle.errors.DurabilityError` when too few replicas acknowledged the new
    epoch in ``replica_timeout`` (the primary ended the sessions, a failover now may bring
    them back: call it again); and :class:`~settle.errors.InvalidInput`, writing nothing,
    for anything but an :class:`~settle.AsyncSettler` and a principal a sign-in can grant."""
    if not isinstance(settler, AsyncSettler):
        # A sync Settler ran the write, then the await failed with a bare TypeError.
        raise InvalidInput(
            f"end_sessions takes an AsyncSettler, not {type(settler).__name__}: from sync "
            "code, asyncio.run(end_sessions(AsyncSettler.from_url(...), principal))"
        )
    if not (isinstance(principal, str) and principal):
        raise InvalidInput(
            f"the principal must be the non-empty str a sign-in granted, not {principal!r}"
        )
    # A new epoch, which no session holds; repeated after a lost reply, another one.
    renew = Call(
        "epoch_renew", (_keys(settler).console_epochs,), (_digest(principal), _new_epoch())
    )
    await (await settler._companion(SCRIPTS)).run(renew)
    logger.info("settle.web.sessions_ended", binding_digest=binding_digest(principal))


class Sessions:
    """Console sign-ins kept in the settler's Redis, beside the namespace's metadata (hash
    tag ``{<namespace>}``: one slot, also on a cluster), for ``max_age`` seconds.

    The key is named by the SHA-256 of the session id, and holds the principal, its
    SHA-256, the SHA-256 of the session's CSRF token and the principal's epoch at sign-in
    (``console_epochs``). A session holds while that epoch is the principal's current one:
    :func:`end_sessions` replaces it, and a lost one (a DEL, a failover, an eviction) is
    made anew at the next sign-in, so that either way every older session is over (fail
    closed). The raw id and token are only in the browser's cookie."""

    def __init__(self, settler: AsyncSettler, max_age: int) -> None:
        self.settler = settler
        self.max_age = max_age
        #: Runs the session scripts on the settler's client (made at the first call).
        self._runner: AsyncRunner | None = None

    def _key(self, sid: str) -> str:
        return _keys(self.settler).console_session(_digest(sid))

    async def _run(self, script: str, keys: list[str], args: list[str | int]) -> Any:
        """Run one session script through the runtime, as settle runs its own: FCALL or
        EVALSHA, reloaded when the server lost it, ``WAIT`` after a write (a sign-in, a
        sign-out) with ``min_replicas``."""
        if self._runner is None:
            self._runner = await self.settler._companion(SCRIPTS)
        return await self._runner.run(Call(script, tuple(keys), tuple(args)))

    async def start(self, principal: str, csrf: str) -> str:
        """A new session of ``principal`` whose forms carry ``csrf``; its id."""
        sid = secrets.token_urlsafe(32)
        keys = [self._key(sid), _keys(self.settler).console_epochs]
        args: list[str | int] = [
            principal,
            _digest(principal),
            _digest(csrf),
            _new_epoch(),
            self.max_age,
        ]
        reply = await self._run("session_start", keys, args)
        if as_text(reply[0], "replace") != "started":
            raise ConfigurationError(
                f"the console's epoch of this principal (field {args[1]} of {keys[1]!r}) is "
                "not one settle wrote, so no session of it can start; call "
                "settle.web.end_sessions(settler, principal), or HDEL that field (either "
                "way every session of the principal is over, as it already is)"
            )
        return sid

    async def principal(self, sid: str, csrf: str) -> str | None:
        """Whom session ``sid`` (with the cookie's ``csrf``) resolves as; None when it
        was signed out, ended, expired, or never started here. One round trip."""
        keys = [self._key(sid), _keys(self.settler).console_epochs]
        reply = await self._run("session_check", keys, [])
        if len(reply) != 2:
            return None  # no session, or not one the console writes
        try:
            stored = json.loads(reply[0])
            principal, pd, digest, epoch = (stored[k] for k in ("principal", "pd", "csrf", "epoch"))
        except (ValueError, TypeError, KeyError):
            return None  # not what the console writes: no session
        if not isinstance(principal, str) or not all(
            isinstance(f, str) for f in (pd, digest, epoch)
        ):
            return None
        if not hmac.compare_digest(digest.encode(), _digest(csrf).encode()):
            return None
        if pd != _digest(principal) or not epoch or epoch != as_text(reply[1], "replace"):
            return None  # every session of the principal was ended since (or its epoch lost)
        return principal

    async def end(self, sid: str) -> None:
        """End session ``sid`` (sign-out); with ``min_replicas``, a
        :class:`~settle.errors.DurabilityError` when too few replicas acknowledged it."""
        await self._run("session_end", [self._key(sid)], [])


@dataclass(frozen=True, slots=True)
class SignIn:
    """Who the request's session resolves as: ``principal`` (None: signed out), or the
    failure that kept Redis from saying (then the request is shown signed out, and a POST
    that changes something is refused)."""

    principal: str | None
    failure: SettleError | None = None


_SIGN_IN = "settle.web.sign_in"
_SIGNED_OUT = SignIn(None)
_DEADLINE = "settle.web.deadline"


def deadline(scope: Scope, seconds: float) -> float:
    """When the request's Redis calls must have answered (the event loop's clock): set by
    its first call, ``seconds`` (``redis_timeout``) from then, shared by every later one
    (the sign-in check and the page's reads), so a request waits at most that long in all.
    A paused Redis (SIGSTOP, a partition: connections open, no answer) made every page
    wait out the client's socket timeout and its retries, about 120 s."""
    at = scope.get(_DEADLINE)
    if not isinstance(at, float):
        at = scope[_DEADLINE] = asyncio.get_running_loop().time() + seconds
    return at


#: The bound of the request being served and its seconds (:func:`restarting`).
_BOUND: ContextVar[tuple[asyncio.Timeout, float] | None] = ContextVar(
    "settle_web_bound", default=None
)


@contextmanager
def restarting(bound: asyncio.Timeout, seconds: float) -> Iterator[None]:
    """Within it, :func:`answered` restarts ``bound`` ``seconds`` from then."""
    token = _BOUND.set((bound, seconds))
    try:
        yield
    finally:
        _BOUND.reset(token)


def answered() -> None:
    """Redis answered one call of a walk as long as the data (the overview's SCAN of the
    keyspace): the request's bound restarts, ``redis_timeout`` from now. The bound is for
    a Redis that does not answer; on a Redis holding millions of other keys, every SCAN
    answered at once, the overview was a 503 "Redis did not answer" on every load."""
    live = _BOUND.get()
    if live is not None and not live[0].expired():
        bound, seconds = live
        bound.reschedule(asyncio.get_running_loop().time() + seconds)


def timed_out(seconds: float) -> BackendError:
    """The error of a request whose Redis calls did not answer within ``seconds``."""
    return BackendError(
        f"Redis did not answer within {seconds:g} s (redis_timeout): it may be paused, "
        "overloaded or cut off by the network"
    )


class SignedIn:
    """Pure ASGI, inside ``SessionMiddleware``: asks :class:`Sessions` who the session
    cookie's sign-in is, once per request (static files aside). A session Redis no longer
    holds is cleared from the cookie: the browser is signed out."""

    def __init__(self, app: ASGIApp, sessions: Sessions | None, redis_timeout: float) -> None:
        self.app = app
        self.sessions = sessions
        self.redis_timeout = redis_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[_SIGN_IN] = await self._check(scope)
        await self.app(scope, receive, send)

    async def _check(self, scope: Scope) -> SignIn:
        session = scope.get("session")
        path = scope["path"][len(scope.get("root_path", "")) :]
        if self.sessions is None or not session or path.startswith("/static/"):
            return _SIGNED_OUT
        sid, csrf = session.get("sid"), session.get("csrf")
        if not (isinstance(sid, str) and isinstance(csrf, str)):
            return _SIGNED_OUT
        try:
            bound = asyncio.timeout_at(deadline(scope, self.redis_timeout))
            try:
                async with bound:
                    principal = await self.sessions.principal(sid, csrf)
            except TimeoutError:
                if not bound.expired():
                    raise
                raise timed_out(self.redis_timeout) from None
        except SettleError as exc:
            logger.warning("settle.web.session_unchecked", error=type(exc).__name__)
            return SignIn(None, exc)
        if principal is None:
            session.clear()  # ended, expired or unknown: a fresh, signed-out session
        return SignIn(principal)


def principal_of(request: Request) -> str | None:
    """Whom the request's session resolves as, for display (None when Redis cannot say)."""
    found = request.scope.get(_SIGN_IN, _SIGNED_OUT)
    return found.principal if isinstance(found, SignIn) else None


def signed_in(request: Request) -> str | None:
    """Like :func:`principal_of`, for a request that changes something: when Redis could
    not say who is signed in, its error is raised (fail closed: nothing changes)."""
    found = request.scope.get(_SIGN_IN, _SIGNED_OUT)
    if isinstance(found, SignIn) and found.failure is not None:
        raise found.failure
    return principal_of(request)


def csrf_token(request: Request) -> str:
    """The session's CSRF token, made on first use."""
    token = request.session.get("csrf")
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        request.session["csrf"] = token
    return token


def csrf_ok(request: Request, form: dict[str, Any]) -> bool:
    expected = request.session.get("csrf")
    given = form.get("csrf")
    if not isinstance(expected, str) or not isinstance(given, str):
        return False
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))
