"""Errors of ``settle.progress``; all derive from :class:`settle.errors.SettleError`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from settle._input import has_control
from settle.errors import InvalidInput, SettleError

if TYPE_CHECKING:
    from settle.progress.identity import DeliveryId, ProviderScope

__all__ = [
    "DeferDelivery",
    "InvalidDelivery",
    "ProgressError",
    "ProgressLost",
    "ProviderReset",
    "SettlementNotAuthorized",
    "UnprovenListing",
]


#: The longest reason a deferral or a dead-letter records.
MAX_REASON = 256


def check_reason(value: object) -> str:
    """A deferral's or a dead-letter's reason: a str of 1 to :data:`MAX_REASON` characters
    without control characters (settle's one rule, :func:`settle._input.has_control`, as
    for the core's reasons): it is stored, logged and shown to operators as it is, and a
    lone surrogate cannot be sent to Redis at all."""
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_REASON:
        raise InvalidDelivery(f"reason must be a str of 1 to {MAX_REASON} characters")
    if has_control(value):
        raise InvalidDelivery(
            "reason must not contain control characters or line separators (it is shown to "
            "operators as it is)"
        )
    return value


def recorded_reason(value: str) -> str:
    """A reason read back from progress, as :func:`check_reason` takes it again (``recover()``
    sends an intent's reason with its settlement): one recorded before reasons were checked
    for control characters comes back with them escaped (``\\n``), cut to
    :data:`MAX_REASON`."""
    if not has_control(value):
        return value
    # Only the characters check_reason refuses are escaped: "für\n" reads "für\\n".
    escaped = "".join(
        ch.encode("unicode_escape").decode("ascii") if has_control(ch) else ch for ch in value
    )
    return escaped[:MAX_REASON]


class ProgressError(SettleError):
    """Root of the delivery-progress errors."""


class InvalidDelivery(ProgressError, InvalidInput):
    """An id, name or listing is malformed. Nothing was written; fix the argument."""


class SettlementNotAuthorized(ProgressError):
    """Durable progress does not cover every delivery this settlement would touch.

    ``uncovered`` lists them. Apply (or dead-letter) them first, or settle fewer.
    """

    def __init__(self, message: str, *, uncovered: list[DeliveryId]) -> None:
        super().__init__(message)
        self.uncovered = uncovered


class UnprovenListing(ProgressError, InvalidInput):
    """A provider listing cannot prove anything about the prefix (it starts above the floor
    or is not strictly ascending). Nothing was written; list again from the floor."""


class ProviderReset(ProgressError):
    """The provider lost the consumer group (e.g. the stream's server restarted without
    persistence). Call ``start()`` again: a new incarnation scope is opened, and effects
    already applied are recognised by their emission ids."""


class ProgressLost(ProgressError):
    """The progress server has no state for a scope whose deliveries were acknowledged (the
    stream's server says so): it lost the consumer's progress (a restart without
    persistence, FLUSHALL, a DEL, an evicting server). Nothing was written: without that
    progress, settle cannot tell applied deliveries from lost ones, and emissions applied
    before would run their effects again. ``scope`` is the scope whose progress is gone.

    To go on (docs/delivery-progress.md, "Progress lost"; the message names the keys): stop
    the workers of the group, destroy the consumer group and delete this consumer's field of
    the stream's acknowledged mark, and start them again: the group is made again from the
    start of the stream, the scope is created anew, and every entry still in the stream is
    handed out again and applied again under its idempotency key (effects must honour it)."""

    def __init__(
        self, message: str, *, scope: ProviderScope, operation_id: str | None = None
    ) -> None:
        super().__init__(message, operation_id=operation_id)
        self.scope = scope


class DeferDelivery(ProgressError):
    """Raised by an effect to set its delivery aside: the consumer records it durably as
    deferred (found again with ``Progress.deferred``), then stops its redelivery."""

    def __init__(self, reason: str) -> None:
        # Checked here, where the effect raises it: a reason progress would refuse after
        # the effect ran would otherwise stop the consumer with the delivery still pending.
        super().__init__(f"delivery deferred: {check_reason(reason)}")
        self.reason = reason
