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
from settle.errors import NotGuarded

__all__ = ["OUTER", "carrying", "current_attempt", "held_attempts"]

#: Where a guard that runs a request keeps, in its scope or environ, the attempts of the
#: guards that run it already (outermost first); ``"settle"`` holds its own, the one the
#: handler uses. A guard inside them all finds each of their operations there.
OUTER = "settle.outer"


def current_attempt(scope: Mapping[str, Any], where: str = "scope['settle']") -> Attempt:
    """The :class:`~settle.Attempt` of a guarded request, from its ASGI scope (or
    WSGI environ: both keep it under ``"settle"``).

    Raises :class:`~settle.errors.NotGuarded` (a ``LookupError``) when the request is not
    guarded (no key, or not a guarded method or path), or its ``"settle"`` entry is not an
    attempt, so a handler that relies on a fencing token cannot run without one.
    """
    attempt = scope.get("settle")
    if attempt is None:
        raise NotGuarded(
            "this request is not guarded by IdempotencyMiddleware (no Idempotency-Key, or "
            f"not a guarded method/path): there is no attempt in {where}"
        )
    if not isinstance(attempt, Attempt):
        raise NotGuarded(f"{where} holds a {type(attempt).__name__}, not an Attempt")
    return attempt


def held_attempts(carrier: Mapping[str, Any]) -> tuple[Attempt, ...]:
    """The attempts of every guard that runs this request already, outermost first, from
    its ASGI scope or WSGI environ (``"settle"`` and :data:`OUTER`). A guard passes the
    request through when it would reserve one of their operations (reserving it again would
    find it in progress and answer 409 to every attempt): the nearest guard's alone is not
    enough, for a guard between them may key another operation."""
    if "settle" not in carrier and OUTER not in carrier:
        return ()  # no guard runs it (most requests): nothing to read
    outer = carrier.get(OUTER)
    held = [a for a in outer if isinstance(a, Attempt)] if isinstance(outer, tuple) else []
    attempt = carrier.get("settle")
    if isinstance(attempt, Attempt):
        held.append(attempt)
    return tuple(held)


def carrying(carrier: Mapping[str, Any], attempt: Attempt) -> dict[str, Any]:
    """What a guard that runs a request under ``attempt`` puts in its scope or environ: its
    attempt in ``"settle"``, and those of the guards around it in :data:`OUTER`."""
    return {OUTER: held_attempts(carrier), "settle": attempt}
