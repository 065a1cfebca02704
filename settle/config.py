"""``SettleConfig``: one namespace's settings, validated once."""

from __future__ import annotations

import re

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from settle._core.layout import LOG_MAX
from settle._input import InputModel
from settle.errors import InvalidInput

__all__ = ["NAMESPACE_RULE", "SettleConfig", "check_namespace"]


#: The largest shard count a namespace can have. A client that finds its namespace's
#: metadata gone looks at every shard state up to it before it creates the metadata again.
MAX_SHARDS = 4096
#: How old (ms, server clock) a namespace's metadata must be for a shard without state to
#: count as lost: the metadata's creator claims every shard right after making it, and a
#: settler started meanwhile (or ``settle doctor``) finds some not claimed yet.
CLAIM_GRACE_MS = 300_000
#: The longest retention, in seconds (1000 years): far past any dispute window, and far
#: below the 2^62 ms the scripts take (an expiry must fit Redis's 64-bit integers).
MAX_RETENTION = 1000 * 365.25 * 86_400
#: What a namespace may hold (it is part of every key name), and that rule in words, for
#: the error that refuses one.
_NAMESPACE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
NAMESPACE_RULE = "1 to 64 characters of A-Z a-z 0-9 _ . -"


def check_namespace(namespace: object, error: type[InvalidInput] = InvalidInput) -> str:
    """``namespace`` when settle takes it, else ``error`` that says :data:`NAMESPACE_RULE`:
    the one rule of the stores that take a namespace without a :class:`SettleConfig` (the
    cursor store's, and the progress store's with its own :class:`InvalidInput` subclass)."""
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise error(f"namespace must be {NAMESPACE_RULE}")
    return namespace


class SettleConfig(InputModel):
    """Settings of one namespace.

    ``shards`` is fixed when the namespace is first used; a different value later is an
    error at start-up (re-sharding would move records to other keys and lose them).
    ``retention`` must cover the whole retry and fencing horizon: a record that expired
    cannot replay, and a late response for it is quarantined as ``unknown_operation``.

    A bad value raises :class:`~settle.errors.InvalidInput` (a ``SettleError`` and a
    ``ValueError``, as pydantic's ``ValidationError`` is), naming each bad field; the
    ``ValidationError`` is its ``__cause__``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str = "default"
    shards: int = Field(default=16, ge=1, le=MAX_SHARDS)
    lease: float = Field(default=30.0, gt=0, le=86_400)
    """Seconds a reservation owns the record without renewal (server clock)."""
    retention: float = Field(default=86_400.0, gt=0, le=MAX_RETENTION)
    """Seconds a record and its attempt log are kept after their last transition (at most
    1000 years: the scripts refuse an expiry past what Redis's 64-bit integers hold)."""
    max_result_bytes: int = Field(default=1 << 20, ge=1)
    quarantine_payload_bytes: int = Field(default=64 << 10, ge=0)
    """How much of a rejected payload the quarantine keeps (size and SHA-256 always)."""
    quarantine_maxlen: int | None = Field(default=None, ge=1, le=2**53)
    """Cap on each shard's quarantine stream; None keeps every entry (export, then trim)."""
    attempt_log_size: int = Field(default=64, ge=2, le=LOG_MAX)
    """Entries kept in each operation's attempt log (the newest). At most 1000: the log lives
    in the record's packed value, which a script decodes whole (Lua's stack holds ~8000
    values; an entry is 6). At least 2: a ``mark_provisional`` repeated after its reply was
    lost is told from a stale one by its entry in the log (rule S13), and the takeover that
    may come between the two adds an entry of its own."""
    min_replicas: int = Field(default=0, ge=0)
    """With N > 0 every transition is followed by ``WAIT N replica_timeout`` (a renewal's
    by ``WAIT N`` a third of its lease when that is shorter: its heartbeat's next is due)."""
    replica_timeout: float = Field(default=1.0, gt=0)
    allow_eviction: bool = False
    """Accept a server whose ``maxmemory-policy`` may evict settle's records (refused at
    start-up otherwise; a warning is logged once). An evicted completed record runs its
    operation again: use ``noeviction``."""

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not _NAMESPACE.fullmatch(value):
            raise PydanticCustomError("namespace", "must be {rule}", {"rule": NAMESPACE_RULE})
        return value

    @model_validator(mode="after")
    def _retention_covers_lease(self) -> SettleConfig:
        if self.retention < self.lease:
            raise ValueError("retention must be at least the lease")
        return self

    @property
    def lease_ms(self) -> int:
        return max(1, round(self.lease * 1000))

    @property
    def retention_ms(self) -> int:
        return max(1, round(self.retention * 1000))
