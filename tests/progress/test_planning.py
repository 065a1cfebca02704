"""Settlement planning (pure): a cumulative settlement never passes a gap, a batch needs
every member covered, and a plan only ever touches covered deliveries."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from settle.errors import SettleError
from settle.progress import (
    DeliveryId,
    Progress,
    ProviderScope,
    SettlementNotAuthorized,
    plan_settlements,
)
from settle.progress.identity import ReplayCursor
from settle.progress.planning import (
    Batch,
    Cumulative,
    Individual,
    authorize_batch,
    authorize_cumulative,
    authorize_individual,
)

SCOPE = ProviderScope("orders", "billing", "inc1")


def d(n: int) -> DeliveryId:
    return DeliveryId(f"1000-{n}")


def progress(floor: int | None, applied=(), dead=(), gaps=()) -> Progress:
    return Progress(
        consumer="billing",
        scope=SCOPE,
        floor=d(floor) if floor is not None else None,
        applied_above_floor=tuple(d(n) for n in applied),
        dead_lettered_above_floor=tuple(d(n) for n in dead),
        gaps=tuple(d(n) for n in gaps),
        provider_floor=None,
        replay_from=ReplayCursor(d(floor) if floor is not None else None),
        intents=(),
        deferred=(),
        version=1,
        updated_at=None,
    )


# 1, 3, 4 applied, 2 pending: the floor is 1 and 2 is a gap.
OUT_OF_ORDER = progress(1, applied=(3, 4), gaps=(2,))


def test_cumulative_never_passes_a_gap():
    assert authorize_cumulative(OUT_OF_ORDER, d(1)) == Cumulative(d(1))
    with pytest.raises(SettlementNotAuthorized) as err:
        authorize_cumulative(OUT_OF_ORDER, d(4))
    assert err.value.uncovered == [d(2)]
    assert isinstance(err.value, SettleError)
    with pytest.raises(SettlementNotAuthorized):
        authorize_cumulative(progress(None, applied=(1,)), d(1))


def test_batch_needs_every_member_covered():
    assert authorize_batch(OUT_OF_ORDER, [d(4), d(3), d(1)]) == Batch((d(1), d(3), d(4)))
    with pytest.raises(SettlementNotAuthorized) as err:
        authorize_batch(OUT_OF_ORDER, [d(2), d(3), d(5)])
    assert err.value.uncovered == [d(2), d(5)]


def test_individual_needs_coverage_and_dead_letters_count():
    assert authorize_individual(OUT_OF_ORDER, d(3)) == Individual(d(3))
    assert authorize_individual(progress(1, dead=(2,)), d(2)) == Individual(d(2))
    with pytest.raises(SettlementNotAuthorized):
        authorize_individual(OUT_OF_ORDER, d(2))


def test_plan_uses_cumulative_through_the_floor_then_batches():
    plan = plan_settlements(OUT_OF_ORDER, [d(n) for n in range(1, 6)], cumulative=True)
    assert plan.settlements == (Cumulative(d(1)), Batch((d(3), d(4))))
    assert plan.withheld == (d(2), d(5))
    plain = plan_settlements(OUT_OF_ORDER, [d(1), d(3)], batch_size=1)
    assert plain.settlements == (Individual(d(1)), Individual(d(3)))


@given(
    floor=st.none() | st.integers(0, 20),
    marks=st.lists(st.sampled_from("adn"), min_size=40, max_size=40),
    pending=st.sets(st.integers(0, 39)),
    cumulative=st.booleans(),
    batch=st.integers(1, 5),
)
def test_a_plan_touches_only_covered_deliveries(floor, marks, pending, cumulative, batch):
    lo = -1 if floor is None else floor
    applied = [n for n in range(lo + 1, 40) if marks[n] == "a"]
    dead = [n for n in range(lo + 1, 40) if marks[n] == "d"]
    p = progress(floor, applied=applied, dead=dead)
    plan = plan_settlements(p, [d(n) for n in pending], cumulative=cumulative, batch_size=batch)
    touched: set[DeliveryId] = set()
    for s in plan.settlements:
        if isinstance(s, Cumulative):
            assert p.floor is not None
            assert s.through <= p.floor
            touched |= {d(n) for n in pending if d(n) <= s.through}
        elif isinstance(s, Batch):
            touched |= set(s.members)
        else:
            touched.add(s.delivery)
    assert all(p.covers(x) for x in touched)
    assert touched | set(plan.withheld) == {d(n) for n in pending}
    assert not touched & set(plan.withheld)
