"""Failover on Redis Cluster (issue 20, item 5): a primary is killed with SIGKILL and the
cluster promotes its replica. Whatever ``min_replicas`` is, the settler follows the promoted
replica within the cluster's failover time: acknowledged completions replay, and new
transitions succeed or raise ``DurabilityError``; the connection error to the dead node does
not go on. Real cluster of 3 primaries with 1 replica each, ``cluster-node-timeout`` 2 s."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from settle import (
    AsyncSettler,
    BackendError,
    DurabilityError,
    Replay,
    Reserved,
    Settler,
    State,
    Verdict,
)
from settle._core.keys import Keys
from tests.cluster.cluster_support import SLOTS, LocalCluster, node_acks

pytestmark = [pytest.mark.cluster, pytest.mark.faults]

SHARDS = 16
REQ = {"amount": 1000}
WHO = "tenant:acme"
#: cluster-node-timeout (2 s) to mark the primary failed, then the replica's election; the
#: bound leaves room for a loaded machine.
FAILOVER_BOUND = 20.0


@pytest.fixture
def replicated() -> Iterator[LocalCluster]:
    running = LocalCluster(primaries=3, replicas=1).start()
    try:
        yield running
    finally:
        running.close()


def _ops_on(primary: int, namespace: str, count: int, prefix: str) -> list[str]:
    per = SLOTS // 3
    ops: list[str] = []
    i = 0
    while len(ops) < count:
        op = f"{prefix}-{i}"
        slot = key_slot(Keys(namespace, SHARDS).record(op).encode())
        if min(slot // per, 2) == primary:
            ops.append(op)
        i += 1
    return ops


def _promoted(cluster: LocalCluster, replica: int) -> bool:
    with redis.Redis(port=cluster.nodes[replica].port, socket_timeout=1) as c:
        return bool(
            c.info("replication")["role"] == "master" and c.cluster("INFO")["cluster_state"] == "ok"
        )


def _rejoined(cluster: LocalCluster) -> bool:
    """The killed primary is back as the replica of its promoted one, in sync."""
    with redis.Redis(port=cluster.nodes[0].port, socket_timeout=1) as c:
        info = c.info("replication")
        if info["role"] != "slave" or info.get("master_link_status") != "up":
            return False
    with redis.Redis(port=cluster.nodes[cluster.replica_of(0)].port, socket_timeout=1) as c:
        return node_acks(c) == 1


def _until(ok: Callable[[], bool], bound: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < bound:
        if ok():
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"not within {bound} s")


class _Probe:
    """Runs a new transition on the dead primary's slots until one is settled: each try
    must succeed, raise DurabilityError (no replica acknowledges yet), or raise the
    BackendError of a connection that is failing over."""

    def __init__(self, run: Callable[[str], Any], namespace: str) -> None:
        self.run = run
        self.ops = iter(_ops_on(0, namespace, 10_000, "new"))
        self.errors: list[str] = []

    def __call__(self) -> bool:
        try:
            self.run(next(self.ops))
        except DurabilityError:
            return True
        except BackendError as exc:
            self.errors.append(str(exc))
            return False
        return True


@pytest.mark.parametrize("min_replicas", [0, 1])
def test_sync_settler_follows_the_promoted_replica(
    replicated: LocalCluster, namespace: str, min_replicas: int, figures: dict[str, str]
) -> None:
    acked = _ops_on(0, namespace, 5, "acked")
    s = Settler.from_cluster(
        replicated.url, namespace=namespace, shards=SHARDS, min_replicas=min_replicas
    )
    for op in acked:
        r = s.reserve(op, REQ, principal=WHO)
        assert isinstance(r, Reserved)
        assert s.complete(r.reservation, {"ok": op}).verdict is Verdict.ACCEPTED
    if min_replicas == 0:  # no WAIT in settle: make sure the replica has them before the kill
        with replicated.client(0) as c:
            assert node_acks(c, timeout_ms=5000) == 1

    def transition(op: str) -> None:
        r = s.reserve(op, REQ, principal=WHO)
        assert isinstance(r, Reserved)
        assert s.complete(r.reservation, {"ok": op}).verdict is Verdict.ACCEPTED

    probe = _Probe(transition, namespace)
    assert probe()  # warm: the settler's node clients are connected before the kill
    replicated.nodes[0].stop(kill=True)
    killed = time.monotonic()
    try:
        promoted = _until(lambda: _promoted(replicated, replicated.replica_of(0)), FAILOVER_BOUND)
        followed = _until(probe, FAILOVER_BOUND) + (time.monotonic() - killed - promoted)
        figures[f"cluster failover, min_replicas={min_replicas}: kill to promoted"] = (
            f"{promoted:.1f} s"
        )
        figures[f"cluster failover, min_replicas={min_replicas}: kill to settled again"] = (
            f"{time.monotonic() - killed:.1f} s"
        )
        assert followed < FAILOVER_BOUND
        assert all("after" in e for e in probe.errors)  # typed, with settle's retries
        # Acknowledged completions survived and replay.
        for op in acked:
            record = s.get(op)
            assert record is not None
            assert record.state is State.COMPLETED
            if min_replicas == 0:
                replay = s.reserve(op, REQ, principal=WHO)
                assert isinstance(replay, Replay)
    finally:
        replicated.nodes[0].start()  # rejoins as the replica of the promoted node
    _until(lambda: _rejoined(replicated), FAILOVER_BOUND)
    # With a replica again, new transitions are acknowledged.
    op = _ops_on(0, namespace, 1, "after")[0]
    r = s.reserve(op, REQ, principal=WHO)
    assert isinstance(r, Reserved)
    assert s.complete(r.reservation, {"ok": op}).verdict is Verdict.ACCEPTED
    s.close()


def test_async_settler_with_min_replicas_follows_the_promoted_replica(
    replicated: LocalCluster, namespace: str
) -> None:
    acked = _ops_on(0, namespace, 5, "acked")

    async def main() -> None:
        a = AsyncSettler.from_cluster(
            replicated.startup_nodes, namespace=namespace, shards=SHARDS, min_replicas=1
        )
        for op in acked:
            r = await a.reserve(op, REQ, principal=WHO)
            assert isinstance(r, Reserved)
            assert (await a.complete(r.reservation, {"ok": op})).verdict is Verdict.ACCEPTED
        replicated.nodes[0].stop(kill=True)
        ops = iter(_ops_on(0, namespace, 10_000, "new"))
        errors: list[BaseException] = []
        started = time.monotonic()
        while time.monotonic() - started < FAILOVER_BOUND:
            try:
                r = await a.reserve(next(ops), REQ, principal=WHO)
                assert isinstance(r, Reserved)
                await a.complete(r.reservation, {"ok": 1})
                break
            except DurabilityError:
                break
            except BackendError as exc:
                errors.append(exc)
                await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"still failing after {FAILOVER_BOUND} s: {errors[-1]}")
        for op in acked:
            record = await a.get(op)
            assert record is not None
            assert record.state is State.COMPLETED
        await a.aclose()

    try:
        asyncio.run(main())
    finally:
        replicated.nodes[0].start()
