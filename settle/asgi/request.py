"""Reading a guarded ASGI request: its head for the rules, its body under the limit.

The fingerprint itself is :func:`settle.http.request.fingerprint_request`.
"""

from __future__ import annotations

from settle.asgi._types import Receive, Scope
from settle.http.request import (
    BodyBuffer,
    ClientDisconnected,
    RequestHead,
    RequestTooLarge,
    fingerprint_request,
)

__all__ = [
    "ClientDisconnected",
    "RequestTooLarge",
    "header_values",
    "read_body",
    "request_fingerprint",
    "request_head",
]


def header_values(scope: Scope, name: bytes) -> list[bytes]:
    """Every value of header ``name`` (lowercase), in the order received."""
    return [value for key, value in scope.get("headers", ()) if key.lower() == name]


def request_head(scope: Scope, key_header: bytes = b"idempotency-key") -> RequestHead:
    content_length = header_values(scope, b"content-length")
    return RequestHead(
        method=scope["method"],
        path=scope["path"],
        query=scope.get("query_string", b""),
        content_type=b",".join(header_values(scope, b"content-type")),
        key_values=tuple(header_values(scope, key_header)),
        content_length=content_length[0] if content_length else None,
    )


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole request body, or :class:`RequestTooLarge` past ``limit`` bytes."""
    buffer = BodyBuffer(limit, request_head(scope).content_length)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        buffer.add(message.get("body", b""))
        if not message.get("more_body", False):
            return buffer.body()


def request_fingerprint(scope: Scope, body: bytes) -> str:
    """The fingerprint of an ASGI request (:func:`settle.http.request.fingerprint_request`)."""
    return fingerprint_request(request_head(scope), body)
