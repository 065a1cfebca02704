"""The console's safety: response headers on every response, who may resolve, CSRF tokens.

- Every response carries a strict Content-Security-Policy (no script at all, styles only
  from the shipped stylesheet) and headers that keep the pages out of frames and caches.
- Without an ``authorize`` callable the console is read-only. With one, the sign-in form's
  token is handed to it; the principal it returns is kept in the signed session cookie
  (Starlette's ``SessionMiddleware``: itsdangerous, HttpOnly, SameSite=Lax, so a link from
  a chat or a ticket keeps the session; every change is a POST with the CSRF token).
- Every POST carries the session's CSRF token, compared in constant time.
"""

from __future__ import annotations

import hmac
import inspect
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "CSP",
    "Authorize",
    "SecurityHeaders",
    "csrf_ok",
    "csrf_token",
    "principal_of",
    "sign_in",
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


def token_authorizer(token: str, principal: str = "operator") -> Callable[[str], str | None]:
    """An ``authorize`` for one shared token: the right token grants ``principal``.

    The comparison takes the same time whatever the typed token shares with the real one.
    """
    if not token:
        raise ValueError("the token must not be empty")
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


def principal_of(request: Request) -> str | None:
    value = request.session.get("principal")
    return value if isinstance(value, str) else None


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
