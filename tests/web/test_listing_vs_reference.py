"""Every quarantine listing against a reference, on a real redis-server with many shards.

Hypothesis writes quarantine streams with chosen ids (the same millisecond and sequence on
several shards, interleaved across shards, empty shards), entry times (equal ones too, and
ones that disagree with the ids, as after a clock step back), kinds, operations and
resolutions. The reference reads every shard in full with XRANGE and sorts by the
listing's order (stream id, then server time, then shard). ``quarantine.list`` must be its
first ``limit`` entries, ``quarantine.scan`` all of it oldest first, and the console's pages
(any size, any budget, either direction) and its export must list every entry once, in
order, for every filter: kind, operation, since/until, unresolved, status.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from settle import AsyncSettler, Settler
from settle._core import codec
from settle._core.keys import Keys, shard_of
from settle.models import QuarantineEntry, QuarantineKind
from settle.web import _query
from tests.web.evidence import listing_order, unknown

SHARDS = 6
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
KINDS = (QuarantineKind.UNKNOWN_OPERATION, QuarantineKind.CONFLICTING_SETTLEMENT)


def _ops() -> dict[int, list[str]]:
    """Two operation ids a shard, each on the shard it hashes to (a listing by operation
    reads that shard only)."""
    ops: dict[int, list[str]] = {s: [] for s in range(SHARDS)}
    n = 0
    while any(len(v) < 2 for v in ops.values()):
        op = f"op-{n}"
        if len(ops[shard_of(op, SHARDS)]) < 2:
            ops[shard_of(op, SHARDS)].append(op)
        n += 1
    return ops


OPS = _ops()
ALL_OPS = [op for ops in OPS.values() for op in ops]


@dataclass
class World:
    redis_url: str
    namespace: str
    keys: Keys
    template: dict[bytes, bytes]


@pytest.fixture(scope="module")
def world(redis_url: str) -> Iterator[World]:
    namespace = f"listref{uuid.uuid4().hex[:8]}"
    settler = Settler.from_url(redis_url, namespace=namespace, shards=SHARDS)
    keys = Keys(namespace, SHARDS)
    try:
        settler.check()
        ref = unknown(settler, "ghost")
        shard, entry_id = ref.split("/")
        [(_, fields)] = settler.client.xrange(keys.quarantine(int(shard)), entry_id, entry_id)
        yield World(redis_url, namespace, keys, dict(fields))
    finally:
        settler.close()


# One shard's entries: strictly increasing stream ids (a few milliseconds, a few sequence
# numbers each, so that shards share ids), each with a time, a kind, an operation of the
# shard and whether it is resolved.
_ids = st.lists(st.tuples(st.integers(1, 6), st.integers(0, 2)), unique=True, max_size=7).map(
    sorted
)
_meta = st.tuples(
    # server time: µs before the id's millisecond ends, up to a few ms before, as when the
    # stream's last id ran ahead; or (negative) a moment after it, as on Redis 7.2+, whose
    # XADD takes the time frozen when the script began and TIME the clock a moment later
    st.sampled_from([1, 0, 999, 2_500, 1_000, -1_500]),
    st.sampled_from(KINDS),
    st.integers(0, 1),  # which operation of the shard
    st.booleans(),  # resolved
)


@st.composite
def quarantines(draw: st.DrawFn) -> dict[int, list[tuple[str, int, QuarantineKind, str, bool]]]:
    out = {}
    for shard in range(SHARDS):
        ids = draw(_ids)
        rows = []
        for ms, seq in ids:
            us, kind, op, resolved = draw(_meta)
            at_us = max(0, ms * 1000 + 999 - us)
            rows.append((f"{ms}-{seq}", at_us, kind, OPS[shard][op], resolved))
        out[shard] = rows
    return out


def _write(
    world: World, streams: dict[int, list[tuple[str, int, QuarantineKind, str, bool]]]
) -> None:
    with redis.Redis.from_url(world.redis_url) as r:
        for shard, rows in streams.items():
            r.delete(world.keys.quarantine(shard), world.keys.resolutions(shard))
            for entry_id, us, kind, op, resolved in rows:
                fields = {
                    **world.template,
                    b"kind": kind.value.encode(),
                    b"op": op.encode(),
                    b"us": str(us).encode(),
                }
                r.xadd(world.keys.quarantine(shard), fields, id=entry_id)  # type: ignore[arg-type]
                if resolved:
                    note = json.dumps({"note": "ok", "at": 1})
                    r.hset(world.keys.resolutions(shard), entry_id, note)


def _reference(world: World) -> list[QuarantineEntry]:
    """Every entry of every shard, read in full with XRANGE, oldest first."""
    out = []
    with redis.Redis.from_url(world.redis_url) as r:
        for shard in range(SHARDS):
            for entry_id, fields in r.xrange(world.keys.quarantine(shard)):
                flat = [x for kv in fields.items() for x in kv]
                res = r.hget(world.keys.resolutions(shard), entry_id)
                out.append(codec.decode_quarantine_entry(shard, entry_id, flat, res))
    return sorted(out, key=listing_order)


def _at(ms: int | None) -> datetime | None:
    """A bound on millisecond ``ms`` of the stream ids (half a millisecond in: a float
    timestamp rounds neither way across it)."""
    return None if ms is None else _EPOCH + timedelta(microseconds=ms * 1000 + 500)


@dataclass(frozen=True)
class Query:
    kind: QuarantineKind | None
    operation_id: str | None
    since: int | None
    until: int | None
    status: str  # all | unresolved | resolved

    def keeps(self, e: QuarantineEntry) -> bool:
        ms = (e.at - _EPOCH) // timedelta(milliseconds=1)  # the window is by the entry's time
        return (
            (self.kind is None or e.kind == self.kind)
            and (self.operation_id is None or e.operation_id == self.operation_id)
            and (self.since is None or ms >= self.since)
            and (self.until is None or ms <= self.until)
            and (self.status == "all" or (e.resolution is not None) == (self.status == "resolved"))
        )


queries = st.builds(
    Query,
    kind=st.none() | st.sampled_from(KINDS),
    operation_id=st.none() | st.sampled_from(ALL_OPS),
    since=st.none() | st.integers(1, 6),
    until=st.none() | st.integers(1, 6),
    status=st.sampled_from(["all", "unresolved", "resolved"]),
)


def _refs(entries: list[QuarantineEntry]) -> list[str]:
    return [e.ref for e in entries]


async def _console(
    world: World, q: Query, size: int, budget: int, newest: bool, ranged: list[QuarantineEntry]
) -> list[str]:
    """Every page of ``q`` from the first to the last, and then its export: the refs.
    ``ranged``: the entries the status filter chooses from, in the pages' order."""
    flt = _query.Filter(
        kind=q.kind,
        operation_id=q.operation_id,
        since=_at(q.since),
        until=_at(q.until),
        status=q.status,
    )
    settler = AsyncSettler.from_url(world.redis_url, namespace=world.namespace, shards=SHARDS)
    try:
        seen: list[str] = []
        after = None
        for _ in range(1_000):
            got = await _query.page(
                settler, flt, after=after, size=size, newest_first=newest, budget=budget
            )
            assert len(got.entries) <= size
            assert got.scanned <= budget
            if not got.partial and got.next is not None:
                assert len(got.entries) == size  # only a full page or the budget ends one
            seen += _refs(got.entries)
            if got.next is None:
                break
            # No link to an empty end: a next page has entries left to read.
            cursor = _query.Position.parse(got.next)
            assert any(_query._beyond(_query.Position.of(e), cursor, newest) for e in ranged), (
                got.next,
                got.partial,
            )
            after = got.next
        else:
            raise AssertionError("paging made no progress")
        exported = [e.ref async for e in _query.export_entries(settler, flt, batch=size)]
        return [*seen, "--export--", *exported]
    finally:
        await settler.aclose()


@given(
    streams=quarantines(),
    q=queries,
    limit=st.integers(1, 50),
    size=st.sampled_from([1, 2, 3, 5, 200]),
    budget=st.sampled_from([1, 2, 3, 7, 5_000]),
)
def test_every_listing_is_the_reference(
    world: World,
    streams: dict[int, list[tuple[str, int, QuarantineKind, str, bool]]],
    q: Query,
    limit: int,
    size: int,
    budget: int,
) -> None:
    _write(world, streams)
    everything = _reference(world)
    assert len(everything) == sum(map(len, streams.values()))
    want = [e for e in everything if q.keeps(e)]
    engine: dict[str, Any] = {
        "kind": q.kind,
        "operation_id": q.operation_id,
        "since": _at(q.since),
        "until": _at(q.until),
    }
    settler = Settler.from_url(world.redis_url, namespace=world.namespace, shards=SHARDS)
    try:
        if q.status != "resolved":
            unresolved = q.status == "unresolved"
            newest = settler.quarantine.list(**engine, unresolved=unresolved, limit=limit)
            assert _refs(newest) == _refs(want[::-1][:limit])
            oldest = settler.quarantine.list(
                **engine, unresolved=unresolved, limit=limit, newest_first=False
            )
            assert _refs(oldest) == _refs(want[:limit])
            assert _refs(list(settler.quarantine.scan(**engine, unresolved=unresolved))) == _refs(
                want
            )
            # The walk `settle stats` counts from: the same entries, as headers.
            walk = settler._core.quarantine_scan(**engine, unresolved=unresolved).headers()
            assert [
                (h.ref, h.kind, h.at, h.resolved) for h in settler.quarantine._scanned(walk)
            ] == [(e.ref, e.kind, e.at, e.resolution is not None) for e in want]
    finally:
        settler.close()
    for newest in (True, False):
        ranged = [e for e in everything if replace(q, status="all").keeps(e)]
        got = asyncio.run(
            _console(world, q, size, budget, newest, ranged[::-1] if newest else ranged)
        )
        order = _refs(want[::-1] if newest else want)
        assert got == [*order, "--export--", *_refs(want)], (newest, size, budget)


async def _pages_with_a_shard_deleted(world: World, newest: bool) -> tuple[list[str], int]:
    """Pages of two entries; after the first, the stream of the first entry's shard is
    deleted (trimmed away by an operator, say)."""
    settler = AsyncSettler.from_url(world.redis_url, namespace=world.namespace, shards=SHARDS)
    try:
        got = await _query.page(settler, _query.Filter(), size=2, newest_first=newest)
        seen = _refs(got.entries)
        gone = got.entries[0].shard
        with redis.Redis.from_url(world.redis_url) as r:
            r.delete(world.keys.quarantine(gone))
        while got.next is not None:
            got = await _query.page(
                settler, _query.Filter(), after=got.next, size=2, newest_first=newest
            )
            seen += _refs(got.entries)
        return seen, gone
    finally:
        await settler.aclose()


@pytest.mark.parametrize("newest", [True, False])
def test_a_shard_deleted_between_pages_ends_its_entries_and_no_others(
    world: World, newest: bool
) -> None:
    streams = {
        s: [(f"{ms}-{s % 2}", ms * 1000 + 2_000, KINDS[0], OPS[s][0], False) for ms in (1, 3, 5)]
        for s in range(SHARDS)
    }
    _write(world, streams)
    everything = _reference(world)
    order = everything[::-1] if newest else everything
    seen, gone = asyncio.run(_pages_with_a_shard_deleted(world, newest))
    first_two = _refs(order[:2])
    assert seen[:2] == first_two
    assert seen == first_two + [e.ref for e in order[2:] if e.shard != gone]
