"""Every public error of settle.

One root, :class:`SettleError`. Each error carries the operation id where there is one
and its message says what to do next. Errors that mean "bad input" also derive from
:class:`ValueError` so that generic input handling still catches them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from settle.models import OperationRecord, StoredFailure

__all__ = [
    "BackendError",
    "BindingMismatch",
    "ConfigurationError",
    "CorruptRecord",
    "DurabilityError",
    "FingerprintError",
    "FingerprintMismatch",
    "InvalidInput",
    "InvalidOption",
    "NotGuarded",
    "OperationFailed",
    "OperationInProgress",
    "QuarantineNotFound",
    "ResultTooLarge",
    "SettleError",
    "StaleAttempt",
]


class SettleError(Exception):
    """Root of every error raised by settle."""

    def __init__(self, message: str, *, operation_id: str | None = None) -> None:
        super().__init__(message)
        self.operation_id = operation_id

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep errors picklable (they cross process boundaries in worker pools).
        return (_rebuild, (type(self), self.__dict__, self.args))


def _rebuild(cls: type[SettleError], state: dict[str, Any], args: tuple[Any, ...]) -> SettleError:
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


class InvalidInput(SettleError, ValueError):
    """An argument is not acceptable (empty or oversized id, bad principal, bad lease...).

    Nothing was sent to Redis; fix the argument and call again.
    """


class FingerprintError(InvalidInput):
    """The request has no canonical JSON form (NaN, infinity, a set, an unknown object).

    Convert the request to plain JSON values (or a pydantic model) and call again.
    """


class ResultTooLarge(InvalidInput):
    """A result or failure is larger than ``SettleConfig.max_result_bytes``.

    Nothing was written. Store a reference to the large payload instead of the payload.
    """


class FingerprintMismatch(SettleError):
    """The operation id is already bound to a different request.

    A changed request is never the same operation: give it its own operation id.
    """


class BindingMismatch(SettleError):
    """The operation id is already bound to a different principal.

    No principal can act on, or read, another principal's operation: use another id.
    """


class OperationInProgress(SettleError):
    """Another attempt holds a live lease on the operation.

    Retry after ``lease_expires_at``; the holder will settle it or its lease will expire.
    """

    def __init__(
        self,
        message: str,
        *,
        operation_id: str,
        generation: int,
        lease_expires_at_ms: int,
    ) -> None:
        super().__init__(message, operation_id=operation_id)
        self.generation = generation
        self.lease_expires_at_ms = lease_expires_at_ms


class StaleAttempt(SettleError):
    """This attempt lost: its settlement was quarantined, not merged.

    ``record`` is the authoritative record (None if it no longer exists). Use its outcome,
    never the result this attempt computed.
    """

    def __init__(
        self,
        message: str,
        *,
        operation_id: str,
        record: OperationRecord | None,
        quarantine_id: str | None = None,
    ) -> None:
        super().__init__(message, operation_id=operation_id)
        self.record = record
        self.quarantine_id = quarantine_id


class OperationFailed(SettleError):
    """The operation ended in a committed, definite failure, which is replayed as is.

    ``failure`` holds what was stored. The operation will not run again under this id.
    """

    def __init__(self, message: str, *, operation_id: str, failure: StoredFailure) -> None:
        super().__init__(message, operation_id=operation_id)
        self.failure = failure


class DurabilityError(SettleError):
    """Too few replicas acknowledged a transition within the timeout.

    The outcome is uncertain: the write happened on the primary but may be lost on a
    failover. Treat the operation as provisional and read it back before acting on it.
    """

    def __init__(
        self, message: str, *, operation_id: str | None, acknowledged: int, required: int
    ) -> None:
        super().__init__(message, operation_id=operation_id)
        self.acknowledged = acknowledged
        self.required = required


class BackendError(SettleError):
    """Redis could not be reached or refused the command (the cause is chained).

    Whether a settlement sent before the failure ran is unknown; settlement calls are safe
    to repeat with the same arguments. ``code`` is the Redis error code when the server
    answered with an error (``NOGROUP``, ``WRONGTYPE``...), else ``""``.
    """

    def __init__(self, message: str, *, operation_id: str | None = None, code: str = "") -> None:
        super().__init__(message, operation_id=operation_id)
        self.code = code


class ConfigurationError(SettleError):
    """The configuration does not fit the server or the namespace (shard count, version)."""


class InvalidOption(InvalidInput, ConfigurationError):
    """A durability option a cursor store, a progress store or a stream consumer was built
    with is not acceptable (``min_replicas``, ``replica_timeout``, ``allow_eviction``), or a
    settler's ``min_replicas`` is past what ``WAIT`` takes or its ``replica_timeout`` past
    3600 s (a settler's other bad options are refused by :class:`~settle.SettleConfig`, as
    a plain :class:`InvalidInput`).

    An :class:`InvalidInput`, as every bad option of every part is: catch that one. Also a
    :class:`ConfigurationError`, as these always were. Nothing was sent to Redis."""


class CorruptRecord(SettleError):
    """The record in Redis is not a settle record (wrong type or missing fields), or a
    quarantine entry is not one this settle version can read (the message names it).

    Nothing was written. Inspect the key; settle never overwrites what it cannot read.
    """


class QuarantineNotFound(SettleError, LookupError):
    """No quarantine entry has that id in this namespace."""


class NotGuarded(SettleError, LookupError):
    """The request has no attempt of settle's: it is not guarded (no key, or not a guarded
    method or path), or its ``"settle"`` entry holds something else. A ``LookupError`` too,
    as it was before it derived from :class:`SettleError`."""
