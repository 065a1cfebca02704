"""Reads during a resharding are no outage: a read of several keys that a migrating slot
refuses (TRYAGAIN, or redis-py's "TTL exhausted" after it) and whose caller reads the keys
apart is handed back at the first refusal, logged as ``settle.cluster.read_split`` (INFO),
never as ``settle.backend.failed`` (ERROR) or ``settle.backend.retrying`` (WARNING): an
operator's alert fired for every such read, which succeeded, after about 2 s of retries.
``attempts`` (the record and the previous layout's attempt log: two keys) failed with
``BackendError`` for the whole migration of its slot; it is now read apart too.

Each test migrates a slot of its own namespace on the resharding tests' cluster and looks only
at its own namespace's keys."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from redis.crc import key_slot
from structlog.testing import capture_logs

from settle import Settler
from settle._core.keys import Keys, shard_of
from settle.cursor import (
    AsyncCursorStore,
    CursorConsumer,
    CursorStore,
    Event,
    Page,
    ProviderContract,
)
from settle.cursor._keys import stream_keys
from settle.errors import BackendError
from settle.progress import AsyncProgressStore, ProgressStore
from settle.progress.identity import DeliveryId, EmissionId, ProviderScope
from tests.cluster.cluster_support import LocalCluster
from tests.cluster.test_cluster_quarantine_resharding import (
    SHARDS,
    _late_settlements,
    _settler,
    moving,
)
from tests.integration.conftest import Awaitable

pytestmark = [pytest.mark.cluster, pytest.mark.faults, pytest.mark.asyncio]

__all__ = ["moving"]  # the module's cluster, shared with the resharding tests' fixture

#: The events a read that succeeded must not log.
ALERTS = ("settle.backend.failed", "settle.backend.retrying")


def _ops(n: int, shard: int = 0) -> list[str]:
    return [f"op-{i}" for i in range(200) if shard_of(f"op-{i}", SHARDS) == shard][:n]


@contextmanager
def _migrating(
    cluster: LocalCluster, slot: int, namespace: str, moved: list[str]
) -> Iterator[None]:
    """``slot`` migrating to the next primary, ``moved`` (keys of ``namespace``) moved ahead;
    the rest of the namespace's keys in it moved and the slot given over after."""
    source = cluster.serving(slot)
    target = (source + 1) % cluster.primaries
    cluster.start_migrating(slot, source, target)
    try:
        if moved:
            cluster.move_keys(source, target, moved)
        yield
    finally:
        rest = [k for k in cluster.keys_in_slot(source, slot) if f"{{{namespace}:" in k]
        if rest:
            cluster.move_keys(source, target, rest)
        others = cluster.keys_in_slot(source, slot)
        if others:  # another test's keys in the same slot go along
            cluster.move_keys(source, target, others)
        cluster.migrated(slot, target)


@pytest.mark.parametrize("split", ["nothing-moved", "record-moved"])
async def test_attempts_of_an_operation_whose_slot_migrates_reads_its_log(
    moving: LocalCluster, namespace: str, flavour: str, split: str
) -> None:
    keys = Keys(namespace, SHARDS)
    (op,) = _ops(1)
    async with _settler(moving, flavour, namespace) as s:
        first = await s.reserve(op, {"n": 1}, principal="p")
        await s.mark_provisional(first.reservation, "timeout")
        second = await s.reserve(op, {"n": 1}, principal="p")
        await s.complete(second.reservation, {"done": 1})
        before = await s.attempts(op)
        assert [a.action for a in before] == ["reserve", "mark_provisional", "reserve", "complete"]
        slot = key_slot(keys.record(op).encode())
        moved = [keys.record(op)] if split == "record-moved" else []
        with _migrating(moving, slot, namespace, moved):
            with capture_logs() as logs:
                assert await s.attempts(op) == before
                assert await s.attempts("never-reserved") == []
            assert not [e for e in logs if e["event"] in ALERTS], logs
            split_logs = [e for e in logs if e["event"] == "settle.cluster.read_split"]
            assert split_logs
            assert {e["script"] for e in split_logs} <= {"attempts"}
        assert await s.attempts(op) == before


async def test_attempts_of_a_previous_layout_record_whose_slot_migrates(
    moving: LocalCluster, namespace: str
) -> None:
    """A record of the previous layout (a HASH, its log a LIST beside it) read apart: the
    log comes from the list, as the script reads it; after a write packs it, from the record."""
    keys = Keys(namespace, SHARDS)
    (op,) = _ops(1)
    aid, gen, created = "0f" * 16, "1796000000000001", 1_796_000_000_000
    record, log = keys.record(op), keys.attempt_log(op)
    with moving.client(moving.serving(key_slot(record.encode()))) as c:
        c.hset(
            record,
            mapping={
                "op": op,
                "fp": "9b" * 32,
                "fpv": "1",
                "bind": "p",
                "gen": gen,
                "ver": "1",
                "state": "pending",
                "n": "1",
                "created": str(created),
                "updated": str(created),
                "lease": str(4_102_444_800_000),
                "aid": aid,
            },
        )
        c.pexpire(record, 3_600_000)
        c.rpush(log, f"{aid}|{gen}|reserve|reserved|new|{created}", "not an entry")
        c.pexpire(log, 3_600_000)
    with Settler.from_cluster(moving.url, namespace=namespace, shards=SHARDS) as s:
        before = s.attempts(op)
        assert [(a.attempt_id, a.action) for a in before] == [(aid, "reserve")]
        # The record moved ahead of its log: the source node refuses the two (TRYAGAIN).
        with _migrating(moving, key_slot(record.encode()), namespace, [record]):
            with capture_logs() as logs:
                assert s.attempts(op) == before
            assert [e["script"] for e in logs if e["event"] == "settle.cluster.read_split"] == [
                "attempts"
            ]
        assert s.attempts(op) == before


async def test_reads_refused_by_a_migration_log_no_failure_and_do_not_wait(
    moving: LocalCluster, namespace: str, flavour: str
) -> None:
    """``get_many``, a quarantine listing and ``attempts`` of a migrating slot, each refused
    (TRYAGAIN: a key of the call the importing node cannot hold): no failure logged, one
    ``settle.cluster.read_split`` per refused call, and no round of retries before it."""
    keys = Keys(namespace, SHARDS)
    refs = _late_settlements(moving, namespace, 0, 2)
    ids = _ops(3)
    async with _settler(moving, flavour, namespace) as s:
        reserved = await s.reserve(ids[0], {"n": 1}, principal="p")
        await s.complete(reserved.reservation, {"done": 1})
        records, listed, log = (
            await s.get_many(ids),
            await s.quarantine.list(),
            await s.attempts(ids[0]),
        )
        assert {e.ref for e in listed} == set(refs)
        slot = key_slot(keys.record(ids[0]).encode())
        assert key_slot(keys.quarantine(0).encode()) == slot
        with _migrating(moving, slot, namespace, []):
            with capture_logs() as logs:
                assert await s.get_many(ids) == records
                assert await s.quarantine.list() == listed
            assert not [e for e in logs if e["event"] in ALERTS], logs
            with capture_logs() as more:
                assert await s.attempts(ids[0]) == log
            assert not [e for e in more if e["event"] in ALERTS], more
            logs += more
            split_logs = [e for e in logs if e["event"] == "settle.cluster.read_split"]
            assert {e["script"] for e in split_logs} == {"get_many", "quarantine_read", "attempts"}
            assert all(e["log_level"] == "info" for e in split_logs)
            assert all(e["error"] in ("TryAgainError", "ClusterError") for e in split_logs)
            # Each refused call was sent once and handed back (no settle retry: no
            # ``retrying`` event above); its wall time is redis-py's own repeats of the
            # refusal (0.1 s on Redis 6.2, 0.4 s on Valkey 9.1: docs/operations.md).


async def test_a_write_refused_by_a_migration_is_not_split(
    moving: LocalCluster, namespace: str
) -> None:
    """Writes stay one atomic call: a reserve of a new operation in a migrating slot (its
    record does not exist: the importing node cannot take it) is retried, then fails typed,
    and logs the failure; nothing was written."""
    with write_refused(moving, namespace) as refused:
        with capture_logs() as logs, pytest.raises(BackendError):
            refused()
        events = [e["event"] for e in logs]
        assert "settle.backend.failed" in events
        assert "settle.cluster.read_split" not in events


@contextmanager
def write_refused(cluster: LocalCluster, namespace: str) -> Iterator[Callable[[], Any]]:
    """A reserve of a new operation whose slot migrates, its record not on the importing
    node that holds another record of the slot: the block calls it (the importing node
    refuses it, and the source has the slot's keys no more). Nothing was written after."""
    keys = Keys(namespace, SHARDS)
    ops = _ops(2)
    with Settler.from_cluster(cluster.url, namespace=namespace, shards=SHARDS) as s:
        s.reserve(ops[0], {"n": 1}, principal="p")
        slot = key_slot(keys.record(ops[1]).encode())
        with _migrating(cluster, slot, namespace, [keys.record(ops[0])]):
            yield lambda: s.reserve(ops[1], {"n": 1}, principal="p")
        assert s.get(ops[1]) is None


def _fed_stream(store: CursorStore, stream: str, pages: int) -> None:
    """``stream`` started, and ``pages`` pages of one event each applied (a witness and a
    receipt each)."""
    store.start(stream, b"c0")

    def fetch(cursor: bytes) -> Page:
        n = int(cursor[1:])
        if n >= pages:
            return Page([], cursor)
        return Page([Event(f"evt-{n}", n + 1, {"n": n})], f"c{n + 1}".encode())

    consumer = CursorConsumer(
        fetch, lambda e, c: None, ProviderContract(), store=store, stream=stream
    )
    consumer.run(max_steps=pages + 1)


@pytest.mark.parametrize("split", ["fresh-nothing-moved", "fed-checkpoint-moved"])
async def test_cursor_inspection_of_a_stream_whose_slot_migrates(
    moving: LocalCluster, namespace: str, flavour: str, split: str
) -> None:
    """``checkpoint``, ``witnesses`` and ``receipts`` read the stream's five keys in one
    script: refused while a migration splits them, or while one does not exist yet (a
    stream just started has only its checkpoint). They failed with ``BackendError`` for the
    whole migration; they are read one key at a time now, with the same answer."""
    stream = "orders"
    keys = stream_keys(namespace, stream)
    fed = split.startswith("fed")
    with CursorStore.from_cluster(moving.url, namespace=namespace) as writer:
        _fed_stream(writer, stream, 3 if fed else 0)
    if flavour == "sync":
        sync_store = CursorStore.from_cluster(moving.url, namespace=namespace)
        store: Any = Awaitable(sync_store)
        closing: Any = Awaitable(sync_store).close
    else:
        store = AsyncCursorStore.from_cluster(moving.url, namespace=namespace)
        closing = store.aclose
    try:

        async def inspected() -> tuple[Any, ...]:
            return (
                await store.checkpoint(stream),
                await store.witnesses(stream),
                await store.receipts(stream),
                await store.receipts(stream, after=1, limit=1),
            )

        before = await inspected()
        assert before[0] is not None
        if fed:
            assert before[1]
            assert len(before[2]) == 3
            assert len(before[3]) == 1
        slot = key_slot(keys[0].encode())
        with _migrating(moving, slot, namespace, [keys[0]] if fed else []):
            with capture_logs() as logs:
                assert await inspected() == before
            assert not [e for e in logs if e["event"] in ALERTS], logs
            assert [e for e in logs if e["event"] == "settle.cluster.read_split"]
        assert await inspected() == before
    finally:
        await closing()


@pytest.mark.parametrize("split", ["nothing-moved", "meta-moved"])
async def test_progress_read_of_a_scope_whose_slot_migrates(
    moving: LocalCluster, namespace: str, flavour: str, split: str
) -> None:
    """``ProgressStore.read`` (and ``show``) run one script over the scope's eleven keys,
    several of which a scope rarely has (no gap, no deferral, no emission key for a read):
    refused for the whole migration of its slot, they failed with ``BackendError``; they are
    read one key at a time now, with the same answer."""
    scope = ProviderScope("orders", "billing", "inc1")
    with ProgressStore.from_cluster(moving.url, consumer="c1", namespace=namespace) as writer:
        writer.apply(scope, DeliveryId("1-1"), EmissionId("e1"), lambda c: None)
        writer.apply(scope, DeliveryId("1-2"), EmissionId("e2"), lambda c: None)
        writer.defer(scope, DeliveryId("1-3"), EmissionId("e3"), reason="later")
    if flavour == "sync":
        sync_store = ProgressStore.from_cluster(moving.url, consumer="c1", namespace=namespace)
        store: Any = Awaitable(sync_store)
        closing: Any = Awaitable(sync_store).close
    else:
        store = AsyncProgressStore.from_cluster(moving.url, consumer="c1", namespace=namespace)
        closing = store.aclose
    try:
        before = await store.read(scope)
        assert before.applied_above_floor
        assert before.deferred
        assert before.intents
        shown = await store.show()
        keys = store.core.keys.scope(scope.scope_id)
        slot = key_slot(keys[0].encode())
        moved = [keys[0]] if split == "meta-moved" else []
        with _migrating(moving, slot, namespace, moved):
            with capture_logs() as logs:
                assert await store.read(scope) == before
                assert await store.show() == shown
            assert not [e for e in logs if e["event"] in ALERTS], logs
            assert [e for e in logs if e["event"] == "settle.cluster.read_split"]
        assert await store.read(scope) == before
    finally:
        await closing()
