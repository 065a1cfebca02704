"""The floor and gaps scripts against the rule they implement, on a real progress server:
after any interleaving of applies, dead letters and observations of a sparse stream,
- every existing delivery at or below the floor is applied or dead-lettered;
- the floor is as far as the listing proves (the next existing delivery is not done);
- the exact done deliveries above the floor are kept; gaps are exactly the existing,
  unapplied deliveries below the highest done one."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from settle.progress import DeliveryId, EmissionId, ProgressStore, ProviderScope

SCOPE = ProviderScope("orders", "billing", "inc1")

ops_strategy = st.lists(
    st.tuples(st.sampled_from(["apply", "dead", "observe"]), st.integers(0, 63)), max_size=30
)


@given(exist=st.sets(st.integers(0, 40), min_size=1, max_size=16), ops=ops_strategy)
def test_floor_and_gaps_follow_the_listing(progress_server, exist, ops):
    store = ProgressStore.from_url(
        progress_server.url, consumer=f"p{uuid.uuid4().hex[:10]}", namespace="prop"
    )
    ids = [DeliveryId(f"100-{n}") for n in sorted(exist)]  # sparse positions
    done: set[DeliveryId] = set()
    floor: DeliveryId | None = None
    try:
        for op, k in [*ops, ("observe", 0)]:
            d = ids[k % len(ids)]
            if op == "apply":
                store.apply(SCOPE, d, EmissionId(f"e{d.seq}"), lambda ctx: None)
                done.add(d)
            elif op == "dead":
                reply = store.dead_letter(SCOPE, d, None, reason="poison", delivery_count=9)
                assert reply.code in ("dead_lettered", "covered")
                done.add(d)
            else:
                listing = [x for x in ids if floor is None or floor < x]
                p = store.observe(
                    SCOPE, floor, listing, last_delivered=None, oldest_pending=None, pending=0
                )
                floor = p.floor
                below = [x for x in ids if floor is not None and x <= floor]
                above = [x for x in ids if floor is None or floor < x]
                assert set(below) <= done
                assert not above or above[0] not in done
                assert set(p.applied_above_floor) | set(p.dead_lettered_above_floor) == {
                    x for x in done if floor is None or floor < x
                }
                top = max((x for x in done if x in above), default=None)
                assert set(p.gaps) == {
                    x for x in above if x not in done and top is not None and x < top
                }
                assert p.replay_from.after == floor
    finally:
        store.close()
