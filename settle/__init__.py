"""settle: settle retried operations safely.

One Redis record per operation holds an immutable request fingerprint, a principal binding
and a fencing generation; Lua scripts validate and transition it atomically. A completed
success is absorbing, and every stale or misbound response goes to a quarantine stream.
"""

from settle._async.settler import AsyncQuarantine, AsyncSettler
from settle._sync.settler import Quarantine, Settler
from settle.config import SettleConfig
from settle.decorator import Attempt
from settle.errors import (
    BackendError,
    BindingMismatch,
    ConfigurationError,
    CorruptRecord,
    DurabilityError,
    FingerprintError,
    FingerprintMismatch,
    InvalidInput,
    OperationFailed,
    OperationInProgress,
    QuarantineNotFound,
    ResultTooLarge,
    SettleError,
    StaleAttempt,
)
from settle.fingerprint import fingerprint
from settle.models import (
    Action,
    AttemptObservation,
    InProgress,
    OperationRecord,
    QuarantineEntry,
    QuarantineKind,
    Renewal,
    Replay,
    Reservation,
    Reserved,
    Settlement,
    State,
    StoredFailure,
    Verdict,
)

__version__ = "0.1.0"

__all__ = [
    "Action",
    "AsyncQuarantine",
    "AsyncSettler",
    "Attempt",
    "AttemptObservation",
    "BackendError",
    "BindingMismatch",
    "ConfigurationError",
    "CorruptRecord",
    "DurabilityError",
    "FingerprintError",
    "FingerprintMismatch",
    "InProgress",
    "InvalidInput",
    "OperationFailed",
    "OperationInProgress",
    "OperationRecord",
    "Quarantine",
    "QuarantineEntry",
    "QuarantineKind",
    "QuarantineNotFound",
    "Renewal",
    "Replay",
    "Reservation",
    "Reserved",
    "ResultTooLarge",
    "SettleConfig",
    "SettleError",
    "Settlement",
    "Settler",
    "StaleAttempt",
    "State",
    "StoredFailure",
    "Verdict",
    "fingerprint",
]
