"""settle's instruments: the counters (:class:`Tally`, observable counters counted in this
process) and histograms with their names, units and attributes (:class:`Instruments`),
and the histograms' bucket boundaries."""

from __future__ import annotations

import threading
from typing import Any

__all__ = [
    "CALL_BUCKETS",
    "MESSAGING",
    "MESSAGING_BUCKETS",
    "NS",
    "Instruments",
    "Tally",
    "forked",
]

#: The namespace attribute of every settle instrument.
NS = "settle.namespace"
#: The attributes a delivery settlement's measurements carry.
MESSAGING = (
    "messaging.system",
    "messaging.operation.type",
    "messaging.operation.name",
    "messaging.destination.name",
    "messaging.consumer.group.name",
)


class Tally:
    """One counter, counted in this process and reported through an *observable* counter
    when the application's metric reader collects.

    A synchronous counter's ``add`` costs the SDK about 10 µs (its attributes hashed, a
    measurement built and handed to every reader) on every call; a tally is a dict update
    under a lock, and the SDK's work happens once per collection instead. The readers see
    the same monotonic sum with the same attributes. ``names`` are the attributes, in the
    order :meth:`add` is given their values (None: the attribute is absent)."""

    __slots__ = ("_counts", "_lock", "_names", "_observation")

    def __init__(
        self,
        meter: Any,
        observation: Any,
        name: str,
        unit: str,
        description: str,
        names: tuple[str, ...],
    ) -> None:
        self._names = names
        self._observation = observation  # the API's ``Observation``
        self._counts: dict[tuple[Any, ...], int] = {}
        self._lock = threading.Lock()
        _TALLIES.append(self)
        meter.create_observable_counter(
            name, callbacks=[self._observe], unit=unit, description=description
        )

    def add(self, *values: Any) -> None:
        with self._lock:
            self._counts[values] = self._counts.get(values, 0) + 1

    def _observe(self, _options: Any) -> list[Any]:
        with self._lock:
            counted = list(self._counts.items())
        names, observation = self._names, self._observation
        return [
            observation(n, {k: v for k, v in zip(names, values, strict=True) if v is not None})
            for values, n in counted
        ]

    def _forked(self) -> None:
        # The child is another process: its counts start at zero, and a lock another
        # thread held at the fork would never be released in it.
        self._lock = threading.Lock()
        self._counts = {}


_TALLIES: list[Tally] = []


def forked() -> None:
    """In a child process after a fork: every tally starts again at zero."""
    for tally in _TALLIES:
        tally._forked()


#: The bucket boundaries (seconds) the histograms ask for. Without them the SDK's default
#: boundaries (0, 5, 10, 25, ... 10000: made for milliseconds) put every settle call, a
#: fraction of a millisecond to a few on a near Redis, in its first bucket (0, 5 s], and a
#: percentile read from the buckets said about 5 s. A call's: 100 µs to 10 s (a retried
#: or ``min_replicas`` call waits seconds), at most 2.5 times apart.
CALL_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
#: ``messaging.client.operation.duration``'s, as the messaging semantic conventions give them.
MESSAGING_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)


class Instruments:
    """Every instrument settle reports, made once on the ``settle`` meter; ``observation``
    is the API's ``Observation`` (this module imports nothing of OpenTelemetry)."""

    def __init__(self, meter: Any, observation: Any) -> None:
        def tally(name: str, unit: str, description: str, *names: str) -> Tally:
            return Tally(meter, observation, name, unit, description, names)

        self.reservations = tally(
            "settle.reservations",
            "{reservation}",
            "Reservations by outcome",
            NS,
            "settle.outcome",
        )
        self.settlements = tally(
            "settle.settlements",
            "{settlement}",
            "Settlements by action and verdict",
            NS,
            "settle.action",
            "settle.verdict",
        )
        self.quarantined = tally(
            "settle.quarantine.entries",
            "{entry}",
            "Quarantine entries written, by kind",
            NS,
            "settle.quarantine.kind",
            "settle.action",
        )
        self.quarantine_repeats = tally(
            "settle.quarantine.repeats",
            "{delivery}",
            "Rejected responses delivered again (kept as their first entry), by kind",
            NS,
            "settle.quarantine.kind",
            "settle.action",
        )
        self.takeovers = tally(
            "settle.takeovers",
            "{takeover}",
            "Takeovers by reason",
            NS,
            "settle.takeover.reason",
        )
        self.leases_lost = tally(
            "settle.leases.lost",
            "{lease}",
            "Renewals that found the lease lost",
            NS,
            "settle.renew.reason",
        )
        self.renewals_failed = tally(
            "settle.renewals.failed",
            "{renewal}",
            "Renewals that raised (store unavailable)",
            NS,
            "error.type",
        )
        self.http = tally(
            "settle.http.requests",
            "{request}",
            "Guarded HTTP requests by outcome",
            NS,
            "settle.http.outcome",
        )
        self.delivery_settlements = tally(
            "settle.progress.settlements",
            "{settlement}",
            "Delivery settlements by outcome",
            *MESSAGING,
            "error.type",
            "settle.outcome",
        )
        self.call_duration = meter.create_histogram(
            "settle.call.duration",
            "s",
            "Duration of settle calls",
            explicit_bucket_boundaries_advisory=CALL_BUCKETS,
        )
        self.messaging_duration = meter.create_histogram(
            "messaging.client.operation.duration",
            "s",
            "Duration of delivery settlements",
            explicit_bucket_boundaries_advisory=MESSAGING_BUCKETS,
        )
