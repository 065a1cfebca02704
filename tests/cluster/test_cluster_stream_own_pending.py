"""A stream consumer on a Redis Cluster takes the deliveries it holds unseen (a lost
XREADGROUP reply handed them over) at their delivery count, each made fresh for it with
XCLAIM on the node of its stream's slot (reviewed: the look at the worker's own pending
list was only held against one server)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis

from settle._runtime import _async as runtime_async
from settle._runtime import _sync as runtime_sync
from settle.progress import (
    AsyncProgressStore,
    AsyncStreamConsumer,
    EffectContext,
    ProgressStore,
    StreamConsumer,
)
from tests.cluster.cluster_support import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.asyncio]


async def test_held_deliveries_are_taken_fresh_at_their_count_on_a_cluster(
    cluster: LocalCluster, flavour: str
) -> None:
    seeds = [f"127.0.0.1:{node.port}" for node in cluster.nodes]
    tag = uuid.uuid4().hex[:8]
    stream, runs = f"orders-{tag}", []
    options: dict[str, Any] = {"group": "billing", "worker": "w1", "block": 0.01}
    if flavour == "sync":
        client: Any = runtime_sync.cluster_client(seeds, {})
        store = ProgressStore(client, consumer=f"b-{tag}", namespace="own")
        consumer: Any = StreamConsumer(client, store, stream=stream, **options)
    else:
        client = runtime_async.cluster_client(seeds, {})
        astore = AsyncProgressStore(client, consumer=f"b-{tag}", namespace="own")
        consumer = AsyncStreamConsumer(client, astore, stream=stream, **options)

    def effect(ctx: EffectContext) -> None:
        runs.append(ctx.emission.value)

    async def poll() -> Any:
        if flavour == "sync":
            return await asyncio.to_thread(consumer.poll, effect)
        return await consumer.poll(effect)

    raw = redis.RedisCluster.from_url(cluster.url)
    try:
        await poll()  # the first look: nothing held
        ids = [raw.xadd(stream, {"emission_id": f"e{i}"}).decode() for i in range(3)]
        raw.xreadgroup("billing", "w1", {stream: ">"})  # handed; the reply "lost"
        consumer._own_pending = True  # what a lost reply's BackendError sets
        report = await poll()
        assert [d.value for d in report.handled] == ids
        assert runs == ["e0", "e1", "e2"]
        assert raw.xpending_range(stream, "billing", "-", "+", 10) == []
    finally:
        raw.close()
        closing = consumer.close()
        if asyncio.iscoroutine(closing):
            await closing
