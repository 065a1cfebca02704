"""The floor never passes a recorded gap or deferral, whatever becomes of its stream entry.

A deferral's entry is acknowledged (the provider stops redelivering it) and a lost
delivery's is pending for nobody, so a producer's ``XADD MAXLEN ~``, an ``XTRIM`` or an
``XDEL`` removes them like any settled entry, and the next listing no longer shows them.
Progress holds the floor below them all the same, until each is applied or dead-lettered.
Sync and async shells, on real redis-servers with real trims; then a scope written before
the holds index (its old layout still reads, and a deferral the floor passed then can still
be applied)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from settle.embedded import EmbeddedRedis
from settle.errors import CorruptRecord
from settle.progress import (
    ApplyStatus,
    AsyncProgressStore,
    AsyncStreamConsumer,
    DeferDelivery,
    DeliveryId,
    EffectContext,
    EmissionId,
    ProgressStore,
    ProviderScope,
    SettlementNotAuthorized,
    StreamConsumer,
    plan_settlements,
)
from settle.progress._keys import ProgressKeys
from settle.progress.planning import Cumulative, authorize_cumulative
from tests.integration.conftest import Awaitable
from tests.progress.harness import Names, publish


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@asynccontextmanager
async def consumer(
    flavour: str, names: Names, stream_server: EmbeddedRedis, progress_server: EmbeddedRedis
) -> AsyncIterator[Any]:
    """A started consumer of ``flavour`` whose methods are all awaited."""
    options: dict[str, Any] = {
        "stream": names.stream,
        "group": names.group,
        "block": 0.01,
        "batch": 500,
        "listing": 1000,
    }
    store_options = {"consumer": names.consumer, "namespace": names.namespace}
    if flavour == "sync":
        store = ProgressStore.from_url(progress_server.url, **store_options)
        sync = StreamConsumer(redis.Redis.from_url(stream_server.url), store, **options)
        sync.start()
        try:
            yield Awaitable(sync)
        finally:
            sync.close()
        return
    astore = AsyncProgressStore.from_url(progress_server.url, **store_options)
    aconsumer = AsyncStreamConsumer(aioredis.Redis.from_url(stream_server.url), astore, **options)
    await aconsumer.start()
    try:
        yield aconsumer
    finally:
        await aconsumer.aclose()


def effect_of(flavour: str, run: Callable[[EffectContext], None]) -> Any:
    if flavour == "sync":
        return run

    async def arun(ctx: EffectContext) -> None:
        run(ctx)

    return arun


def trim(how: str, client: redis.Redis, names: Names, through: str) -> None:
    """Remove the entry ``through`` from the stream as ``how`` does (XDEL removes that one;
    the trims remove every entry up to it)."""
    if how == "xdel":
        assert client.xdel(names.stream, through) == 1
    elif how == "xtrim":
        keep = len(client.xrange(names.stream, f"({through}", "+"))
        client.xtrim(names.stream, maxlen=keep, approximate=False)
    else:  # a producer that caps the stream: trims whole nodes (100 entries) at a time
        for i in range(1000):
            client.xadd(names.stream, {"emission_id": f"fill-{i}"}, maxlen=10, approximate=True)
            if not client.xrange(names.stream, through, through):
                break
    assert not client.xrange(names.stream, through, through)


TRIMS = ["xdel", "xtrim", "xadd_maxlen_approx"]


async def poll_all(c: Any, effect: Any) -> None:
    """Poll until the group has nothing new and nothing pending."""
    for _ in range(20):
        report = await c.poll(effect)
        if not report.handled:
            return
    raise AssertionError("the consumer never ran dry")


@pytest.mark.asyncio
@pytest.mark.parametrize("how", TRIMS)
async def test_a_trimmed_deferral_holds_the_floor_until_it_is_applied(
    flavour: str, how: str, names: Names, stream_server, progress_server, stream_client
) -> None:
    ids = publish(stream_client, names, ["e1", "later", "e3"])
    ran: list[str] = []

    def run(ctx: EffectContext) -> None:
        if ctx.emission.value == "later" and "defer" not in ran:
            ran.append("defer")
            raise DeferDelivery("waiting for the account")
        ran.append(ctx.emission.value)

    effect = effect_of(flavour, run)
    async with consumer(flavour, names, stream_server, progress_server) as c:
        await poll_all(c, effect)
        [deferred] = (await c.store.read(c.scope)).deferred
        assert deferred.delivery == DeliveryId(ids[1])

        trim(how, stream_client, names, ids[1])
        await poll_all(c, effect)  # the fills of a capped stream, if any
        progress = await c.observe()
        assert progress.floor == DeliveryId(ids[0])
        assert not progress.covers(DeliveryId(ids[1]))
        assert [d.delivery for d in progress.deferred] == [DeliveryId(ids[1])]

        # Found again and applied: its effect runs once, and the floor moves past it.
        applied = await c.store.apply(c.scope, deferred.delivery, deferred.emission, effect)
        assert applied.status is ApplyStatus.APPLIED
        assert ran.count("later") == 1
        progress = await c.observe()
    last = stream_client.xrevrange(names.stream, count=1)[0][0].decode()
    assert progress.floor == DeliveryId(last)
    assert progress.deferred == ()
    assert progress.gaps == ()


@pytest.mark.asyncio
@pytest.mark.parametrize("how", TRIMS)
async def test_a_trimmed_lost_delivery_keeps_its_gap_until_it_is_dead_lettered(
    flavour: str, how: str, names: Names, stream_server, progress_server, stream_client
) -> None:
    ids = publish(stream_client, names, ["e1", "lost", "e3"])
    # A worker took e1 and "lost", and its consumer was deleted: neither comes again.
    stream_client.xgroup_create(names.stream, names.group, id="0", mkstream=True)
    stream_client.xreadgroup(names.group, "gone", {names.stream: ">"}, count=2)
    stream_client.xgroup_delconsumer(names.stream, names.group, "gone")
    effect = effect_of(flavour, lambda ctx: None)
    async with consumer(flavour, names, stream_server, progress_server) as c:
        await c.store.apply(c.scope, DeliveryId(ids[0]), EmissionId("e1"), effect)
        await poll_all(c, effect)  # applies e3; "lost" becomes a gap
        assert (await c.store.read(c.scope)).gaps == (DeliveryId(ids[1]),)

        trim(how, stream_client, names, ids[1])
        await poll_all(c, effect)
        progress = await c.observe()
        assert progress.gaps == (DeliveryId(ids[1]),)
        assert progress.floor == DeliveryId(ids[0])
        assert not progress.covers(DeliveryId(ids[1]))

        # Its entry is gone, so it can only be dead-lettered; then the floor passes it.
        await c.store.dead_letter(
            c.scope, DeliveryId(ids[1]), None, reason="lost", delivery_count=1
        )
        progress = await c.observe()
    last = stream_client.xrevrange(names.stream, count=1)[0][0].decode()
    assert progress.floor == DeliveryId(last)
    assert progress.gaps == ()


def _stream_consumer(
    names: Names, stream_server: EmbeddedRedis, progress_server: EmbeddedRedis
) -> tuple[ProgressStore, StreamConsumer]:
    """A sync consumer of the test's stream and the progress store under it."""
    store = ProgressStore.from_url(
        progress_server.url, consumer=names.consumer, namespace=names.namespace
    )
    consumer = StreamConsumer(
        redis.Redis.from_url(stream_server.url),
        store,
        stream=names.stream,
        group=names.group,
        block=0.01,
    )
    return store, consumer


def _defer_later(ctx: EffectContext) -> None:
    """The effect: the emission named ``later`` is deferred, every other one applied."""
    if ctx.emission.value == "later":
        raise DeferDelivery("waiting")


def test_a_scope_written_before_the_holds_index_is_indexed_on_its_next_observation(
    names, stream_server, progress_server, stream_client, progress_client
) -> None:
    ids = publish(stream_client, names, ["e1", "later", "e3", "e4"])
    _, consumer = _stream_consumer(names, stream_server, progress_server)
    with consumer as c:
        scope = c.start()
        keys = ProgressKeys(names.namespace, names.consumer)
        holds = keys.holds(scope.scope_id)

        c.poll(_defer_later)
        # The old layout: the deferral and its gap in their hashes, no index.
        progress_client.delete(holds)
        trim("xdel", stream_client, names, ids[1])
        progress = c.observe()
        assert progress.floor == DeliveryId(ids[0])
        assert not progress.covers(DeliveryId(ids[1]))
        members = [m.decode() for m in progress_client.zrange(holds, 0, -1)]
        later = DeliveryId(ids[1])
        assert members == [f"{later.ms:020d}-{later.seq:020d}", "built"]


def test_a_deferral_the_floor_passed_before_it_was_held_can_still_be_applied(
    names, stream_server, progress_server, stream_client, progress_client
) -> None:
    """Progress written by an earlier settle, whose floor passed a trimmed deferral: it
    is not covered, so applying it runs its effect (and keeps the floor where it is)."""
    ids = publish(stream_client, names, ["e1", "later", "e3"])
    store, consumer = _stream_consumer(names, stream_server, progress_server)
    with consumer as c:
        scope = c.start()

        c.poll(_defer_later)
        # What the earlier settle left after the trim: the floor past the deferral, the
        # records at or below it deleted, no holds index.
        keys = ProgressKeys(names.namespace, names.consumer)
        meta, applied, _, gaps = keys.scope(scope.scope_id)[:4]
        progress_client.hset(meta, mapping={"floor": ids[2], "replay": ids[2]})
        progress_client.hdel(applied, ids[2])
        progress_client.hdel(gaps, ids[1])
        progress_client.delete(keys.holds(scope.scope_id))

        progress = store.read(scope)
        [deferred] = progress.deferred
        assert not progress.covers(deferred.delivery)
        # No cumulative settlement passes it either (a plan settles the others one by one).
        pending = [DeliveryId(i) for i in ids]
        plan = plan_settlements(progress, pending, cumulative=True)
        assert plan.withheld == (deferred.delivery,)
        assert not any(isinstance(s, Cumulative) for s in plan.settlements)
        with pytest.raises(SettlementNotAuthorized) as refused:
            authorize_cumulative(progress, DeliveryId(ids[2]))
        assert refused.value.uncovered == [deferred.delivery]
        ran: list[str] = []
        done = store.apply(scope, deferred.delivery, deferred.emission, lambda ctx: ran.append("x"))
        assert done.status is ApplyStatus.APPLIED
        assert ran == ["x"]
        progress = c.observe()
        assert progress.floor == DeliveryId(ids[2])
        assert progress.deferred == ()
        assert progress.applied_above_floor == ()
        assert progress.covers(deferred.delivery)


def test_the_holds_index_names_only_ids_settle_writes(
    names, progress_server, progress_client
) -> None:
    """A stored deferral whose id settle never writes is a corrupt record: found when the
    index is built, before the observation writes anything."""
    scope = ProviderScope("orders", "billing", "inc1")
    store = ProgressStore.from_url(
        progress_server.url, consumer=names.consumer, namespace=names.namespace
    )
    with store:
        store.defer(scope, DeliveryId("5-0"), EmissionId("e5"), reason="waiting")
        keys = ProgressKeys(names.namespace, names.consumer)
        meta, deferred = keys.scope(scope.scope_id)[0], keys.scope(scope.scope_id)[5]
        progress_client.hset(deferred, "05-0", '{"emission":"x","reason":"r","at":1}')
        before = progress_client.hgetall(meta)
        with pytest.raises(CorruptRecord):
            store.observe(scope, None, [], last_delivered=None, oldest_pending=None, pending=0)
        assert progress_client.hgetall(meta) == before
        assert not progress_client.zscore(keys.holds(scope.scope_id), "built")


def _observe(store: ProgressStore, scope: ProviderScope, after: str | None, ids: list[str]) -> Any:
    listed = [DeliveryId(i) for i in ids]
    return store.observe(
        scope,
        DeliveryId(after) if after else None,
        listed,
        last_delivered=listed[-1],
        oldest_pending=None,
        pending=0,
    )


@pytest.mark.parametrize("hold", ["deferral", "lost delivery"])
def test_a_hold_made_after_the_index_was_built_holds_the_floor_once_trimmed(
    names: Names, progress_server: EmbeddedRedis, hold: str
) -> None:
    """The index is built by the first observation; a deferral (defer) or a lost delivery
    (a gap an observation records) made after it must enter it, or the floor passes it
    once its entry is trimmed."""
    scope = ProviderScope("orders", "billing", "inc1")
    noop: Callable[[EffectContext], None] = lambda ctx: None  # noqa: E731
    with ProgressStore.from_url(
        progress_server.url, consumer=names.consumer, namespace=names.namespace
    ) as store:
        store.apply(scope, DeliveryId("1-0"), EmissionId("e1"), noop)
        assert _observe(store, scope, None, ["1-0"]).floor == DeliveryId("1-0")  # built
        if hold == "deferral":
            store.defer(scope, DeliveryId("2-0"), EmissionId("e2"), reason="wait")
        store.apply(scope, DeliveryId("3-0"), EmissionId("e3"), noop)
        if hold == "lost delivery":  # listed, unapplied, nobody's pending: a gap
            assert _observe(store, scope, "1-0", ["2-0", "3-0"]).gaps == (DeliveryId("2-0"),)
        progress = _observe(store, scope, "1-0", ["3-0"])  # 2-0's entry trimmed
        assert progress.floor == DeliveryId("1-0")
        assert not progress.covers(DeliveryId("2-0"))
