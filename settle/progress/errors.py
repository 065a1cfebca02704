"""Errors of ``settle.progress``; all derive from :class:`settle.errors.SettleError`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from settle.errors import InvalidInput, SettleError

if TYPE_CHECKING:
    from settle.progress.identity import DeliveryId

__all__ = [
    "DeferDelivery",
    "InvalidDelivery",
    "ProgressError",
    "ProviderReset",
    "SettlementNotAuthorized",
    "UnprovenListing",
]


#: The longest reason a deferral or a dead-letter records.
MAX_REASON = 256


def check_reason(value: object) -> str:
    """A deferral's or a dead-letter's reason: a str of 1 to :data:`MAX_REASON` characters."""
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_REASON:
        raise InvalidDelivery(f"reason must be a str of 1 to {MAX_REASON} characters")
    return value


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


class DeferDelivery(ProgressError):
    """Raised by an effect to set its delivery aside: the consumer records it durably as
    deferred (found again with ``Progress.deferred``), then stops its redelivery."""

    def __init__(self, reason: str) -> None:
        # Checked here, where the effect raises it: a reason progress would refuse after
        # the effect ran would otherwise stop the consumer with the delivery still pending.
        super().__init__(f"delivery deferred: {check_reason(reason)}")
        self.reason = reason
