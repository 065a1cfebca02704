"""What is stored for a finished response, and how it is replayed.

A stored response keeps the status, the allow-listed headers (values as the handler sent
them, names lowercased, in order), the headers its status cannot go without
(:data:`STATUS_HEADERS`) and the body (base64 in the record). A response over
``max_response_bytes`` is recorded without headers and body (``body is None``): the handler
completed, its response cannot be replayed, and a retry gets a 410 problem instead of
running the handler again.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = [
    "DEFAULT_REPLAY_HEADERS",
    "FORBIDDEN_REPLAY_HEADERS",
    "REPLAYED_HEADER",
    "STATUS_HEADERS",
    "StoredResponse",
    "storable_status",
]

#: Sent with every replayed response.
REPLAYED_HEADER = (b"idempotent-replayed", b"true")

#: Response headers stored and replayed unless configured otherwise.
DEFAULT_REPLAY_HEADERS = frozenset(
    {
        "content-type",
        "content-encoding",
        "content-language",
        "content-location",
        "location",
        "etag",
        "last-modified",
        "link",
        "cache-control",
        "vary",
    }
)

#: Never stored: cookies belong to one client session; framing headers are recomputed.
FORBIDDEN_REPLAY_HEADERS = frozenset(
    {
        "set-cookie",
        "set-cookie2",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "trailer",
        "te",
        "idempotent-replayed",
    }
)

#: The headers RFC 9110 makes part of a status, stored with a response of that status
#: whatever ``replay_headers`` lists: a 401 MUST carry its challenges (15.5.2), a 405 the
#: methods it allows (15.5.6), a 206 its range (15.3.7), a 416 the length it refers to
#: (15.5.17), and a redirect where to go (15.4). A replay without them is not the response
#: the first client got, and a client that follows a challenge, an ``Allow`` or a redirect
#: could no longer tell what to do. (A 201's ``Location`` is not one of them: a 201 without
#: it names the target URI, RFC 9110 15.3.2, so an own list may leave it out.)
_WHERE = frozenset({"location"})
STATUS_HEADERS: dict[int, frozenset[str]] = {
    206: frozenset({"content-range"}),
    **dict.fromkeys((300, 301, 302, 303, 307, 308), _WHERE),
    401: frozenset({"www-authenticate"}),
    405: frozenset({"allow"}),
    416: frozenset({"content-range"}),
}

_NOT_FINISHED_4XX = frozenset({408, 409, 429})


def storable_status(status: int) -> bool:
    """A response the handler finished: 2xx, 3xx other than 304, and 4xx other than 408,
    409 and 429.

    A redirect is a finished answer: "charge, then 303 to the receipt" (Post/Redirect/Get)
    ran the operation, and a retry that ran it again would charge twice (SPEC 7 lists 2xx
    and 4xx only; docs/http-endpoints.md says why settle stores redirects too). 1xx, 304,
    5xx and the three retryable 4xx leave the attempt provisional, so the next retry runs
    the handler again.
    """
    return (
        200 <= status < 300
        or (300 <= status < 400 and status != 304)
        or (400 <= status < 500 and status not in _NOT_FINISHED_4XX)
    )


class StoredResponse(BaseModel):
    """The stored form of a finished response (the result of the operation record)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", ser_json_bytes="base64", val_json_bytes="base64"
    )

    format: Literal[1] = 1
    status: int
    headers: tuple[tuple[str, str], ...] = ()
    """Allow-listed headers and those its status needs (:data:`STATUS_HEADERS`), names
    lowercased, values latin-1 decoded, in the order sent."""
    body: bytes | None
    """None: the response was over the size limit and was sent but not stored."""
    size: int
    """Body size in bytes as sent to the first client."""

    @classmethod
    def capture(
        cls, status: int, headers: list[tuple[bytes, bytes]], body: bytes, allowed: Collection[str]
    ) -> StoredResponse:
        needed = STATUS_HEADERS.get(status, frozenset())
        kept = tuple(
            (lower, value.decode("latin-1"))
            for name, value in headers
            if (lower := name.decode("latin-1").lower()) in allowed or lower in needed
        )
        return cls(status=status, headers=kept, body=body, size=len(body))

    @classmethod
    def not_stored(cls, status: int, size: int) -> StoredResponse:
        return cls(status=status, body=None, size=size)

    def replay_headers(self) -> list[tuple[bytes, bytes]]:
        assert self.body is not None
        headers = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in self.headers]
        if self.status != 204:  # RFC 9110 8.6: never a Content-Length on a 204
            headers.append((b"content-length", str(len(self.body)).encode("ascii")))
        headers.append(REPLAYED_HEADER)
        return headers
