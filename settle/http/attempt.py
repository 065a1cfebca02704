"""The :class:`~settle.Attempt` a guarded handler finds in ``scope["settle"]``
(ASGI), ``environ["settle"]`` (WSGI, Flask) or ``request.settle`` (Django).

It is the decorator's ``Attempt``: ``operation_id``, ``generation`` (the fencing token),
``number``, ``idempotency_key`` (the stable downstream key, the same on every retry of the
operation; not the client's header value), ``lost`` / ``check()`` and ``remaining()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from settle.attempt import Attempt

__all__ = ["current_attempt"]


def current_attempt(scope: Mapping[str, Any], where: str = "scope['settle']") -> Attempt:
    """The :class:`~settle.Attempt` of a guarded request, from its ASGI scope (or
    WSGI environ: both keep it under ``"settle"``).

    Raises :class:`LookupError` when the request is not guarded (no key, or not a guarded
    method or path), so a handler that relies on a fencing token cannot run without one.
    """
    attempt = scope.get("settle")
    if attempt is None:
        raise LookupError(
            "this request is not guarded by IdempotencyMiddleware (no Idempotency-Key, or "
            f"not a guarded method/path): there is no attempt in {where}"
        )
    if not isinstance(attempt, Attempt):
        raise TypeError(f"{where} holds a {type(attempt).__name__}, not an Attempt")
    return attempt
