"""What progress reads return: the progress record, the provider floor, settle intents,
deferred deliveries, settlement receipts and the outcome of ``apply``. Immutable values."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from settle._input import key_part
from settle.progress.errors import InvalidDelivery
from settle.progress.identity import (
    AttemptId,
    DeliveryId,
    EmissionId,
    ProviderScope,
    ReplayCursor,
    check_delivery,
)

__all__ = [
    "Applied",
    "ApplyStatus",
    "DeferredDelivery",
    "EffectContext",
    "IntentKind",
    "Progress",
    "ProviderFloor",
    "SettleIntent",
    "SettlementOutcome",
    "SettlementReceipt",
]


class IntentKind(StrEnum):
    """What a settle intent asks of the provider."""

    ACK = "ack"  # the delivery is applied: acknowledge it
    DEAD_LETTER = "dead_letter"  # quarantined: move it to the dead-letter stream, then ack
    DEFER = "defer"  # set aside (durably recorded): stop redelivery, keep it unapplied
    RELEASE = "release"  # negative settlement: hand it back for redelivery now


def check_kind(value: object) -> IntentKind:
    """``value`` when it is an :class:`IntentKind`; :class:`InvalidDelivery` otherwise (the
    string ``"ack"`` is not taken for one)."""
    if isinstance(value, IntentKind):
        return value
    raise InvalidDelivery(f"expected an IntentKind, got {type(value).__name__}")


class SettlementOutcome(StrEnum):
    """What the provider said to a fenced settlement."""

    ACKED = "acked"
    RELEASED = "released"
    NOT_PENDING = "not_pending"  # already settled (by this worker, or by the one that took it)
    NOT_OWNER = "not_owner"  # another worker owns the delivery now: refused
    RECLAIMED = "reclaimed"  # redelivered since this worker was handed it: refused
    NO_GROUP = "no_group"  # the group or the stream is gone (the provider lost its data)

    @property
    def conclusive(self) -> bool:
        """Whether the settle intent is done with (the delivery is no longer pending)."""
        return self in (SettlementOutcome.ACKED, SettlementOutcome.NOT_PENDING)


@dataclass(frozen=True, slots=True)
class ProviderFloor:
    """The provider's own delivery state, as last observed (it may be ahead of or behind the
    application's floor: a deferred delivery is settled with the provider but unapplied)."""

    last_delivered: DeliveryId | None
    oldest_pending: DeliveryId | None
    pending: int
    observed_at: datetime


@dataclass(frozen=True, slots=True)
class SettleIntent:
    """A settlement progress holds to be done. ``reason``: a dead_letter's or a defer's
    (``recover()`` writes it in the stream-side dead-letter entry); ``'unknown'`` for one
    written before intents kept their reason; ``''`` for an ack."""

    delivery: DeliveryId
    kind: IntentKind
    emission: EmissionId | None
    since: datetime
    reason: str = ""


@dataclass(frozen=True, slots=True)
class DeferredDelivery:
    delivery: DeliveryId
    emission: EmissionId
    reason: str
    since: datetime


@dataclass(frozen=True, slots=True)
class Progress:
    """The durable progress of one consumer in one provider scope (SPEC §10).

    ``floor``: every delivery at or below it is applied or dead-lettered (cumulative).
    ``applied_above_floor``: exact applied deliveries above the floor.
    ``dead_lettered_above_floor``: quarantined deliveries above the floor (resolved, not applied).
    ``gaps``: deliveries known to exist below an applied one and not applied (or handed out
    and lost): they stop the floor, so a later position never implies the prefix, until
    each is applied or dead-lettered, whether or not its stream entry is still there.
    ``deferred``: deliveries set aside, unapplied: each stops the floor the same way.
    ``provider_floor``: the provider's own state, as last observed.
    ``replay_from``: where a replay of this scope must start.
    """

    consumer: str
    scope: ProviderScope
    floor: DeliveryId | None
    applied_above_floor: tuple[DeliveryId, ...]
    dead_lettered_above_floor: tuple[DeliveryId, ...]
    gaps: tuple[DeliveryId, ...]
    provider_floor: ProviderFloor | None
    replay_from: ReplayCursor
    intents: tuple[SettleIntent, ...]
    deferred: tuple[DeferredDelivery, ...]
    version: int
    updated_at: datetime | None

    def covers(self, delivery: DeliveryId) -> bool:
        """Whether durable progress covers ``delivery`` (applied or dead-lettered). Not a
        deferral at or below the floor: the floor never passes one, but an earlier settle
        let it pass one whose entry was trimmed, still unapplied."""
        delivery = check_delivery(delivery)
        if self.floor is not None and delivery <= self.floor:
            return all(d.delivery != delivery for d in self.deferred)
        return delivery in self.applied_above_floor or delivery in self.dead_lettered_above_floor

    def to_json(self) -> dict[str, Any]:
        pf = self.provider_floor
        return {
            "consumer": self.consumer,
            "scope": {
                "stream": self.scope.stream,
                "group": self.scope.group,
                "incarnation": self.scope.incarnation,
            },
            "floor": _s(self.floor),
            "applied_above_floor": [d.value for d in self.applied_above_floor],
            "dead_lettered_above_floor": [d.value for d in self.dead_lettered_above_floor],
            "gaps": [d.value for d in self.gaps],
            "provider_floor": None
            if pf is None
            else {
                "last_delivered": _s(pf.last_delivered),
                "oldest_pending": _s(pf.oldest_pending),
                "pending": pf.pending,
                "observed_at": pf.observed_at.isoformat(),
            },
            "replay_from": _s(self.replay_from.after),
            "intents": [
                {"delivery": i.delivery.value, "kind": i.kind.value, "since": i.since.isoformat()}
                for i in self.intents
            ],
            "deferred": [
                {
                    "delivery": d.delivery.value,
                    "emission": d.emission.value,
                    "reason": d.reason,
                    "since": d.since.isoformat(),
                }
                for d in self.deferred
            ],
            "version": self.version,
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
        }


def _s(value: DeliveryId | None) -> str | None:
    return value.value if value else None


class ApplyStatus(StrEnum):
    APPLIED = "applied"  # the effect ran now and progress recorded it
    DUPLICATE = "duplicate"  # the emission was applied before (another delivery): no effect ran
    COVERED = "covered"  # progress already covered this delivery: no effect ran


@dataclass(frozen=True, slots=True)
class Applied:
    """The outcome of ``apply``: what happened and the durable progress after it."""

    status: ApplyStatus
    delivery: DeliveryId
    emission: EmissionId
    attempt: AttemptId
    progress: Progress
    dead_lettered: bool = False


@dataclass(frozen=True, slots=True)
class EffectContext:
    """What an effect is handed. Make the effect idempotent under ``idempotency_key`` (it is
    the same for every redelivery of the emission, in every worker and stream incarnation)."""

    consumer: str
    emission: EmissionId
    delivery: DeliveryId
    attempt: AttemptId
    fields: dict[str, bytes] = field(default_factory=dict)
    """The message's fields: names as text, values as stored (bytes)."""

    @property
    def idempotency_key(self) -> str:
        """``<consumer>:<emission id>``, one key per (consumer, emission). A ``:`` or ``%``
        in the consumer name is written ``%3A`` / ``%25``, so the first colon always
        separates the two (consumer ``billing:eu`` with emission ``order-1`` and consumer
        ``billing`` with emission ``eu:order-1`` gave the same key, and an effect store
        deduplicating by it skipped the second effect). A name with neither keeps its key;
        the emission id is never escaped (cursor keys escape the stream by the same rule,
        :func:`settle._input.key_part`)."""
        return f"{key_part(self.consumer)}:{self.emission.value}"


@dataclass(frozen=True, slots=True)
class SettlementReceipt:
    """What the provider said to one settlement, as recorded durably in progress."""

    delivery: DeliveryId
    kind: IntentKind
    outcome: SettlementOutcome
    worker: str
    owner: str | None
    delivery_count: int
    acknowledged: int
    receipt_id: str
