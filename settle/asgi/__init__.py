"""The ``Idempotency-Key`` header for ASGI apps (SPEC 7): pure ASGI, no framework import.

    from settle.asgi import IdempotencyMiddleware
    app.add_middleware(IdempotencyMiddleware, settler=settler, principal=principal_of)

A guarded handler finds its :class:`settle.Attempt` (generation = fencing token)
in ``scope["settle"]`` (:func:`current_attempt`). See ``docs/http-endpoints.md``.
"""

from settle.asgi.middleware import IdempotencyMiddleware
from settle.http.attempt import current_attempt
from settle.http.keys import KeyScope
from settle.http.policy import IdempotencyPolicy, PrincipalFn
from settle.http.problems import DEFAULT_PROBLEM_TYPE_BASE, ProblemKind
from settle.http.stored import (
    DEFAULT_REPLAY_HEADERS,
    REPLAYED_HEADER,
    StoredResponse,
    storable_status,
)

__all__ = [
    "DEFAULT_PROBLEM_TYPE_BASE",
    "DEFAULT_REPLAY_HEADERS",
    "REPLAYED_HEADER",
    "IdempotencyMiddleware",
    "IdempotencyPolicy",
    "KeyScope",
    "PrincipalFn",
    "ProblemKind",
    "StoredResponse",
    "current_attempt",
    "storable_status",
]
