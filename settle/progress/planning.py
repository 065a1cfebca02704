"""Settlement planning: which provider settlements durable progress authorizes. Pure.

- individual: one delivery, covered by progress (applied or dead-lettered);
- cumulative: everything up to a position; authorized only up to the cumulative floor, so it
  never passes a gap (a later applied delivery never implies the prefix), and never past a
  deferral an earlier settle's floor passed (it is not covered until it is applied);
- batch: several deliveries at once; every member must be covered.
Negative settlement (release), defer and dead-letter are separate operations with their own
durable records; they are never planned from progress.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from settle.errors import InvalidInput
from settle.progress.errors import InvalidDelivery, SettlementNotAuthorized
from settle.progress.identity import DeliveryId, check_delivery
from settle.progress.models import IntentKind, Progress, check_kind

__all__ = [
    "Batch",
    "Cumulative",
    "Individual",
    "SettlementPlan",
    "authorize_batch",
    "authorize_cumulative",
    "authorize_individual",
    "authorize_settlement",
    "plan_settlements",
]


@dataclass(frozen=True, slots=True)
class Individual:
    delivery: DeliveryId


@dataclass(frozen=True, slots=True)
class Cumulative:
    through: DeliveryId


@dataclass(frozen=True, slots=True)
class Batch:
    members: tuple[DeliveryId, ...]


@dataclass(frozen=True, slots=True)
class SettlementPlan:
    """``settlements`` are authorized; ``withheld`` are pending deliveries progress does not
    cover (they must be applied, dead-lettered, deferred or released first)."""

    settlements: tuple[Individual | Cumulative | Batch, ...]
    withheld: tuple[DeliveryId, ...]


def _progress(value: object) -> Progress:
    if isinstance(value, Progress):
        return value
    raise InvalidDelivery(f"expected a Progress (store.read(scope)), got {type(value).__name__}")


def _deliveries(values: object, what: str) -> list[DeliveryId]:
    """Every member of ``values`` as a :class:`DeliveryId` (a str is not a list of ids)."""
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise InvalidDelivery(
            f"{what} must be an iterable of DeliveryId, got {type(values).__name__}"
        )
    return [check_delivery(v) for v in values]


def authorize_individual(progress: Progress, delivery: DeliveryId) -> Individual:
    progress, delivery = _progress(progress), check_delivery(delivery)
    if not progress.covers(delivery):
        raise SettlementNotAuthorized(
            f"delivery {delivery} is not covered by durable progress; apply it first",
            uncovered=[delivery],
        )
    return Individual(delivery)


def authorize_settlement(progress: Progress, delivery: DeliveryId, kind: IntentKind) -> None:
    """What durable progress must hold before the provider is told ``kind`` for
    ``delivery`` (SPEC 10): an acknowledgement or a dead-letter removes the delivery from the
    provider's pending list, so progress must cover it (applied, dead-lettered, or below the
    floor); a deferral stops its redelivery, so progress must hold it as deferred (or cover
    it). A release hands it back for redelivery and needs nothing."""
    progress, delivery, kind = _progress(progress), check_delivery(delivery), check_kind(kind)
    if kind is IntentKind.RELEASE or progress.covers(delivery):
        return
    if kind is IntentKind.DEFER and any(d.delivery == delivery for d in progress.deferred):
        return
    needs = "deferred (defer it first)" if kind is IntentKind.DEFER else "applied or dead-lettered"
    raise SettlementNotAuthorized(
        f"delivery {delivery} is not {needs} in durable progress: a {kind.value} would let "
        "the provider drop it unrecorded; nothing was settled",
        uncovered=[delivery],
    )


def _deferred_through(progress: Progress, through: DeliveryId) -> list[DeliveryId]:
    """Deferrals at or below ``through``: at or below the floor too only where an earlier
    settle let the floor pass a trimmed one, which stays uncovered until it is applied."""
    return sorted(d.delivery for d in progress.deferred if d.delivery <= through)


def authorize_cumulative(progress: Progress, through: DeliveryId) -> Cumulative:
    progress, through = _progress(progress), check_delivery(through)
    if progress.floor is None or progress.floor < through:
        uncovered = [g for g in progress.gaps if g <= through]
        raise SettlementNotAuthorized(
            f"a cumulative settlement through {through} passes the floor {progress.floor}; "
            "settle at most through the floor (gaps stop it)",
            uncovered=uncovered or [through],
        )
    deferred = _deferred_through(progress, through)
    if deferred:
        raise SettlementNotAuthorized(
            f"a cumulative settlement through {through} passes {len(deferred)} deferred "
            "delivery(ies) not applied yet (an earlier settle let the floor pass them); "
            "settle them one by one",
            uncovered=deferred,
        )
    return Cumulative(through)


def authorize_batch(progress: Progress, members: Iterable[DeliveryId]) -> Batch:
    progress = _progress(progress)
    ordered = tuple(sorted(set(_deliveries(members, "members"))))
    uncovered = [d for d in ordered if not progress.covers(d)]
    if uncovered:
        raise SettlementNotAuthorized(
            f"{len(uncovered)} member(s) of the batch are not covered by durable progress; "
            "settle the covered ones only",
            uncovered=uncovered,
        )
    return Batch(ordered)


def plan_settlements(
    progress: Progress,
    pending: Iterable[DeliveryId],
    *,
    cumulative: bool = False,
    batch_size: int = 64,
) -> SettlementPlan:
    """Plan settlements for ``pending`` deliveries: a cumulative one through the floor when
    the provider supports it (none when a deferral lies at or below the floor), then
    batches of the covered ones above it. ``batch_size``: an int (below 1 is 1)."""
    progress = _progress(progress)
    if not isinstance(cumulative, bool):
        raise InvalidInput(f"cumulative must be a bool, got {type(cumulative).__name__}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise InvalidInput(f"batch_size must be an int, got {type(batch_size).__name__}")
    ordered = sorted(set(_deliveries(pending, "pending")))
    settlements: list[Individual | Cumulative | Batch] = []
    covered = [d for d in ordered if progress.covers(d)]
    withheld = tuple(d for d in ordered if not progress.covers(d))
    floor = progress.floor
    if (
        cumulative
        and floor is not None
        and any(d <= floor for d in covered)
        and not _deferred_through(progress, floor)
    ):
        settlements.append(authorize_cumulative(progress, floor))
        covered = [d for d in covered if floor < d]
    for start in range(0, len(covered), max(1, batch_size)):
        chunk = covered[start : start + max(1, batch_size)]
        if len(chunk) == 1:
            settlements.append(authorize_individual(progress, chunk[0]))
        else:
            settlements.append(authorize_batch(progress, chunk))
    return SettlementPlan(tuple(settlements), withheld)
