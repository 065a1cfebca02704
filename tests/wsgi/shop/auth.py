"""The shop's authentication: an API key names the tenant, which becomes ``request.user``."""

from __future__ import annotations

from typing import Any

from rest_framework.authentication import BaseAuthentication

API_KEYS = {"sk_test_acme": "acme", "sk_test_umbrella": "umbrella"}


class Tenant:
    is_active = True

    def __init__(self, pk: str | None) -> None:
        self.pk = pk
        self.is_authenticated = pk is not None


class ApiKeyMiddleware:
    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        request.user = Tenant(API_KEYS.get(token) if scheme.lower() == "bearer" else None)
        return self.get_response(request)


class FromMiddleware(BaseAuthentication):
    """REST framework sees the user the middleware set (no CSRF: it is not a session)."""

    def authenticate(self, request: Any) -> tuple[Tenant, None] | None:
        user = request._request.user
        return (user, None) if user.is_authenticated else None
