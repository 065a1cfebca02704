"""The :class:`~settle.Attempt` a guarded handler finds in ``scope["settle"]``.

It is the decorator's ``Attempt``: ``operation_id``, ``generation`` (the fencing token),
``number``, ``idempotency_key`` (the stable downstream key, the same on every retry of the
operation; not the client's header value), ``lost`` / ``check()`` and ``remaining()``.
"""

from __future__ import annotations

import time

from settle.asgi._types import Scope
from settle.attempt import Attempt
from settle.models import Reserved

__all__ = ["attempt_for", "current_attempt"]


def attempt_for(reserved: Reserved, namespace: str, timeout: float | None) -> Attempt:
    deadline = None if timeout is None else time.monotonic() + timeout
    return Attempt.for_reservation(reserved, namespace, deadline)


def current_attempt(scope: Scope) -> Attempt:
    """The :class:`~settle.Attempt` of a guarded request, from its ASGI scope.

    Raises :class:`LookupError` when the request is not guarded (no key, or not a guarded
    method or path), so a handler that relies on a fencing token cannot run without one.
    """
    attempt = scope.get("settle")
    if attempt is None:
        raise LookupError(
            "this request is not guarded by IdempotencyMiddleware (no Idempotency-Key, or "
            "not a guarded method/path): there is no attempt in scope['settle']"
        )
    if not isinstance(attempt, Attempt):
        raise TypeError(f"scope['settle'] holds a {type(attempt).__name__}, not an Attempt")
    return attempt
