"""A delivery handed to this worker by a call whose reply was lost (XAUTOCLAIM, repeated
after the cut; XREADGROUP, not repeated) is handled at once, at the delivery count it was
handed, by the worker's next look at its own pending list (real Redis, a proxy that drops
the reply, sync and async).

Found in a hunt: the lost call had handed the delivery over (its delivery count went up),
but the worker never saw it; it came back only through XAUTOCLAIM after ``claim_idle``, one
delivery count higher. Each lost reply spent one of ``max_deliveries`` without running the
effect: a delivery was dead-lettered an attempt early, and with ``max_deliveries=1`` a lost
XREADGROUP reply dead-lettered a delivery whose effect never ran."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from settle import BackendError
from settle.embedded import EmbeddedRedis
from settle.progress import (
    AsyncProgressStore,
    AsyncStreamConsumer,
    EffectContext,
    ProgressStore,
    StreamConsumer,
)
from settle.progress._scripts import STREAM
from settle.progress.models import SettlementOutcome
from tests.faults.servers import async_client, proxy_to, sync_client
from tests.faults.tcp_proxy import FaultyProxy
from tests.integration.conftest import Awaitable
from tests.progress.harness import (
    Names,
    assert_nothing_acked_uncovered,
    dead_letters_on_stream,
    pending_ids,
    publish,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.faults]

CLAIM_IDLE = 0.5


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def stream_proxy(stream_server: EmbeddedRedis) -> Iterator[FaultyProxy]:
    running = proxy_to(stream_server.url, STREAM)
    yield running
    running.close()


class Effect:
    """Fails its first ``failures`` runs, then records each emission it is run for."""

    def __init__(self, flavour: str, failures: int) -> None:
        self.flavour, self.failures = flavour, failures
        self.runs: list[str] = []
        self.applied: list[str] = []

    def __call__(self) -> Any:
        def run(ctx: EffectContext) -> None:
            self.runs.append(ctx.emission.value)
            if len(self.runs) <= self.failures:
                raise RuntimeError("the effect's own failure")
            self.applied.append(ctx.emission.value)

        async def arun(ctx: EffectContext) -> None:
            run(ctx)

        return run if self.flavour == "sync" else arun


@dataclass
class World:
    """One test's flavour, the proxy in front of the stream's server, both servers' clients."""

    flavour: str
    proxy: FaultyProxy
    server: EmbeddedRedis  # the progress server
    stream: redis.Redis
    progress: redis.Redis
    names: Names


@pytest.fixture
def w(
    flavour: str,
    stream_proxy: FaultyProxy,
    progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    progress_client: redis.Redis,
    names: Names,
) -> World:
    return World(flavour, stream_proxy, progress_server, stream_client, progress_client, names)


@asynccontextmanager
async def consumer(w: World, limit: int, batch: int = 32) -> AsyncIterator[Any]:
    options: dict[str, Any] = {
        "stream": w.names.stream,
        "group": w.names.group,
        "worker": "w1",
        "block": 0.01,
        "claim_idle": CLAIM_IDLE,
        "max_deliveries": limit,
        "batch": batch,
    }
    own = {"consumer": w.names.consumer, "namespace": w.names.namespace}
    if w.flavour == "sync":
        sync = StreamConsumer(
            sync_client(w.proxy.port), ProgressStore.from_url(w.server.url, **own), **options
        )
        try:
            yield Awaitable(sync)
        finally:
            sync.close()
        return
    store = AsyncProgressStore.from_url(w.server.url, **own)
    aconsumer = AsyncStreamConsumer(async_client(w.proxy.port), store, **options)
    try:
        yield aconsumer
    finally:
        await aconsumer.aclose()


async def test_a_lost_xautoclaim_reply_costs_no_delivery_attempt(w: World) -> None:
    effect = Effect(w.flavour, failures=1)
    async with consumer(w, limit=2) as c:
        await c.start()
        [delivery] = publish(w.stream, w.names, ["e1"])
        first = await c.poll(effect())  # delivery 1: the effect fails, the delivery released
        assert [r.outcome for r in first.receipts] == [SettlementOutcome.RELEASED]
        # The next XAUTOCLAIM claims it (delivery 2); its reply is lost; the repeat finds
        # nothing idle enough to claim.
        w.proxy.cut("XAUTOCLAIM", "after_request")
        second = await c.poll(effect())
        assert w.proxy.fired == ["after_request"]
        # Delivery 2 is handled in that same poll: the effect runs its second time and the
        # delivery is acknowledged, not dead-lettered a try early (delivery 3 > limit 2).
        assert [r.outcome for r in second.receipts] == [SettlementOutcome.ACKED]
        await asyncio.sleep(CLAIM_IDLE * 1.5)
        await c.poll(effect())
    assert effect.runs == ["e1", "e1"]
    assert effect.applied == ["e1"]
    assert dead_letters_on_stream(w.stream, w.names) == []
    assert pending_ids(w.stream, w.names) == {}
    assert assert_nothing_acked_uncovered(w.stream, w.progress, w.names) == {delivery}


async def test_a_lost_xreadgroup_reply_does_not_dead_letter_an_unrun_delivery(w: World) -> None:
    effect = Effect(w.flavour, failures=0)
    async with consumer(w, limit=1) as c:
        await c.start()
        [delivery] = publish(w.stream, w.names, ["e1"])
        w.proxy.cut("XREADGROUP", "after_request")
        with pytest.raises(BackendError):
            await c.poll(effect())  # XREADGROUP handed e1 over (delivery 1); reply lost
        assert pending_ids(w.stream, w.names) == {delivery: ("w1", 1)}
        report = await c.poll(effect())  # this worker's own pending delivery, at once
        assert [r.outcome for r in report.receipts] == [SettlementOutcome.ACKED]
        await asyncio.sleep(CLAIM_IDLE * 1.5)
        await c.poll(effect())
    # Applied once, never dead-lettered (delivery 2 would be over the limit of 1).
    assert effect.runs == ["e1"]
    assert dead_letters_on_stream(w.stream, w.names) == []
    assert pending_ids(w.stream, w.names) == {}
    assert assert_nothing_acked_uncovered(w.stream, w.progress, w.names) == {delivery}


async def test_a_restarted_worker_takes_every_delivery_it_held_at_its_count(w: World) -> None:
    """A worker restarted under its name (or one whose XREADGROUP replies were lost) holds
    more deliveries than one listing of ``batch`` rows: each poll takes the next ones, at
    delivery count 1, none left for XAUTOCLAIM to hand back one count higher."""
    effect = Effect(w.flavour, failures=0)
    async with consumer(w, limit=1, batch=2) as c:
        await c.start()
        ids = publish(w.stream, w.names, [f"e{i}" for i in range(5)])
        w.stream.xreadgroup(w.names.group, "w1", {w.names.stream: ">"})  # handed, unseen
        handled = []
        for _ in range(3):
            handled += (await c.poll(effect())).handled
    assert [d.value for d in handled] == ids
    assert effect.runs == [f"e{i}" for i in range(5)]
    assert dead_letters_on_stream(w.stream, w.names) == []
    assert assert_nothing_acked_uncovered(w.stream, w.progress, w.names) == set(ids)


async def test_a_held_delivery_whose_entry_was_deleted_is_dead_lettered_at_once(w: World) -> None:
    """One of the deliveries this worker holds unseen had its entry deleted (XDEL) meanwhile:
    it goes the ``deleted`` way (dead-lettered in progress, then told to the provider), the
    other is applied, both in the first poll."""
    effect = Effect(w.flavour, failures=0)
    async with consumer(w, limit=5) as c:
        await c.start()
        ids = publish(w.stream, w.names, ["e1", "e2"])
        w.stream.xreadgroup(w.names.group, "w1", {w.names.stream: ">"})  # handed, unseen
        w.stream.xdel(w.names.stream, ids[0])
        report = await c.poll(effect())
        progress = await c.store.read(c.scope)
    assert [d.value for d in report.handled] == ids
    assert effect.runs == ["e2"]
    assert [d["reason"] for d in dead_letters_on_stream(w.stream, w.names)] == ["deleted"]
    assert pending_ids(w.stream, w.names) == {}
    assert (progress.floor.value, progress.gaps) == (ids[1], ())
