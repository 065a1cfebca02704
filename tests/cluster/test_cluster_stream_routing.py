"""A stream consumer on a Redis Cluster keeps serving its stream while another primary hangs
(SIGSTOP, as a GC-paused VM or a partition hangs it).

redis-py's cluster client finds the key of a command it cannot parse on its own (XREADGROUP's,
after STREAMS) by asking one node, its default node, with COMMAND GETKEYS. When that node
hung, every poll waited the socket timeout (30 s) on each try, although the stream's slot
lives on a healthy primary; so did the periodic eviction recheck before a command that may
not be repeated (XREADGROUP), which read every primary. Now every command of the consumer
goes to the node of its stream's slot, and its recheck reads that primary alone."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from settle._runtime import _async as runtime_async
from settle._runtime import _sync as runtime_sync
from settle.progress._keys import ProgressKeys
from tests.cluster.cluster_support import LocalCluster, primary_of
from tests.cluster.stream_support import Worker, stream_worker

pytestmark = [pytest.mark.cluster, pytest.mark.faults, pytest.mark.asyncio]

PRIMARIES = 3
#: Far below the client's 30 s socket timeout, which every poll waited (on each try) before:
#: a bound on liveness, not a figure of speed.
LIVENESS = 10.0
NAMESPACE = "routing"


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    """A 3-primary cluster of this test alone (one of its primaries is frozen); without
    full coverage required, the healthy primaries serve while one is frozen."""
    running = LocalCluster(
        primaries=PRIMARIES, extra_args=["--cluster-require-full-coverage", "no"]
    ).start()
    try:
        yield running
    finally:
        running.close()


@dataclass
class Hung(Worker):
    """A consumer whose stream and progress live on healthy primaries, and the primary its
    cluster client asks for keys (``frozen``, the test freezes it)."""

    frozen: int = -1

    async def within_liveness(self, method: str, *args: Any) -> Any:
        return await asyncio.wait_for(self.call(method, *args), LIVENESS)


def _named(make: Callable[[int], str], key: Callable[[str], str], avoid: int) -> str:
    """The first name ``make(i)`` whose ``key`` is not on primary ``avoid``."""
    return next(n for n in map(make, range(10_000)) if primary_of(key(n), PRIMARIES) != avoid)


async def _hung(cluster: LocalCluster, flavour: str) -> Hung:
    seeds = [f"127.0.0.1:{node.port}" for node in cluster.nodes]
    if flavour == "sync":
        client: Any = runtime_sync.cluster_client(seeds)
    else:
        client = runtime_async.cluster_client(seeds)
        await client.initialize()
    # The node redis-py asks for a command's keys (COMMAND GETKEYS) is its default node.
    default = client.get_default_node()
    frozen = [node.port for node in cluster.nodes].index(default.port)
    worker = stream_worker(
        client,
        flavour,
        stream=_named(lambda i: f"orders-{i}", str, frozen),
        consumer=_named(lambda i: f"billing-{i}", lambda c: ProgressKeys(NAMESPACE, c).tag, frozen),
        namespace=NAMESPACE,
    )
    return Hung(worker.stream, worker.consumer, worker.runs, worker.effect, worker.call, frozen)


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_hung_primary_does_not_stall_a_consumer_whose_stream_is_on_another(
    cluster: LocalCluster, flavour: str
) -> None:
    hung = await _hung(cluster, flavour)
    effect = hung.effect
    raw = cluster.client(primary_of(hung.stream, PRIMARIES))
    try:
        raw.xadd(hung.stream, {"emission_id": "e0"})
        await hung.call("poll", effect)  # started: the start-up checks read every node
        assert hung.runs == ["e0"]
        raw.xadd(hung.stream, {"emission_id": "e1"})
        raw.xreadgroup("billing", "w0", {hung.stream: ">"})  # e1 stuck with a dead worker
        raw.xadd(hung.stream, {"emission_id": "e2"})
        # Every call rechecks its primary's eviction policy (the interval has passed).
        hung.consumer._runner.recheck_interval = 0.0
        hung.consumer.store._runner.recheck_interval = 0.0
        await asyncio.sleep(0.1)  # past claim_idle: e1 is claimed (XAUTOCLAIM, XPENDING)
        with cluster.frozen(hung.frozen):
            report = await hung.within_liveness("poll", effect)
            assert hung.runs == ["e0", "e1", "e2"]
            assert len(report.handled) == 2
            assert [r.outcome.value for r in report.receipts] == ["acked", "acked"]
            assert await hung.within_liveness("recover") == []  # no intent left open
        assert raw.xpending(hung.stream, "billing")["pending"] == 0  # all acknowledged
    finally:
        raw.close()
        await hung.close()
