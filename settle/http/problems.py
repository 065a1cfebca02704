"""Every error response the middlewares write themselves: RFC 9457 ``application/problem+json``.

Each case has its own ``type`` (``<problem_type_base><slug>``), a fixed status and title; the
``detail`` says what the client should do next. ``docs/http-endpoints.md`` lists them all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum

from settle._slots import slot_init

__all__ = ["DEFAULT_PROBLEM_TYPE_BASE", "Problem", "ProblemKind", "Response"]

DEFAULT_PROBLEM_TYPE_BASE = "urn:settle:problem:"


class ProblemKind(StrEnum):
    """The slug of each problem type; the status and title follow from it."""

    KEY_MISSING = "idempotency-key-missing"
    KEY_MALFORMED = "idempotency-key-malformed"
    PRINCIPAL_REQUIRED = "principal-required"
    PRINCIPAL_FAILED = "principal-failed"
    REQUEST_TOO_LARGE = "request-too-large"
    REQUEST_MALFORMED = "request-malformed"
    REQUEST_INCOMPLETE = "request-incomplete"
    KEY_REUSED = "idempotency-key-reused"
    KEY_BOUND = "idempotency-key-bound"
    IN_PROGRESS = "request-in-progress"
    SUPERSEDED = "attempt-superseded"
    RESPONSE_NOT_STORED = "response-not-stored"
    UNAVAILABLE = "idempotency-unavailable"
    TIMEOUT = "handler-timeout"

    @property
    def status(self) -> int:
        return _STATUS_TITLE[self][0]

    @property
    def problem_title(self) -> str:
        return _STATUS_TITLE[self][1]


_STATUS_TITLE: dict[ProblemKind, tuple[int, str]] = {
    ProblemKind.KEY_MISSING: (400, "Idempotency-Key header is missing"),
    ProblemKind.KEY_MALFORMED: (400, "Idempotency-Key header is malformed"),
    ProblemKind.PRINCIPAL_REQUIRED: (401, "Authentication is required"),
    ProblemKind.PRINCIPAL_FAILED: (500, "The principal of the request could not be determined"),
    ProblemKind.REQUEST_TOO_LARGE: (413, "Request body is too large"),
    ProblemKind.REQUEST_MALFORMED: (400, "Request body length is malformed"),
    ProblemKind.REQUEST_INCOMPLETE: (400, "Request body is incomplete"),
    ProblemKind.KEY_REUSED: (422, "Idempotency-Key was used for a different request"),
    ProblemKind.KEY_BOUND: (422, "Idempotency-Key belongs to another principal"),
    ProblemKind.IN_PROGRESS: (409, "A request with this Idempotency-Key is in progress"),
    ProblemKind.SUPERSEDED: (409, "This attempt was superseded by a newer one"),
    ProblemKind.RESPONSE_NOT_STORED: (410, "The response to this request was not stored"),
    ProblemKind.UNAVAILABLE: (503, "Idempotency store is unavailable"),
    ProblemKind.TIMEOUT: (504, "The request did not finish in time"),
}


# slot_init: each field set through its slot's descriptor, not ``object.__setattr__`` (built
# for every replay and problem; docs/benchmarks.md, the twenty-third round).
@slot_init
@dataclass(frozen=True, slots=True)
class Response:
    """A complete response a middleware sends itself (a problem or a replay), for any
    protocol: header names lowercase, values as bytes."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem response, ready to send."""

    kind: ProblemKind
    detail: str
    retry_after: int | None = None
    #: The challenge of a 401 (``WWW-Authenticate``), a header value checked by the policy.
    www_authenticate: str | None = None

    def body(self, type_base: str) -> bytes:
        document = {
            "type": f"{type_base}{self.kind.value}",
            "title": self.kind.problem_title,
            "status": self.kind.status,
            "detail": self.detail,
        }
        return json.dumps(document, separators=(",", ":")).encode("utf-8")

    def headers(self, body: bytes) -> list[tuple[bytes, bytes]]:
        headers = [
            (b"content-type", b"application/problem+json"),
            (b"content-length", str(len(body)).encode("ascii")),
            (b"cache-control", b"no-store"),
        ]
        if self.retry_after is not None:
            headers.append((b"retry-after", str(self.retry_after).encode("ascii")))
        if self.www_authenticate is not None:
            headers.append((b"www-authenticate", self.www_authenticate.encode("ascii")))
        return headers

    def response(self, type_base: str) -> Response:
        body = self.body(type_base)
        return Response(self.kind.status, tuple(self.headers(body)), body)
