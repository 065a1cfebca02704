"""The identities of SPEC §10, each its own type so one is never passed for another.

- :class:`EmissionId` — the producer's logical identity of one emission. Effects are keyed
  by it: a redelivery, a reclaim or a re-publication after the provider lost its data all
  carry the same emission id, and none of them applies the effect again.
- :class:`DeliveryId` — the provider's identity of one delivery position (a Redis Streams
  entry id ``<ms>-<seq>``). Ordered; progress floors and gaps are made of these.
- :class:`AttemptId` — one delivery attempt (one worker handling one delivery once).
- :class:`SettlementAuthority` — what entitles a worker to settle a delivery with the
  provider right now (for Redis Streams: its consumer name and the delivery count it was
  handed). It is checked at settlement time and never stored as an identity.
- :class:`ReplayCursor` — where a replay of the scope must start (exclusive).
- :class:`ProviderScope` — the provider-side space positions belong to: a stream, its
  consumer group, and the stream's incarnation (a new one after the server lost its data,
  so positions of the old and the new stream are never compared).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass, field
from functools import total_ordering

from settle._input import has_control
from settle.progress.errors import InvalidDelivery

__all__ = [
    "AttemptId",
    "DeliveryId",
    "EmissionId",
    "ProviderScope",
    "ReplayCursor",
    "SettlementAuthority",
    "check_name",
]

MAX_ID_CHARS = 256
_ENTRY_ID = re.compile(r"\A([0-9]{1,20})-([0-9]{1,20})\Z")
#: The largest part of a Redis Streams entry id (each is an unsigned 64-bit integer).
_MAX_PART = 2**64 - 1


def check_name(value: object, what: str) -> str:
    """A 1-256 character name without control characters (ids, consumer names)."""
    if not isinstance(value, str):
        raise InvalidDelivery(f"{what} must be a str, got {type(value).__name__}")
    if not 1 <= len(value) <= MAX_ID_CHARS:
        raise InvalidDelivery(f"{what} must be 1 to {MAX_ID_CHARS} characters, got {len(value)}")
    if has_control(value):
        raise InvalidDelivery(f"{what} must not contain control characters")
    return value


@dataclass(frozen=True, slots=True)
class EmissionId:
    """The logical identity of one emission, assigned by the producer."""

    value: str

    def __post_init__(self) -> None:
        check_name(self.value, "emission id")

    def __str__(self) -> str:
        return self.value


@total_ordering
@dataclass(frozen=True, slots=True)
class DeliveryId:
    """A provider delivery position: a Redis Streams entry id ``<ms>-<seq>``."""

    value: str
    ms: int = field(init=False, compare=False, repr=False)
    seq: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        match = _ENTRY_ID.match(self.value) if isinstance(self.value, str) else None
        if match is None:
            raise InvalidDelivery(f"delivery id must look like <ms>-<seq>, got {self.value!r}")
        ms, seq = int(match.group(1)), int(match.group(2))
        if ms > _MAX_PART or seq > _MAX_PART or ms == seq == 0:
            # Redis refuses such ids (0-0 is never an entry's); accepted, one would be
            # taken for covered, or answered by the provider as an unrelated error.
            raise InvalidDelivery(
                f"delivery id must be a Redis Streams entry id above 0-0, each part at most "
                f"2**64 - 1, got {self.value!r}"
            )
        # Normalised (no leading zeros), so the Lua scripts can compare ids as digit strings.
        object.__setattr__(self, "value", f"{ms}-{seq}")
        object.__setattr__(self, "ms", ms)
        object.__setattr__(self, "seq", seq)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, DeliveryId):
            return NotImplemented
        return (self.ms, self.seq) < (other.ms, other.seq)

    def __str__(self) -> str:
        return self.value


def check_delivery(value: object) -> DeliveryId:
    """``value`` when it is a :class:`DeliveryId`; :class:`InvalidDelivery` otherwise (a
    plain string is never taken for one)."""
    if isinstance(value, DeliveryId):
        return value
    raise InvalidDelivery(f"expected a DeliveryId, got {type(value).__name__}")


@dataclass(frozen=True, slots=True)
class AttemptId:
    """One attempt at one delivery (a fresh one each time a worker takes it up)."""

    value: str

    @classmethod
    def new(cls) -> AttemptId:
        return cls(uuid.uuid4().hex)

    def __post_init__(self) -> None:
        check_name(self.value, "attempt id")

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class SettlementAuthority:
    """The right to settle one delivery now: held by ``worker`` at ``delivery_count``.

    The provider checks it when the settlement runs (the fenced acknowledgement); settle
    never records it as the identity of anything.
    """

    worker: str
    delivery: DeliveryId
    delivery_count: int

    def __post_init__(self) -> None:
        check_name(self.worker, "worker")
        if not isinstance(self.delivery, DeliveryId):
            raise InvalidDelivery(
                f"delivery must be a DeliveryId, got {type(self.delivery).__name__}"
            )
        count = self.delivery_count
        if type(count) is not int or not 0 <= count <= 2**53 - 1:
            raise InvalidDelivery(
                f"delivery_count must be an int from 0 to 2**53 - 1, got {count!r}"
            )


@dataclass(frozen=True, slots=True)
class ReplayCursor:
    """Replay of the scope starts after ``after`` (None: from the beginning)."""

    after: DeliveryId | None

    @property
    def exclusive_start(self) -> str:
        return f"({self.after.value}" if self.after else "-"


@dataclass(frozen=True, slots=True)
class ProviderScope:
    """A stream, its consumer group and the stream's incarnation."""

    stream: str
    group: str
    incarnation: str

    def __post_init__(self) -> None:
        check_name(self.stream, "stream")
        check_name(self.group, "consumer group")
        check_name(self.incarnation, "incarnation")

    @property
    def scope_id(self) -> str:
        raw = f"{self.stream}\x00{self.group}\x00{self.incarnation}".encode()
        return hashlib.sha256(raw).hexdigest()[:24]

    def __str__(self) -> str:
        return f"{self.stream}/{self.group}@{self.incarnation}"
