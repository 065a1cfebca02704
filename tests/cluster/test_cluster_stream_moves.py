"""A stream consumer on a Redis Cluster follows its stream's slot when it moves: to a promoted
replica after its primary hangs (SIGSTOP, as a GC-paused VM or a partition hangs it), and to
another primary during and after a resharding (ASK while the slot migrates, MOVED once it has).

The consumer's stream commands go to the client of the node that served the slot when the
topology was last read (``Runner._routed``), not through redis-py's cluster client, which
would re-read the topology itself. So the runner must: drop a node whose connection failed or
timed out and read the topology again (else every poll waits on the hung primary's client,
however long ago its replica took over), and send a redirected command once more through the
cluster client (which sends ASKING before it on the importing node), not fail it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from settle._runtime import _async as runtime_async
from settle._runtime import _sync as runtime_sync
from settle.errors import BackendError
from settle.progress._keys import ProgressKeys, StreamKeys
from settle.progress.identity import DeliveryId
from tests.cluster.cluster_support import LocalCluster, node_acks, primary_of
from tests.cluster.stream_support import Worker, stream_worker

pytestmark = [pytest.mark.cluster, pytest.mark.faults, pytest.mark.asyncio]

PRIMARIES = 3
NAMESPACE = "moves"
#: cluster-node-timeout (2 s) to mark the primary failed, then the replica's election; the
#: bound leaves room for a loaded machine.
FAILOVER_BOUND = 20.0
#: The consumers' socket timeout: how long a command waits on the hung primary's client.
SOCKET_TIMEOUT = 1.5
#: From the promotion to the new entry handled: a poll whose first try waits one socket
#: timeout on the hung primary, then reads the topology again (which may wait one more on
#: it) and goes to the promoted replica; room left for a loaded machine. Not a figure of
#: speed: a bound on liveness. A node client that retried on its own waited 11 socket
#: timeouts per try (redis-py's default Retry), and one the runner kept waited on the hung
#: primary for as long as it stayed hung.
FOLLOW_BOUND = 10.0


def _named(make: Callable[[int], str], key: Callable[[str], str], on: int) -> str:
    """The first name ``make(i)`` whose ``key`` lives on primary ``on``."""
    return next(n for n in map(make, range(10_000)) if primary_of(key(n), PRIMARIES) == on)


@pytest.fixture
def replicated() -> Iterator[LocalCluster]:
    """3 primaries with a replica each; without full coverage required, the other primaries
    serve while one is frozen."""
    running = LocalCluster(
        primaries=PRIMARIES, replicas=1, extra_args=["--cluster-require-full-coverage", "no"]
    ).start()
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def plain() -> Iterator[LocalCluster]:
    running = LocalCluster(primaries=PRIMARIES).start()
    try:
        yield running
    finally:
        running.close()


async def _worker(cluster: LocalCluster, flavour: str) -> Worker:
    """A consumer of a stream on primary 0 whose progress lives on primary 1, both on one
    cluster client with a short socket timeout."""
    seeds = [f"127.0.0.1:{node.port}" for node in cluster.nodes]
    options = {"socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": SOCKET_TIMEOUT}
    if flavour == "sync":
        client: Any = runtime_sync.cluster_client(seeds, options)
    else:
        client = runtime_async.cluster_client(seeds, options)
    return stream_worker(
        client,
        flavour,
        stream=_named(lambda i: f"orders-{i}", str, 0),
        consumer=_named(lambda i: f"billing-{i}", lambda c: ProgressKeys(NAMESPACE, c).tag, 1),
        namespace=NAMESPACE,
    )


def _promoted(cluster: LocalCluster, replica: int) -> bool:
    with redis.Redis(port=cluster.nodes[replica].port, socket_timeout=1) as c:
        return bool(c.info("replication")["role"] == "master")


async def _until(ok: Callable[[], bool], bound: float) -> None:
    deadline = time.monotonic() + bound
    while not await asyncio.to_thread(ok):
        assert time.monotonic() < deadline, f"not within {bound} s"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_consumer_follows_its_stream_to_the_replica_promoted_for_a_hung_primary(
    replicated: LocalCluster, flavour: str
) -> None:
    """Polled by hand (no start() in between, whose script would make redis-py's cluster
    client re-read the topology), the consumer reaches the promoted replica within a poll or
    two of its promotion. The async flavour's node client, built with redis-py's default
    Retry, repeated each command 10 times on the hung primary before the runner saw the
    timeout (and re-sent XREADGROUP, which the runner never repeats)."""
    worker = await _worker(replicated, flavour)
    replica = replicated.replica_of(0)
    try:
        with replicated.client(0) as primary:
            primary.xadd(worker.stream, {"emission_id": "e0"})
            await worker.poll()
            assert worker.runs == ["e0"]
            # What the primary holds (the group, its acknowledgement) is on the replica.
            assert node_acks(primary, timeout_ms=5000) == 1
        with replicated.frozen(0):
            await _until(lambda: _promoted(replicated, replica), FAILOVER_BOUND)
            with replicated.client(replica) as promoted:
                promoted.xadd(worker.stream, {"emission_id": "e1"})
            promoted_at = time.monotonic()
            errors: list[BackendError] = []
            while worker.runs != ["e0", "e1"]:
                assert time.monotonic() - promoted_at < FOLLOW_BOUND, f"failing: {errors[-1:]}"
                try:
                    await worker.poll()
                except BackendError as exc:
                    errors.append(exc)
            followed = time.monotonic() - promoted_at
            assert followed < FOLLOW_BOUND, f"{followed:.1f} s after the promotion"
            with replicated.client(replica) as promoted:
                assert promoted.xpending(worker.stream, "billing")["pending"] == 0
    finally:
        await worker.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_consumer_follows_its_stream_through_a_resharding(
    plain: LocalCluster, flavour: str
) -> None:
    """While the stream's slot migrates (its keys already on the target: the source answers
    ASK), the consumer reads the stream (observe(): its listing, group and pending list);
    once the slot has moved (MOVED), a poll handles what was added and settles it on the
    target. Either redirection failed the call with a BackendError when it was not sent
    again through the cluster client. (A poll mid-migration still fails: a script on keys
    of which some do not exist, such as the dead-letter stream, is refused with TRYAGAIN by
    both nodes until the slot has moved: Redis Cluster's rule, not the runner's.)"""
    worker = await _worker(plain, flavour)
    slot = key_slot(worker.stream.encode())
    assert key_slot(StreamKeys(worker.stream).incarnation.encode()) == slot
    try:
        with plain.client(0) as source:
            first = DeliveryId(source.xadd(worker.stream, {"emission_id": "e0"}).decode())
        await worker.poll()  # the runner now knows primary 0's client for the slot
        assert worker.runs == ["e0"]
        assert plain.migrate(slot, 0, 2)  # the stream and its group moved: ASK
        with plain.client(2) as target:
            target.execute_command("ASKING")  # this connection only: the slot is importing
            target.xadd(worker.stream, {"emission_id": "e1"})
        progress = await worker.call("observe")
        assert progress.floor == first
        assert progress.provider_floor is not None
        assert progress.provider_floor.last_delivered == first  # e1 not handed out yet
        assert progress.provider_floor.pending == 0
        plain.migrated(slot, 2)
        with plain.client(2) as target:
            target.xadd(worker.stream, {"emission_id": "e2"})
        await worker.poll()
        assert worker.runs == ["e0", "e1", "e2"]
        with plain.client(2) as target:
            assert target.xpending(worker.stream, "billing")["pending"] == 0
    finally:
        await worker.close()
