"""``min_replicas`` on Redis Cluster: the script and its WAIT run on the connection of the node
that serves the call's slot. Tested with a real cluster of 2 primaries with 1 replica each,
and with one replica stopped: only the shards of that replica's primary raise
``DurabilityError``, the others carry on."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator

import pytest
import redis
from redis.crc import key_slot
from structlog.testing import capture_logs

from settle import AsyncSettler, DurabilityError, Reserved, Settler, State, Verdict
from settle._core.keys import Keys
from settle._core.layout import unpack
from settle._runtime.topology import has_functions
from tests.cancelling import lost_cancellations
from tests.cluster.cluster_support import SLOTS, LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.faults]

REQ = {"amount": 1000}
WHO = "tenant:acme"
SHARDS = 16
RESULT = {"ok": True}


@pytest.fixture(scope="module")
def replicated() -> Iterator[LocalCluster]:
    running = LocalCluster(primaries=2, replicas=1).start()
    try:
        yield running
    finally:
        running.close()


def _primary_of(op: str, namespace: str) -> int:
    """Index of the primary serving ``op`` (the slots are split in two equal runs)."""
    slot = key_slot(Keys(namespace, SHARDS).record(op).encode())
    return 0 if slot < SLOTS // 2 else 1


def _ops_per_primary(namespace: str) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {0: [], 1: []}
    i = 0
    while min(len(v) for v in found.values()) < 3:
        op = f"op-{i}"
        found[_primary_of(op, namespace)].append(op)
        i += 1
    return found


def _replica_state(cluster: LocalCluster, primary: int, namespace: str, op: str) -> bytes | None:
    replica = redis.Redis(
        port=cluster.nodes[cluster.replica_of(primary)].port, single_connection_client=True
    )
    try:
        replica.execute_command("READONLY")  # let a cluster replica answer reads itself
        stored: bytes | None = replica.get(Keys(namespace, SHARDS).record(op))
        record = unpack(stored).record if stored is not None else None
        return record[b"state"] if record is not None else None
    finally:
        replica.close()


def test_min_replicas_on_a_cluster_waits_on_each_slots_own_node(
    replicated: LocalCluster, namespace: str
) -> None:
    ops = _ops_per_primary(namespace)
    with Settler.from_cluster(
        replicated.url, namespace=namespace, shards=SHARDS, min_replicas=1
    ) as s:
        for primary, names in ops.items():
            for op in names:
                r = s.reserve(op, REQ, principal=WHO)
                assert isinstance(r, Reserved)
                assert s.complete(r.reservation, RESULT).verdict is Verdict.ACCEPTED
                # Acknowledged means the replica of that slot's primary holds it already.
                assert _replica_state(replicated, primary, namespace, op) == b"completed"


def test_async_min_replicas_on_a_cluster_and_a_flushed_script_cache(
    replicated: LocalCluster, namespace: str
) -> None:
    ops = _ops_per_primary(namespace)

    async def main() -> None:
        a = AsyncSettler.from_cluster(
            replicated.startup_nodes[:2], namespace=namespace, shards=SHARDS, min_replicas=1
        )
        rs = {op: await a.reserve(op, REQ, principal=WHO) for op in ops[0] + ops[1]}
        for i in range(2):
            with replicated.client(i) as c:
                c.script_flush()
                if has_functions(c.info("server")):  # Redis 7+, Valkey: FCALL
                    c.function_flush()
        for op, r in rs.items():
            assert isinstance(r, Reserved)
            assert (await a.complete(r.reservation, RESULT)).verdict is Verdict.ACCEPTED
            assert _replica_state(replicated, _primary_of(op, namespace), namespace, op) == (
                b"completed"
            )
        await a.aclose()

    asyncio.run(main())


def test_a_stopped_replica_fails_only_its_primarys_shards(
    replicated: LocalCluster, namespace: str
) -> None:
    ops = _ops_per_primary(namespace)
    # A replica that just rejoined can take a while to acknowledge on a loaded machine; 1 s
    # keeps the healthy shards' WAIT from timing out while the stopped one still fails.
    s = Settler.from_cluster(
        replicated.url, namespace=namespace, shards=SHARDS, min_replicas=1, replica_timeout=1.0
    )
    held = {op: s.reserve(op, REQ, principal=WHO) for op in ops[0] + ops[1]}
    replica = replicated.nodes[replicated.replica_of(1)]
    replica.stop(kill=True)
    try:
        with replicated.client(1) as c:
            deadline = time.monotonic() + 10
            while c.info("replication")["connected_slaves"] and time.monotonic() < deadline:
                time.sleep(0.02)
        for op in ops[0]:
            r = held[op]
            assert isinstance(r, Reserved)
            assert s.complete(r.reservation, RESULT).verdict is Verdict.ACCEPTED
        for op in ops[1]:
            r = held[op]
            assert isinstance(r, Reserved)
            with capture_logs() as logs, pytest.raises(DurabilityError) as info:
                s.complete(r.reservation, RESULT)
            assert (info.value.acknowledged, info.value.required) == (0, 1)
            assert info.value.operation_id == op
            assert not [e for e in logs if e["event"] == "settle.backend.retrying"]
            # Uncertain, not lost: the primary applied it.
            assert s.get(op).state is State.COMPLETED
    finally:
        replica.start()  # same port and nodes.conf: it rejoins as the replica of primary 1
        replicated.wait_ok()
    # Once the replica is back the repeats are absorbed and acknowledged.
    for op in ops[1]:
        r = held[op]
        assert isinstance(r, Reserved)
        assert s.complete(r.reservation, RESULT).verdict is Verdict.ABSORBED
        assert _replica_state(replicated, 1, namespace, op) == b"completed"
    s.close()


def test_async_min_replicas_on_a_cluster_keeps_cancellations(
    replicated: LocalCluster, namespace: str
) -> None:
    """Python 3.11: the durable path's per-node clients (each write and its WAIT) sent with
    redis-py's wait_for and lost 25 of 40 cancellations; they keep them now."""

    async def main() -> None:
        a = AsyncSettler.from_cluster(
            replicated.startup_nodes[:2], namespace=namespace, shards=SHARDS, min_replicas=1
        )
        n = itertools.count()
        try:
            await a.reserve("cancel-warm", REQ, principal=WHO)
            lost = await lost_cancellations(lambda: a.reserve(f"c-{next(n)}", REQ, principal=WHO))
            assert lost == 0
        finally:
            await a.aclose()

    asyncio.run(main())
