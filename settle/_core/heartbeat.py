"""How often a running attempt renews its lease: every heartbeat (the decorators', the HTTP
guards') and a renewal's wait for its replicas are cut from this one share of the lease."""

from __future__ import annotations

__all__ = ["PER_LEASE", "first_renewal", "interval", "interval_ms"]

#: Renewals per lease: a third of the lease apart, so that two may fail and the lease holds.
PER_LEASE = 3


def interval(lease: float) -> float:
    """Seconds from one renewal of ``lease`` seconds (sent) to the next."""
    return lease / PER_LEASE


def interval_ms(lease_ms: int) -> int:
    """:func:`interval` of a lease in milliseconds, whole and at least 1 (a ``WAIT`` bound)."""
    return max(1, lease_ms // PER_LEASE)


def first_renewal(lease: float, reserving: float, now: float) -> float:
    """Seconds from ``now`` to the first renewal of a ``lease`` whose ``reserve`` was sent at
    ``reserving`` (on the clock of ``now``): a heartbeat (``lease / 3``) after it was sent,
    as each later renewal is due a heartbeat after the one before was sent, at once when
    that has passed. Not after ``reserve`` returned: with ``min_replicas`` it may have
    waited up to ``replica_timeout`` for a replica, and a first renewal due a heartbeat
    after that let a lease of less than ``replica_timeout * 3 / 2`` lapse before it."""
    return max(0.0, reserving + interval(lease) - now)
