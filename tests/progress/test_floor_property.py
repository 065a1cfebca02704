"""The floor and gaps scripts against the rule they implement, on a real progress server:
after any interleaving of applies, dead letters and observations of a sparse stream,
- every existing delivery at or below the floor is applied or dead-lettered;
- the floor is as far as the listing proves (the next existing delivery is not done);
- the exact done deliveries above the floor are kept; gaps are exactly the existing,
  unapplied deliveries below the highest done one.

Then a state machine on a real stream: broker-side deletions and group moves end in
recorded outcomes (see ``StreamEdgesMachine``)."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import Counter

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from settle.embedded import EmbeddedRedis
from settle.progress import (
    DeferDelivery,
    DeliveryId,
    EffectContext,
    EmissionId,
    ProgressStore,
    ProviderScope,
    StreamConsumer,
)
from settle.progress._keys import ProgressKeys, StreamKeys
from settle.progress.errors import ProgressLost
from tests.progress.harness import (
    Names,
    pending_ids,
    progress_covers,
    publish,
    receipts,
    redis_binaries,
)

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


held_ops = st.lists(
    st.tuples(st.sampled_from(["apply", "dead", "defer", "trim", "observe"]), st.integers(0, 63)),
    max_size=40,
)


@given(exist=st.sets(st.integers(0, 40), min_size=1, max_size=16), ops=held_ops)
def test_the_floor_never_passes_a_gap_or_a_deferral_whatever_is_trimmed(
    progress_server, exist, ops
):
    """Deferrals and trims (an entry gone from every later listing) drawn among the rest: a
    deferral or a recorded gap is never at or below the floor, and a gap once reported
    stays reported until its delivery is applied or dead-lettered; the floor still moves
    as far as the listing proves short of them."""
    store = ProgressStore.from_url(
        progress_server.url, consumer=f"p{uuid.uuid4().hex[:10]}", namespace="prop"
    )
    ids = [DeliveryId(f"100-{n}") for n in sorted(exist)]
    existing = list(ids)
    applied: set[DeliveryId] = set()
    dead: set[DeliveryId] = set()  # dead-lettered with no known emission
    deferred: set[DeliveryId] = set()
    reported: set[DeliveryId] = set()  # gaps reported and not resolved since
    floor: DeliveryId | None = None

    def covered(d: DeliveryId) -> bool:  # for its own emission, e<seq>
        return (floor is not None and d <= floor) or d in applied

    try:
        for op, k in [*ops, ("observe", 0)]:
            d = ids[k % len(ids)]
            if op == "apply":
                store.apply(SCOPE, d, EmissionId(f"e{d.seq}"), lambda ctx: None)
                if not covered(d):
                    applied.add(d)
                    deferred.discard(d)
                    reported.discard(d)
            elif op == "dead":
                store.dead_letter(SCOPE, d, None, reason="poison", delivery_count=9)
                if not covered(d) and d not in dead:
                    dead.add(d)
                    deferred.discard(d)
                    reported.discard(d)
            elif op == "defer":
                reply = store.defer(SCOPE, d, EmissionId(f"e{d.seq}"), reason="later")
                # An id dead-lettered with no known emission covers none: it is deferred.
                assert reply.code == ("covered" if covered(d) else "deferred")
                if reply.code == "deferred":
                    deferred.add(d)
            elif op == "trim":
                if d in existing:
                    existing.remove(d)
            else:
                listing = [x for x in existing if floor is None or floor < x]
                p = store.observe(
                    SCOPE, floor, listing, last_delivered=None, oldest_pending=None, pending=0
                )
                floor = p.floor
                assert {x.delivery for x in p.deferred} == deferred
                assert reported <= set(p.gaps)  # a gap goes only once resolved
                reported = set(p.gaps)
                held = reported | deferred
                assert all(floor is None or floor < h for h in held)
                # (the dead letter of an unknown emission covers the id for settling)
                assert not any(p.covers(h) for h in deferred - dead)
                resolved = (applied | dead) - deferred
                assert {x for x in existing if floor is not None and x <= floor} <= resolved
                above = [x for x in existing if floor is None or floor < x]
                # As far as the listing proves: the next listed delivery is not resolved,
                # or a gap or a deferral below it holds the floor.
                assert not above or above[0] not in resolved or any(h < above[0] for h in held)
    finally:
        store.close()


class StreamEdgesMachine(RuleBasedStateMachine):
    """A real stream and consumer group on one redis-server, progress on another. Hypothesis
    draws publications, polls, a worker that dies holding deliveries, and operator actions
    on the group: XDEL and MAXLEN trimming (of pending entries or not), XGROUP DELCONSUMER
    of the dead worker, XGROUP SETID forward and back; effects that defer their delivery,
    applied later by hand; and the progress server losing its data (FLUSHALL), refused with
    ProgressLost exactly when the incarnation had a delivery acknowledged, then gone on from
    as docs/delivery-progress.md says ("Progress lost": the group is destroyed, the
    consumer's mark deleted, and every entry is applied again). After every step: no effect
    twice (since the last loss of progress), nothing acknowledged before
    durable progress covered it, every entry at or below the floor applied or dead-lettered,
    every deferral above the floor, and a reported gap gone only once progress covers it. At
    the end, every delivery has a recorded outcome: applied and settled, dead-lettered as
    deleted, a reported gap holding the floor, or a deferral holding it."""

    urls: tuple[str, str]

    def __init__(self) -> None:
        super().__init__()
        tag = uuid.uuid4().hex[:10]
        self.names = Names(f"m-{tag}", "billing", f"m-{tag}", "prop")
        self.stream = redis.Redis.from_url(self.urls[0])
        self.progress = redis.Redis.from_url(self.urls[1])
        self.runs: Counter[str] = Counter()  # since progress was last lost
        self.ever: set[str] = set()  # every emission whose effect ran
        self.published: dict[str, str] = {}  # delivery id -> emission id
        self.deleted: set[str] = set()
        self.to_defer: set[str] = set()  # emissions whose effect defers them, once
        self.reported: set[str] = set()  # the gaps progress reported last
        store = ProgressStore.from_url(self.urls[1], consumer=self.names.consumer, namespace="prop")
        self.consumer = StreamConsumer(
            redis.Redis.from_url(self.urls[0]),
            store,
            stream=self.names.stream,
            group=self.names.group,
            worker="live",
            claim_idle=0.01,
            block=0.01,
            batch=3,
        )
        self.consumer.start()

    def effect(self, ctx: EffectContext) -> None:
        if ctx.emission.value in self.to_defer:
            self.to_defer.discard(ctx.emission.value)
            raise DeferDelivery("later")
        self.runs[ctx.emission.value] += 1
        self.ever.add(ctx.emission.value)

    def existing(self) -> list[str]:
        return [i.decode() for i, _ in self.stream.xrange(self.names.stream)]

    @rule(n=st.integers(1, 3))
    def publish(self, n: int) -> None:
        base = len(self.published)
        for d, e in zip(
            publish(self.stream, self.names, [f"e{base + i}" for i in range(n)]),
            [f"e{base + i}" for i in range(n)],
            strict=True,
        ):
            self.published[d] = e

    @rule()
    def defer_the_next_publication(self) -> None:
        self.to_defer.add(f"e{len(self.published)}")

    @rule(k=st.integers(0, 63))
    def apply_a_deferral(self, k: int) -> None:
        assert self.consumer.scope is not None
        deferred = self.consumer.store.read(self.consumer.scope).deferred
        if deferred:
            d = deferred[k % len(deferred)]
            self.consumer.store.apply(self.consumer.scope, d.delivery, d.emission, self.effect)

    @rule()
    def poll(self) -> None:
        time.sleep(0.012)  # past claim_idle
        self.consumer.poll(self.effect)

    @rule(n=st.integers(1, 3))
    def worker_dies_holding_deliveries(self, n: int) -> None:
        self.stream.xreadgroup(self.names.group, "ghost", {self.names.stream: ">"}, count=n)

    @rule(k=st.integers(0, 63))
    def xdel(self, k: int) -> None:
        ids = self.existing()
        if ids:
            d = ids[k % len(ids)]
            self.stream.xdel(self.names.stream, d)
            self.deleted.add(d)

    @rule(keep=st.integers(0, 4))
    def maxlen(self, keep: int) -> None:
        before = set(self.existing())
        self.stream.xtrim(self.names.stream, maxlen=keep, approximate=False)
        self.deleted |= before - set(self.existing())

    @rule()
    def delconsumer(self) -> None:
        with contextlib.suppress(redis.ResponseError):
            self.stream.xgroup_delconsumer(self.names.stream, self.names.group, "ghost")

    @rule(k=st.integers(0, 63), back=st.booleans())
    def setid(self, k: int, back: bool) -> None:
        ids = sorted(self.published, key=DeliveryId)
        target = "0" if back or not ids else ids[k % len(ids)]
        self.stream.xgroup_setid(self.names.stream, self.names.group, target)

    @rule()
    def progress_server_loses_its_data(self) -> None:
        """FLUSHALL of the progress server, then a poll: refused (ProgressLost, nothing
        written) exactly when this incarnation had a delivery of the group acknowledged;
        otherwise the scope is created anew. After a refusal, the documented way on."""
        scope = self.consumer.scope
        assert scope is not None
        mark = StreamKeys(self.names.stream).acknowledged
        field = self.consumer.core.mark_field(scope)
        acknowledged = self.stream.hget(mark, field) == scope.incarnation.encode()
        self.progress.flushall()
        self.runs.clear()  # emissions applied before may run again, under their keys
        self.reported = set()  # the gaps were progress too
        time.sleep(0.012)
        try:
            self.consumer.poll(self.effect)
        except ProgressLost:
            assert acknowledged
            assert not self.progress.keys(f"*{self.names.consumer}*")  # nothing written
            self.stream.xgroup_destroy(self.names.stream, self.names.group)
            self.stream.hdel(mark, field)
            assert self.consumer.start() == scope
        else:
            assert not acknowledged

    def dead(self) -> dict[str, str]:
        keys = ProgressKeys("prop", self.names.consumer)
        out = {}
        for scope_id in self.progress.hkeys(keys.scopes):
            for _, f in self.progress.xrange(keys.scope(scope_id.decode())[6]):
                out[f[b"delivery"].decode()] = f[b"reason"].decode()
        return out

    @invariant()
    def outcomes_hold(self) -> None:
        assert all(n == 1 for n in self.runs.values()), self.runs  # never an effect twice
        # Nothing acknowledged before durable progress covered it, or held it as deferred.
        # (The group's own view, "delivered and not pending", is no witness here:
        # DELCONSUMER and SETID drop entries from it that nobody acknowledged. The receipts
        # are.)
        assert self.consumer.scope is not None
        p = self.consumer.store.read(self.consumer.scope)
        for r in receipts(self.progress, self.names):
            if r["outcome"] == "acked":
                held = r["kind"] == "defer" and DeliveryId(r["delivery"]) in {
                    x.delivery for x in p.deferred
                }
                assert held or progress_covers(self.progress, self.names, r["delivery"]), r
        floor = p.floor
        dead = self.dead()
        for d in self.existing():
            if floor is not None and not floor < DeliveryId(d):
                assert self.published[d] in self.runs or d in dead, d
        for x in p.deferred:  # whether its entry is still there or not
            assert floor is None or floor < x.delivery, x
        gaps = {g.value for g in p.gaps}
        for g in self.reported - gaps:  # resolved, or the floor passed a gap: which it must not
            assert progress_covers(self.progress, self.names, g), g
        assert all(floor is None or floor < DeliveryId(g) for g in gaps)
        self.reported = gaps

    def teardown(self) -> None:
        try:
            scope = self.consumer.scope
            assert scope is not None
            for _ in range(30):
                time.sleep(0.012)
                report = self.consumer.poll(self.effect)
                p = self.consumer.store.read(scope)
                quiet = not report.handled and not pending_ids(self.stream, self.names)
                if quiet and not p.intents:
                    break
            assert not pending_ids(self.stream, self.names)
            assert not p.intents
            dead = self.dead()
            gaps = {g.value for g in p.gaps}
            deferred = {x.delivery.value for x in p.deferred}
            for d, e in self.published.items():
                if e in self.ever:
                    continue  # applied (once since progress was last lost) and settled
                if d in deferred:  # set aside, still unapplied: it holds the floor
                    assert p.floor is None or p.floor < DeliveryId(d)
                    continue
                if d in dead:  # deleted while pending (or redelivered past the limit by SETID)
                    assert dead[d] in ("deleted", "delivery_limit")
                    assert dead[d] != "deleted" or d in self.deleted
                elif d in gaps:  # lost: reported, and it holds the floor
                    assert p.floor is None or p.floor < DeliveryId(d)
                else:
                    # Never delivered before it was deleted: nothing to settle.
                    assert d in self.deleted, f"{d} ended with no recorded outcome"
        finally:
            self.consumer.close()
            self.stream.close()
            self.progress.close()


@pytest.mark.parametrize("binary", redis_binaries(), ids=lambda b: "redis7" if b else "default")
def test_broker_side_deletions_and_group_moves_end_in_recorded_outcomes(binary) -> None:
    with EmbeddedRedis(binary=binary) as stream, EmbeddedRedis(binary=binary) as progress:
        StreamEdgesMachine.urls = (stream.url, progress.url)
        run_state_machine_as_test(
            StreamEdgesMachine,
            settings=settings(
                max_examples=30,
                stateful_step_count=20,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
