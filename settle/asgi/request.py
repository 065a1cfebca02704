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
    "route_path",
]


def header_values(scope: Scope, name: bytes) -> list[bytes]:
    """Every value of header ``name`` (lowercase), in the order received."""
    return [value for key, value in scope.get("headers", ()) if key.lower() == name]


def route_path(scope: Scope) -> str:
    """The path inside the application: ``path`` without the ``root_path`` it starts with
    (ASGI puts the mount prefix in both: a Starlette ``Mount``, ``uvicorn --root-path``), as
    WSGI's ``PATH_INFO`` is without ``SCRIPT_NAME``; Starlette's routing reads the same.
    ``paths`` match it or the whole path; the fingerprint covers the whole path."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/"):
        return path[len(root) :] or "/"
    return path


def request_head(scope: Scope, key_header: bytes = b"idempotency-key") -> RequestHead:
    content_types: list[bytes] = []
    key_values: list[bytes] = []
    content_length: bytes | None = None
    # One pass over the headers (servers send lowercase names; ASGI does not promise it).
    for key, value in scope.get("headers", ()):
        name = key.lower()
        if name == key_header:
            key_values.append(value)
        if name == b"content-type":
            content_types.append(value)
        elif name == b"content-length" and content_length is None:
            content_length = value
    return RequestHead(
        method=scope["method"],
        path=scope["path"],
        route=route_path(scope),
        query=scope.get("query_string", b""),
        content_type=b",".join(content_types),
        key_values=tuple(key_values),
        content_length=content_length,
    )


async def read_body(
    scope: Scope, receive: Receive, limit: int, head: RequestHead | None = None
) -> bytes:
    """The whole request body, or :class:`RequestTooLarge` past ``limit`` bytes (or past
    the declared ``Content-Length`` of ``head``, read from ``scope`` when not given)."""
    buffer = BodyBuffer(limit, (head or request_head(scope)).content_length)
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
