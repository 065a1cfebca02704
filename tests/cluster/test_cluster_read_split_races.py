"""Reads apart (a cursor's ``witnesses``, a progress store's ``read``, refused by a migrating
slot and read one key at a time) are not one atomic read: a write between two of them must
not give an answer that never was (a checkpoint of one generation with witnesses of the
next, an intent open for a delivery the progress does not list as applied); they read
again when the checkpoint or the meta changed. And read apart, a stream's state gives the
answer its script gives: an index entry without its witness or receipt left out, a
checkpoint that is not one ``CorruptRecord``. A cluster down is no migration: each such
read fails typed, never read apart.

Each test migrates a slot of its own namespace and looks only at its own namespace's keys."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from redis.crc import key_slot
from structlog.testing import capture_logs

from settle import Settler
from settle.cursor import CursorStore
from settle.cursor._keys import stream_keys
from settle.errors import BackendError, CorruptRecord
from settle.progress import ProgressStore
from settle.progress.identity import DeliveryId, EmissionId, ProviderScope
from tests.cluster.cluster_support import LocalCluster
from tests.cluster.test_cluster_quarantine_resharding import SHARDS, moving
from tests.cluster.test_cluster_read_split import _fed_stream, _migrating

pytestmark = [pytest.mark.cluster, pytest.mark.faults, pytest.mark.asyncio]

__all__ = ["moving"]  # the resharding tests' cluster fixture, for this module too

SCOPE = ProviderScope("orders", "billing", "inc1")


@contextmanager
def _written_between(
    runner: Any,
    cluster: LocalCluster,
    slot: int,
    namespace: str,
    when: Callable[..., bool],
    write: Callable[[], None],
) -> Iterator[None]:
    """``runner``'s single-key reads, with the migration of ``slot`` finished and ``write``
    run once just before the first read ``when(what, key)`` picks (another client's write
    between two reads apart; the write is refused while the slot is split)."""
    command = runner.command
    done = False

    def between(what: str, *args: Any, **kwargs: Any) -> Any:
        nonlocal done
        if not done and when(what, kwargs.get("key")):
            done = True
            source = cluster.serving(slot)
            target = (source + 1) % cluster.primaries
            rest = cluster.keys_in_slot(source, slot)
            if rest:
                cluster.move_keys(source, target, rest)
            cluster.migrated(slot, target)
            write()
        return command(what, *args, **kwargs)

    runner.command = between
    try:
        yield
    finally:
        runner.command = command
    assert done


def _start_migrating(cluster: LocalCluster, slot: int, moved: list[str]) -> None:
    source = cluster.serving(slot)
    target = (source + 1) % cluster.primaries
    cluster.start_migrating(slot, source, target)
    cluster.move_keys(source, target, moved)


async def test_witnesses_read_apart_while_a_step_promotes_read_again(
    moving: LocalCluster, namespace: str
) -> None:
    """A step promotes between the witness index's read and the witnesses' (the disposition
    of the one it promotes changes, a witness of the next generation is added): the answer
    is the witnesses after it, never the promoted one without its successor's."""
    stream = "orders"
    keys = stream_keys(namespace, stream)
    slot = key_slot(keys[0].encode())
    with CursorStore.from_cluster(moving.url, namespace=namespace) as writer:
        _fed_stream(writer, stream, 2)
        with CursorStore.from_cluster(moving.url, namespace=namespace) as store:
            _start_migrating(moving, slot, [keys[0]])
            with (
                _written_between(
                    store._runner,
                    moving,
                    slot,
                    namespace,
                    lambda what, key: what == "HMGET",
                    lambda: _fed_stream(writer, stream, 3),
                ),
                capture_logs() as logs,
            ):
                got = store.witnesses(stream)
            assert [e for e in logs if e["event"] == "settle.cluster.read_split"]
            assert got == store.witnesses(stream)
            now = store.checkpoint(stream)
            assert now is not None
            assert now.promoted_witness in {w.attempt_id for w in got}


async def test_progress_read_apart_while_a_delivery_is_applied_reads_again(
    moving: LocalCluster, namespace: str
) -> None:
    """A delivery applied between the applied hash's read and the intents' (its intent
    opened, the meta's version bumped): the answer is the progress after it, never the
    intent of a delivery the progress does not list as applied."""
    with ProgressStore.from_cluster(moving.url, consumer="c1", namespace=namespace) as writer:
        writer.apply(SCOPE, DeliveryId("1-1"), EmissionId("e1"), lambda c: None)
        with ProgressStore.from_cluster(moving.url, consumer="c1", namespace=namespace) as store:
            keys = store.core.keys.scope(SCOPE.scope_id)
            slot = key_slot(keys[0].encode())
            _start_migrating(moving, slot, [keys[0]])
            with (
                _written_between(
                    store._runner,
                    moving,
                    slot,
                    namespace,
                    lambda what, key: key == keys[4],
                    lambda: writer.apply(
                        SCOPE, DeliveryId("1-2"), EmissionId("e2"), lambda c: None
                    ),
                ),
                capture_logs() as logs,
            ):
                got = store.read(SCOPE)
            assert [e for e in logs if e["event"] == "settle.cluster.read_split"]
            assert got == store.read(SCOPE)
            assert {i.delivery.value for i in got.intents} == {"1-1", "1-2"}


async def test_a_stream_read_apart_gives_what_its_script_gives(
    moving: LocalCluster, namespace: str
) -> None:
    """Index entries without their witness or receipt (the script leaves them out), and a
    checkpoint that is not one (``CorruptRecord``), read apart as the script reads them."""
    stream, broken = "orders", "broken"
    keys, bad = stream_keys(namespace, stream), stream_keys(namespace, broken)
    with CursorStore.from_cluster(moving.url, namespace=namespace) as store:
        _fed_stream(store, stream, 2)
        with moving.client(moving.serving(key_slot(keys[0].encode()))) as c:
            c.zadd(keys[2], {"ab" * 16: 10**17})  # a witness the index names, gone
            c.zadd(keys[4], {"evt-gone": 1.5})  # a receipt the index names, gone
        with moving.client(moving.serving(key_slot(bad[0].encode()))) as c:
            c.set(bad[0], "not a checkpoint")

        def inspected(name: str) -> tuple[Any, ...]:
            return (store.checkpoint(name), store.witnesses(name), store.receipts(name))

        before = inspected(stream)
        assert len(before[1]) >= 2
        assert len(before[2]) == 2
        with _migrating(moving, key_slot(keys[0].encode()), namespace, [keys[0]]):
            with capture_logs() as logs:
                assert inspected(stream) == before
            assert [e for e in logs if e["event"] == "settle.cluster.read_split"]
        for read in (store.checkpoint, store.witnesses, store.receipts):
            with pytest.raises(CorruptRecord):
                read(broken)
        with _migrating(moving, key_slot(bad[0].encode()), namespace, []):
            for read in (store.checkpoint, store.witnesses, store.receipts):
                with capture_logs() as logs, pytest.raises(CorruptRecord):
                    read(broken)
                assert [e for e in logs if e["event"] == "settle.cluster.read_split"]


async def test_a_cluster_down_is_no_split_for_any_part() -> None:
    """CLUSTERDOWN (a primary without a replica dead) refuses every read: ``attempts``, a
    cursor's inspection and a progress store's read fail typed, logged as a failure once,
    never taken for a migration (``settle.cluster.read_split``) and read apart."""
    cluster = LocalCluster(primaries=3).start()
    try:
        namespace = "down-parts"
        with (
            Settler.from_cluster(cluster.url, namespace=namespace, shards=SHARDS) as s,
            CursorStore.from_cluster(cluster.url, namespace=namespace) as cursor,
            ProgressStore.from_cluster(cluster.url, consumer="c1", namespace=namespace) as p,
        ):
            r = s.reserve("op-1", {"n": 1}, principal="p")
            s.complete(r.reservation, {"done": 1})
            cursor.start("orders", b"c0")
            p.apply(SCOPE, DeliveryId("1-1"), EmissionId("e1"), lambda c: None)
            reads: list[Callable[[], Any]] = [
                lambda: s.attempts("op-1"),
                lambda: cursor.witnesses("orders"),
                lambda: cursor.receipts("orders"),
                lambda: p.read(SCOPE),
            ]
            for read in reads:
                read()
            cluster.nodes[2].stop(kill=True)
            deadline = time.monotonic() + 30
            while True:  # every node answers CLUSTERDOWN once the dead one is flagged
                with cluster.client(0) as c:
                    if c.cluster("INFO")["cluster_state"] == "fail":
                        break
                assert time.monotonic() < deadline, "the cluster never went down"
                await asyncio.sleep(0.2)
            for read in reads:
                with capture_logs() as logs, pytest.raises(BackendError):
                    read()
                events = [e["event"] for e in logs]
                assert events.count("settle.backend.failed") == 1, logs
                assert "settle.cluster.read_split" not in events, logs
    finally:
        cluster.close()


def _witness(store: CursorStore, stream: str, aid: str) -> None:
    """A pending witness of an empty response to the checkpoint's cursor (witness.lua)."""
    ck = store.checkpoint(stream)
    assert ck is not None
    seen = [w for w in store.witnesses(stream, limit=100) if w.generation == ck.generation]
    call = store.core._call(
        "witness",
        stream,
        ck.generation,
        ck.cursor_digest,
        aid,
        ck.cursor,
        "[]",
        ck.cursor,
        ck.cursor_digest,
        "",
        "",
        "first",
        ck.boundary,
        "pending",
        "",
        len(seen),
    )
    assert store.core.decode_witness(call, store.run(call)) == aid


async def test_witnesses_read_apart_while_one_is_recorded_and_another_resumed(
    moving: LocalCluster, namespace: str
) -> None:
    """Neither a witness recorded nor another resumed (its ``updated``) changes the
    checkpoint. Both between the index's read and the witnesses' (the recording first): the
    answer is the witnesses at one moment, never the resumed one's new ``updated`` without
    the witness recorded before it."""
    stream = "orders"
    keys = stream_keys(namespace, stream)
    slot = key_slot(keys[0].encode())
    with CursorStore.from_cluster(moving.url, namespace=namespace) as writer:
        writer.start(stream, b"c0")
        _witness(writer, stream, "aa" * 16)
        with CursorStore.from_cluster(moving.url, namespace=namespace) as store:
            before = store.witnesses(stream)
            assert [w.attempt_id for w in before] == ["aa" * 16]
            ck = store.checkpoint(stream)
            assert ck is not None

            def recorded_then_resumed() -> None:
                _witness(writer, stream, "bb" * 16)
                time.sleep(0.01)  # the resume's `updated`, a millisecond apart at least
                call = writer.core.plan_resume(stream, "aa" * 16, ck.generation)
                assert writer.core.decode_resume(call, writer.run(call))

            _start_migrating(moving, slot, [keys[0]])
            with _written_between(
                store._runner,
                moving,
                slot,
                namespace,
                lambda what, key: what == "HMGET",
                recorded_then_resumed,
            ):
                got = store.witnesses(stream)
            resumed = next(w for w in got if w.attempt_id == "aa" * 16)
            assert resumed != before[0]  # read after the resume
            assert got == store.witnesses(stream)


@pytest.mark.parametrize(
    ("field", "value"), [("pruned", "01"), ("gen", "1.5"), ("bound", "x")], ids=str
)
async def test_a_checkpoint_that_is_not_one_is_corrupt_read_apart_too(
    moving: LocalCluster, namespace: str, field: str, value: str
) -> None:
    """The scripts take a checkpoint hash whose generation, boundary or pruned position is
    not an integer as settle writes one for corrupt (``CorruptRecord``, nothing read past
    it); read apart, it is the same, never a checkpoint with its witnesses."""
    stream = "odd"
    keys = stream_keys(namespace, stream)
    with CursorStore.from_cluster(moving.url, namespace=namespace) as store:
        _fed_stream(store, stream, 1)
        with moving.client(moving.serving(key_slot(keys[0].encode()))) as c:
            c.hset(keys[0], field, value)
        reads = (store.checkpoint, store.witnesses, store.receipts)
        for read in reads:
            with pytest.raises(CorruptRecord):
                read(stream)
        with _migrating(moving, key_slot(keys[0].encode()), namespace, [keys[0]]):
            for read in reads:
                with capture_logs() as logs, pytest.raises(CorruptRecord):
                    read(stream)
                assert [e for e in logs if e["event"] == "settle.cluster.read_split"]


@contextmanager
def _written_before_each(
    runner: Any,
    cluster: LocalCluster,
    slot: int,
    when: Callable[..., bool],
    write: Callable[[], None],
) -> Iterator[list[int]]:
    """``runner``'s single-key reads, with the migration of ``slot`` finished and ``write``
    run before each read ``when(what, key)`` picks: a read apart whose state changes under
    every round of it. Yields the list of the writes made (one item each)."""
    command = runner.command
    writes: list[int] = []

    def before(what: str, *args: Any, **kwargs: Any) -> Any:
        if when(what, kwargs.get("key")):
            if not writes:
                source = cluster.serving(slot)
                target = (source + 1) % cluster.primaries
                rest = cluster.keys_in_slot(source, slot)
                if rest:
                    cluster.move_keys(source, target, rest)
                cluster.migrated(slot, target)
            write()
            writes.append(1)
        return command(what, *args, **kwargs)

    runner.command = before
    try:
        yield writes
    finally:
        runner.command = command


def _gives_up(
    store: Any,
    cluster: LocalCluster,
    slot: int,
    when: Callable[..., bool],
    write: Callable[[], None],
    read: Callable[[], Any],
    script: str,
) -> None:
    """``read``, a read apart whose state ``write`` changes under every round, raises
    ``BackendError`` and logs ``settle.backend.failed`` once."""
    with (
        _written_before_each(store._runner, cluster, slot, when, write) as writes,
        capture_logs() as logs,
        pytest.raises(BackendError, match="kept changing"),
    ):
        read()
    assert len(writes) > 1
    failed = [e for e in logs if e["event"] == "settle.backend.failed"]
    assert [(e["script"], e["raised"]) for e in failed] == [(script, "BackendError")]


async def test_reads_apart_that_never_settle_fail_typed_and_logged(
    moving: LocalCluster, namespace: str
) -> None:
    """A read apart whose checkpoint (a cursor's) or meta (a progress store's) changes under
    each of its rounds gives up: ``BackendError``, logged as every failure a call gives up
    on (``settle.backend.failed``): an operator sees why the read failed."""
    stream = "orders"
    keys = stream_keys(namespace, stream)
    with CursorStore.from_cluster(moving.url, namespace=namespace) as writer:
        writer.start(stream, b"c0")
        with CursorStore.from_cluster(moving.url, namespace=namespace) as store:

            def reset() -> None:
                ck = writer.checkpoint(stream)
                assert ck is not None
                writer.reset(stream, cursor=b"c0", boundary=0, expected_generation=ck.generation)

            slot = key_slot(keys[0].encode())
            _start_migrating(moving, slot, [])
            _gives_up(
                store,
                moving,
                slot,
                lambda what, key: what == "ZRANGEBYSCORE",
                reset,
                lambda: store.receipts(stream),
                "receipts",
            )
    with ProgressStore.from_cluster(moving.url, consumer="c9", namespace=namespace) as writer:
        writer.apply(SCOPE, DeliveryId("1-1"), EmissionId("e1"), lambda c: None)
        with ProgressStore.from_cluster(moving.url, consumer="c9", namespace=namespace) as store:
            pkeys = store.core.keys.scope(SCOPE.scope_id)
            slot = key_slot(pkeys[0].encode())
            n = iter(range(2, 100))

            def apply() -> None:
                i = next(n)
                writer.apply(SCOPE, DeliveryId(f"1-{i}"), EmissionId(f"e{i}"), lambda c: None)

            _start_migrating(moving, slot, [pkeys[0]])
            _gives_up(
                store,
                moving,
                slot,
                lambda what, key: key == pkeys[4],
                apply,
                lambda: store.read(SCOPE),
                "read",
            )
