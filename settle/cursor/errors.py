"""Errors of ``settle.cursor``; all derive from :class:`settle.errors.SettleError`.

Each carries the stream (as ``operation_id`` too, so generic handlers can report it) and
says what to do next. A divergence names its :class:`~settle.cursor.Recovery`.
"""

from __future__ import annotations

from settle.cursor.models import Recovery
from settle.errors import InvalidInput, SettleError

__all__ = [
    "CheckpointMissing",
    "CoverageNotProven",
    "CursorDivergence",
    "CursorError",
    "CursorExpired",
    "InvalidResponse",
    "ProviderCursorExpired",
    "ReceiptConflict",
    "RotationNotAllowed",
]

_RECOVERY_TEXT = {
    Recovery.STABLE_BOUNDARY: (
        "recover from a stable boundary: ask the provider for a cursor at position "
        "{boundary} and call reset(cursor=..., boundary={boundary})"
    ),
    Recovery.FRESH_SNAPSHOT: (
        "recover from a fresh snapshot: take the provider's first cursor of a new snapshot "
        "and call reset(cursor=..., boundary=...); receipts keep applied events from being "
        "applied twice"
    ),
}


def recovery_text(recovery: Recovery, boundary: int) -> str:
    return _RECOVERY_TEXT[recovery].format(boundary=boundary)


class CursorError(SettleError):
    """Root of the cursor errors; ``stream`` names the stream."""

    def __init__(self, message: str, *, stream: str | None) -> None:
        super().__init__(message, operation_id=stream)
        self.stream = stream


class InvalidResponse(CursorError, InvalidInput):
    """``fetch_page`` returned something the contract does not allow (positions not
    increasing, a repeated id, a coverage marker the contract does not declare...).

    Nothing was written. Fix ``fetch_page`` or the declared contract. ``reason`` names what
    was wrong (``positions_not_increasing``, ``duplicate_event_id``...; the log event
    ``settle.cursor.invalid_response`` carries it too).
    """

    def __init__(self, message: str, *, stream: str | None, reason: str = "invalid") -> None:
        super().__init__(message, stream=stream)
        self.reason = reason


class CheckpointMissing(CursorError, LookupError):
    """The stream has no checkpoint: call ``start`` with its first cursor."""


class CursorDivergence(CursorError):
    """A response cannot be proven consistent with what was applied: the stream stopped
    without advancing. The response is kept as an abandoned witness (``attempt_id``);
    ``recovery`` says how to continue."""

    def __init__(
        self,
        message: str,
        *,
        stream: str,
        recovery: Recovery,
        generation: int,
        boundary: int,
        reason: str,
        attempt_id: str | None = None,
    ) -> None:
        super().__init__(f"{message}; {recovery_text(recovery, boundary)}", stream=stream)
        self.recovery = recovery
        self.generation = generation
        self.boundary = boundary
        self.reason = reason
        self.attempt_id = attempt_id


class ReceiptConflict(CursorDivergence):
    """An event contradicts its durable receipt: the same id with another payload or
    position, or another id at an immutable position already applied."""


class CoverageNotProven(CursorDivergence):
    """The response does not prove it covers the next required position (a gap in dense
    positions, a witnessed event gone, a shifted sparse page without coverage)."""


class RotationNotAllowed(CursorDivergence):
    """The same events came back with a new successor, and the contract does not allow
    token rotation."""


class CursorExpired(CursorDivergence):
    """The checkpointed cursor is older than the contract's ``cursor_ttl``, or the provider
    rejected it as expired (``fetch_page`` raised :class:`ProviderCursorExpired`)."""


class ProviderCursorExpired(SettleError):
    """Raise this from ``fetch_page`` when the provider rejects the cursor as expired; the
    consumer turns it into :class:`CursorExpired` with the stream and recovery filled in."""
