"""settle: settle retried operations safely.

One Redis record per operation holds an immutable request fingerprint, a principal binding
and a fencing generation; Lua scripts validate and transition it atomically. A completed
success is absorbing, and every stale or misbound response goes to a quarantine stream.
"""

from settle._async.settler import AsyncSettler
from settle._sync.settler import Settler
from settle.attempt import Attempt
from settle.config import SettleConfig
from settle.errors import (
    BackendError,
    BindingMismatch,
    ConfigurationError,
    DurabilityError,
    FingerprintError,
    FingerprintMismatch,
    OperationFailed,
    OperationInProgress,
    SettleError,
    StaleAttempt,
)
from settle.fingerprint import fingerprint
from settle.models import (
    InProgress,
    OperationRecord,
    QuarantineEntry,
    QuarantineKind,
    Replay,
    Reservation,
    Reserved,
    Settlement,
    State,
    Verdict,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncSettler",
    "Attempt",
    "BackendError",
    "BindingMismatch",
    "ConfigurationError",
    "DurabilityError",
    "FingerprintError",
    "FingerprintMismatch",
    "InProgress",
    "OperationFailed",
    "OperationInProgress",
    "OperationRecord",
    "QuarantineEntry",
    "QuarantineKind",
    "Replay",
    "Reservation",
    "Reserved",
    "SettleConfig",
    "SettleError",
    "Settlement",
    "Settler",
    "StaleAttempt",
    "State",
    "Verdict",
    "fingerprint",
]
