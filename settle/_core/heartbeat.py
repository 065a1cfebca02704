"""How often a running attempt renews its lease: every heartbeat (the decorators', the HTTP
guards') and a renewal's wait for its replicas are cut from this one share of the lease."""

from __future__ import annotations

__all__ = ["PER_LEASE", "interval", "interval_ms"]

#: Renewals per lease: a third of the lease apart, so that two may fail and the lease holds.
PER_LEASE = 3


def interval(lease: float) -> float:
    """Seconds from one renewal of ``lease`` seconds (sent) to the next."""
    return lease / PER_LEASE


def interval_ms(lease_ms: int) -> int:
    """:func:`interval` of a lease in milliseconds, whole and at least 1 (a ``WAIT`` bound)."""
    return max(1, lease_ms // PER_LEASE)
