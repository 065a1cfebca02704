"""Quarantine reads while the slot of a shard migrates (``redis-cli --cluster reshard``: CLUSTER
SETSLOT IMPORTING / MIGRATING, then MIGRATE of the slot's keys a few at a time).

A read of a shard's quarantine is one script over two keys: the stream and its resolutions
hash. While the slot migrates, a node runs a script of several keys only if it holds every one
of them, and answers TRYAGAIN otherwise: a hash not created yet (nothing was resolved in that
shard) or a stream moved ahead of its hash (or behind it). An operator's ``quarantine.list()``,
``get()``, ``settle quarantine ls`` and ``settle stats`` all failed with ``BackendError``
("TTL exhausted") for as long as the slot stayed split, each after seconds of retries. Now a
read that is refused so is done in two single-key reads, which a migrating slot serves (ASK):
the stream's entries, then their resolutions; the answer is the same as before the move."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from redis.crc import key_slot
from structlog.testing import capture_logs

from settle import AsyncSettler, Settler
from settle._core.keys import Keys, shard_of
from settle.cli.stats import count_quarantine
from settle.errors import BackendError
from tests.cli.helpers import stale_settlement
from tests.cluster.cluster_support import LocalCluster
from tests.integration.conftest import Awaitable

pytestmark = [pytest.mark.cluster, pytest.mark.faults, pytest.mark.asyncio]

SHARDS = 4


@pytest.fixture(scope="module")
def moving() -> Iterator[LocalCluster]:
    """3 primaries; tests move slots, each in its own namespace, asking which node serves."""
    running = LocalCluster(primaries=3).start()
    try:
        yield running
    finally:
        running.close()


@asynccontextmanager
async def _settler(cluster: LocalCluster, flavour: str, namespace: str) -> AsyncIterator[Any]:
    options: dict[str, Any] = {"namespace": namespace, "shards": SHARDS}
    if flavour == "sync":  # from_url: switches to a cluster client at its first call
        s = Settler.from_url(cluster.url, **options)
        try:
            yield Awaitable(s)
        finally:
            s.close()
    else:
        a = AsyncSettler.from_cluster(cluster.url, **options)
        try:
            yield a
        finally:
            await a.aclose()


def _late_settlements(cluster: LocalCluster, namespace: str, shard: int, n: int) -> list[str]:
    """``n`` quarantine entries in ``shard`` (late settlements of a superseded attempt)."""
    refs: list[str] = []
    with Settler.from_cluster(cluster.url, namespace=namespace, shards=SHARDS) as s:
        i = 0
        while len(refs) < n:
            i += 1
            operation_id = f"late-{i}"
            if shard_of(operation_id, SHARDS) == shard:
                refs.append(stale_settlement(s, operation_id))
    return refs


@pytest.mark.parametrize("resolved", [False, True], ids=["none-resolved", "one-resolved"])
@pytest.mark.parametrize("split", ["nothing-moved", "stream-moved", "rest-moved"])
async def test_quarantine_reads_of_a_shard_whose_slot_migrates_give_the_whole_answer(
    moving: LocalCluster, namespace: str, flavour: str, split: str, resolved: bool
) -> None:
    keys = Keys(namespace, SHARDS)
    refs = _late_settlements(moving, namespace, 0, 3)
    async with _settler(moving, flavour, namespace) as s:
        if resolved:
            await s.quarantine.resolve(refs[0], note="refunded")
        before = {e.ref: e for e in await s.quarantine.list()}
        assert set(before) == set(refs)
        slot = key_slot(keys.quarantine(0).encode())
        assert key_slot(keys.resolutions(0).encode()) == slot
        source = moving.serving(slot)
        target = (source + 1) % moving.primaries
        moving.start_migrating(slot, source, target)
        try:
            held = moving.keys_in_slot(source, slot)
            stream = keys.quarantine(0)
            if split == "stream-moved":
                moving.move_keys(source, target, [stream])
            elif split == "rest-moved":
                moving.move_keys(source, target, [k for k in held if k != stream])
            listed = {e.ref: e for e in await s.quarantine.list()}
            assert listed == before
            unresolved = [e.ref for e in await s.quarantine.list(unresolved=True)]
            assert set(unresolved) == set(refs[1:] if resolved else refs)
            for limit in (1, 2):  # a page whose first matches were resolved comes out short
                page = await s.quarantine.list(unresolved=True, limit=limit)
                assert [e.ref for e in page] == unresolved[:limit]
            for ref in refs:
                assert await s.quarantine.get(ref) == before[ref]
            if flavour == "sync":  # settle quarantine ls: its first call is the listing
                with Settler.from_url(moving.url, namespace=namespace, shards=SHARDS) as fresh:
                    assert {e.ref: e for e in fresh.quarantine.list()} == before
            if flavour == "sync":  # settle stats: a walk of headers, no payload read
                kinds, marks = count_quarantine(s._target)
                assert not marks
                assert kinds["stale_generation"] == {
                    "unresolved": 2 if resolved else 3,
                    "resolved": 1 if resolved else 0,
                }
        finally:
            rest = moving.keys_in_slot(source, slot)
            if rest:
                moving.move_keys(source, target, rest)
            moving.migrated(slot, target)
        assert {e.ref: e for e in await s.quarantine.list()} == before


@pytest.mark.parametrize("split", ["nothing-moved", "half-moved"])
async def test_get_many_of_a_shard_whose_slot_migrates_reads_every_record(
    moving: LocalCluster, namespace: str, flavour: str, split: str
) -> None:
    """``get_many`` (and ``settle stats``, the console's overview, which count records with
    it) reads up to 100 records of one shard in one script: refused while the migration
    split them, or while one of the ids has no record (a key the importing node cannot
    have). It failed with ``BackendError`` for the whole split; a refused call is now sent
    again a record at a time."""
    keys = Keys(namespace, SHARDS)
    ids = [f"op-{i}" for i in range(40) if shard_of(f"op-{i}", SHARDS) == 0][:6]
    async with _settler(moving, flavour, namespace) as s:
        for operation_id in ids[:5]:  # the last has no record
            reserved = await s.reserve(operation_id, {"n": operation_id}, principal="p")
            await s.complete(reserved.reservation, {"done": operation_id})
        before = await s.get_many(ids)
        assert [r is None for r in before] == [False] * 5 + [True]
        slot = key_slot(keys.record(ids[0]).encode())
        source = moving.serving(slot)
        target = (source + 1) % moving.primaries
        moving.start_migrating(slot, source, target)
        try:
            if split == "half-moved":
                moving.move_keys(source, target, [keys.record(o) for o in ids[:2]])
            assert await s.get_many(ids) == before
            assert await s.get_many(ids[:5]) == before[:5]
            if flavour == "sync":  # from_url's first call (no `with`): checked, then a cluster
                fresh = Settler.from_url(moving.url, namespace=namespace, shards=SHARDS)
                try:
                    assert fresh.get_many(ids) == before
                finally:
                    fresh.close()
        finally:
            rest = moving.keys_in_slot(source, slot)
            if rest:
                moving.move_keys(source, target, rest)
            moving.migrated(slot, target)
        assert await s.get_many(ids) == before


async def test_an_entry_trimmed_between_the_two_reads_is_not_listed_as_unresolved(
    moving: LocalCluster, namespace: str
) -> None:
    """The two single-key reads are not one atomic read: a resolved entry trimmed (with its
    resolution) after the stream was read and before its resolutions were must not come out
    as unresolved (it was resolved before the call began): it is left out, as it is gone."""
    keys = Keys(namespace, SHARDS)
    refs = _late_settlements(moving, namespace, 0, 3)
    async with _settler(moving, "async", namespace) as s:
        await s.quarantine.resolve(refs[0], note="refunded")
        slot = key_slot(keys.quarantine(0).encode())
        source = moving.serving(slot)
        target = (source + 1) % moving.primaries
        moving.start_migrating(slot, source, target)
        runner = s._runner
        command = runner.command
        finished = False

        async def trimmed_first(what: str, *args: Any, **kwargs: Any) -> Any:
            nonlocal finished
            if what == "HMGET" and not finished:  # the slot moves on, a trim runs
                finished = True
                rest = moving.keys_in_slot(source, slot)
                if rest:
                    moving.move_keys(source, target, rest)
                moving.migrated(slot, target)
                with Settler.from_cluster(moving.url, namespace=namespace, shards=SHARDS) as t:
                    assert t.quarantine.trim().removed == 1
            return await command(what, *args, **kwargs)

        runner.command = trimmed_first
        try:
            moving.move_keys(source, target, [keys.quarantine(0)])
            unresolved = [e.ref for e in await s.quarantine.list(unresolved=True)]
        finally:
            runner.command = command
            if not finished:
                rest = moving.keys_in_slot(source, slot)
                if rest:
                    moving.move_keys(source, target, rest)
                moving.migrated(slot, target)
        assert finished
        assert set(unresolved) == set(refs[1:])


async def test_a_cluster_down_is_not_taken_for_a_migration() -> None:
    """The single-key reads are taken only when a migration refused the read (TRYAGAIN, or
    redis-py's "TTL exhausted" after it), never on CLUSTERDOWN (a primary without a replica
    dead): that read fails as fast as any other call, without a second round of retries."""
    cluster = LocalCluster(primaries=3).start()
    try:
        namespace = "down"
        _late_settlements(cluster, namespace, 0, 1)
        ids = [f"op-{i}" for i in range(40) if shard_of(f"op-{i}", SHARDS) == 0][:2]
        with Settler.from_cluster(cluster.url, namespace=namespace, shards=SHARDS) as s:
            assert s.get_many(ids) == [None, None]
            cluster.nodes[2].stop(kill=True)
            deadline = time.monotonic() + 30
            while True:  # every node answers CLUSTERDOWN once the dead one is flagged
                with cluster.client(0) as c:
                    if c.cluster("INFO")["cluster_state"] == "fail":
                        break
                assert time.monotonic() < deadline, "the cluster never went down"
                await asyncio.sleep(0.2)
            for read in (s.quarantine.list, lambda: s.get_many(ids)):
                # structlog's own capture: settle's events reach the stdlib logger only while
                # structlog is unconfigured, which another test in the same worker may change.
                with capture_logs() as logs, pytest.raises(BackendError):
                    read()
                failed = [e for e in logs if e["event"] == "settle.backend.failed"]
                assert len(failed) == 1, failed
    finally:
        cluster.close()
