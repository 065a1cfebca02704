"""``since`` / ``until`` select quarantine entries by their own time (``at``, what every view
shows), not by their stream id, in every part that reads the streams.

An entry's ``at`` is the script's TIME; its id is the server's time at XADD, or just after
the stream's last id when that is ahead of the clock (a failover to a node whose clock is
behind). The stream's last id is set ahead here for real (XSETID, as such a failover leaves
it), and settle then quarantines a response: its ``at`` is a minute before its id. By id,
``--until <its at>`` left it out and ``--since <its at + 1 ms>`` took it in.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import redis

from settle import AsyncSettler, Settler
from settle._core.keys import Keys, shard_of
from settle.models import QuarantineEntry
from settle.web import _query
from tests.cli.conftest import settle, settle_json
from tests.web.evidence import listing_order, unknown
from tests.web.test_console_http import refs_in

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
#: How far the stream's last id is set ahead of the server's clock.
AHEAD_MS = 60_000


def _ms(when: datetime) -> int:
    return (when - _EPOCH) // _MS


@dataclass
class Gap:
    """Entries written around ``gap``, whose id is ``AHEAD_MS`` past its ``at``."""

    gap: QuarantineEntry
    entries: list[QuarantineEntry]  # every entry, in the listing's order (oldest first)

    def upto(self, until: datetime) -> list[str]:
        return [e.ref for e in self.entries if _ms(e.at) <= _ms(until)]

    def from_(self, since: datetime) -> list[str]:
        return [e.ref for e in self.entries if _ms(e.at) >= _ms(since)]


def _write_gap(redis_url: str, writer: Settler) -> Gap:
    ops = [f"order-{i}" for i in range(8)]
    gap_op = ops[3]
    shard = shard_of(gap_op, writer.config.shards)
    refs = []
    for op in ops:
        if op == gap_op:
            raw = redis.Redis.from_url(redis_url)
            try:
                stream = Keys(writer.config.namespace, writer.config.shards).quarantine(shard)
                now_s, now_us = raw.time()
                ahead = now_s * 1000 + now_us // 1000 + AHEAD_MS
                raw.execute_command("XSETID", stream, f"{ahead}-0")
            finally:
                raw.close()
        refs.append(unknown(writer, op))
        time.sleep(0.003)  # a few milliseconds apart: the window's edge falls between entries
    entries = sorted((writer.quarantine.get(ref) for ref in refs), key=listing_order)
    gap = writer.quarantine.get(refs[3])
    id_ms = int(gap.id.split("-")[0])
    assert id_ms - _ms(gap.at) >= AHEAD_MS - 1_000, (gap.id, gap.at)  # the gap is real
    return Gap(gap, entries)


@pytest.fixture
def gap(redis_url: str, writer: Settler) -> Gap:
    return _write_gap(redis_url, writer)


def _newest(refs: list[str]) -> list[str]:
    return refs[::-1]


def test_list_and_scan_take_an_entry_by_its_own_time(writer: Settler, gap: Gap) -> None:
    until, since = gap.gap.at, gap.gap.at + _MS
    upto, after = gap.upto(until), gap.from_(since)
    assert gap.gap.ref in upto
    assert gap.gap.ref not in after
    assert [e.ref for e in writer.quarantine.list(until=until)] == _newest(upto)
    assert [e.ref for e in writer.quarantine.list(since=since)] == _newest(after)
    assert [e.ref for e in writer.quarantine.list(until=until, newest_first=False)] == upto
    assert [e.ref for e in writer.quarantine.scan(until=until)] == upto
    assert [e.ref for e in writer.quarantine.scan(since=since)] == after
    heads = writer.quarantine.headers(since=since, until=until + timedelta(seconds=1))
    assert [h.ref for h in heads] == _newest(gap.from_(since))
    # Every cut of the listing, both ways: the first k of the window.
    for k in range(1, len(upto) + 1):
        assert [e.ref for e in writer.quarantine.list(until=until, limit=k)] == _newest(upto)[:k]
        oldest = writer.quarantine.list(until=until, limit=k, newest_first=False)
        assert [e.ref for e in oldest] == upto[:k]


@pytest.mark.asyncio
async def test_the_async_list_scan_and_follow_take_an_entry_by_its_own_time(
    reader: AsyncSettler, gap: Gap
) -> None:
    until, since = gap.gap.at, gap.gap.at + _MS
    upto, after = gap.upto(until), gap.from_(since)
    assert [e.ref for e in await reader.quarantine.list(until=until)] == _newest(upto)
    assert [e.ref for e in await reader.quarantine.list(since=since)] == _newest(after)
    assert [e.ref async for e in reader.quarantine.scan(until=until)] == upto
    assert [e.ref async for e in reader.quarantine.scan(since=since)] == after

    async def followed() -> list[str]:
        seen: list[str] = []
        async for e in reader.quarantine.follow(since=since, poll_interval=0.05):
            seen.append(e.ref)
            if len(seen) == len(after):
                break
        return seen

    # A follow from ``since`` yields the entries of that time on (in time order), and not
    # the one whose id alone is past it.
    assert sorted(await asyncio.wait_for(followed(), 10)) == sorted(after)


def test_the_cli_ls_and_export_take_an_entry_by_its_shown_time(
    redis_url: str, writer: Settler, gap: Gap
) -> None:
    args = ("--redis-url", redis_url, "--namespace", writer.config.namespace)
    shown = settle_json("quarantine", "show", gap.gap.ref, *args)
    until, since = shown["at"], (gap.gap.at + _MS).isoformat()
    upto, after = gap.upto(gap.gap.at), gap.from_(gap.gap.at + _MS)
    ls = settle_json("quarantine", "ls", "--until", until, *args)
    assert [e["ref"] for e in ls] == _newest(upto)
    ls = settle_json("quarantine", "ls", "--since", since, *args)
    assert [e["ref"] for e in ls] == _newest(after)
    # The table's time (to the millisecond) as the operator copies it.
    table = gap.gap.at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    ls = settle_json("quarantine", "ls", "--until", table, *args)
    assert [e["ref"] for e in ls] == _newest(upto)
    for window, want in ((("--until", until), upto), (("--since", since), after)):
        done = settle("quarantine", "export", *window, *args)
        assert done.returncode == 0, done.stderr
        assert [json.loads(line)["ref"] for line in done.stdout.splitlines()] == want


@pytest.mark.asyncio
async def test_the_console_filter_and_its_pages_take_an_entry_by_its_own_time(
    reader: AsyncSettler, read_only: httpx.AsyncClient, gap: Gap
) -> None:
    until, since = gap.gap.at, gap.gap.at + _MS
    upto, after = gap.upto(until), gap.from_(since)
    for name, when, want in (("until", until, upto), ("since", since, after)):
        response = await read_only.get("/quarantine", params={name: when.isoformat()})
        assert response.status_code == 200, response.text
        assert refs_in(response.text) == _newest(want), name
    # Pages of every size across the window's edge, both ways, and the export: each entry of
    # the window on exactly one page, none of it twice, none outside it.
    inside = [r for r in gap.from_(gap.entries[1].at) if r in upto]
    for flt, want in (
        (_query.Filter(until=until), upto),
        (_query.Filter(since=since), after),
        (_query.Filter(since=gap.entries[1].at, until=until), inside),
    ):
        for size in (1, 2, 3):
            for newest_first in (True, False):
                seen: list[str] = []
                after_ref = None
                for _ in range(100):
                    got = await _query.page(
                        reader, flt, after=after_ref, size=size, newest_first=newest_first
                    )
                    seen += [e.ref for e in got.entries]
                    if got.next is None:
                        break
                    after_ref = got.next
                assert seen == (_newest(want) if newest_first else want), (flt, size, newest_first)
        exported = [e.ref async for e in _query.export_entries(reader, flt, batch=2)]
        assert exported == want, flt


@pytest.fixture
def one_shard_gap(redis_url: str, namespace: str) -> Iterator[tuple[Settler, Gap]]:
    s = Settler.from_url(redis_url, namespace=namespace, shards=1)
    s.check()
    try:
        yield s, _write_gap(redis_url, s)
    finally:
        s.close()


def test_one_shard_pages_across_the_window_edge(one_shard_gap: tuple[Settler, Gap]) -> None:
    """On one shard every entry after the gap has an id ahead of its time: a window up to
    the gap's time ends inside that run of ids, and its entries are all there."""
    settler, gap = one_shard_gap
    until = gap.gap.at
    upto = gap.upto(until)
    assert len(upto) == 4
    assert upto[-1] == gap.gap.ref
    for k in range(1, 6):
        assert [e.ref for e in settler.quarantine.list(until=until, limit=k)] == _newest(upto)[:k]
    assert [e.ref for e in settler.quarantine.scan(until=until)] == upto


def _script_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(
        int(v["calls"]) for k, v in stats.items() if any(word in k for word in ("eval", "fcall"))
    )


def test_the_entries_past_until_are_examined_by_redis_not_sent(
    one_shard_gap: tuple[Settler, Gap],
) -> None:
    """The ids up to 5 minutes past ``until`` are read, and Redis leaves out those whose
    time is past it: 600 of them after the window cost one script call, not one call each
    (nor their payloads)."""
    settler, gap = one_shard_gap
    keys = settler._core.keys
    first = gap.entries[0]
    ((_, fields),) = settler.client.xrange(keys.quarantine(0), first.id, first.id)
    at_ms = _ms(first.at)
    last_ms = int(
        settler.client.xinfo_stream(keys.quarantine(0))["last-generated-id"].split(b"-")[0]
    )
    for n in range(600):
        later = at_ms + 1 + n
        copy = {**fields, b"aid": f"w-copy-{n}".encode(), b"at": later, b"us": later * 1000}
        settler.client.xadd(keys.quarantine(0), copy, id=f"{last_ms + 1 + n}-0")
    before = _script_calls(settler.client)
    listed = settler.quarantine.list(until=first.at, limit=1)
    calls = _script_calls(settler.client) - before
    assert [e.ref for e in listed] == [first.ref]
    assert calls <= 2, calls


def _written_behind(
    settler: Settler, like: QuarantineEntry, op: str, behind_ms: int, *, us: bool = True
) -> str:
    """A copy of ``like`` XADDed now (its id the server's time) whose ``at`` is ``behind_ms``
    before the server's clock, as settle writes it on a node whose clock is that far behind
    (a failover to it, a clock stepped back): returns its ref. ``us=False``: without the
    field ``us``, as settle wrote entries before they carried it."""
    keys = settler._core.keys
    stream = keys.quarantine(like.shard)
    ((_, fields),) = settler.client.xrange(stream, like.id, like.id)
    now_s, now_us = settler.client.time()
    at_us = now_s * 1_000_000 + now_us - behind_ms * 1000
    copy = {**fields, b"op": op.encode(), b"at": at_us // 1000, b"us": at_us}
    if not us:
        del copy[b"us"]
    entry_id = settler.client.xadd(stream, copy).decode()
    return f"{like.shard}/{entry_id}"


@pytest.mark.asyncio
async def test_a_follow_shows_every_entry_written_after_it_caught_up(
    writer: Settler, reader: AsyncSettler
) -> None:
    """``since`` says where a follow starts, not what it shows for the rest of its life: an
    entry written after the follow caught up, by a node whose clock is behind ``since`` (a
    failover to it under a running ``settle quarantine tail``, which follows from the
    server's clock at its start), is new and shown. Windowed by ``at`` for good, a tail
    behind Sentinel went silent after such a failover until the new node's clock passed
    the instant the tail began."""
    first = writer.quarantine.get(unknown(writer, "order-before"))
    since = first.at + _MS
    seen: list[str] = []

    async def followed() -> None:
        async for e in reader.quarantine.follow(since=since, poll_interval=0.05):
            seen.append(e.ref)
            if len(seen) == 2:
                return

    task = asyncio.ensure_future(followed())
    await asyncio.sleep(0.5)  # the follow has read every shard to its end
    behind = _written_behind(writer, first, "order-behind", 10_000)
    later = unknown(writer, "order-after")
    await asyncio.wait_for(task, 10)
    assert seen == [behind, later]


def test_a_sync_follow_shows_every_entry_written_after_it_caught_up(writer: Settler) -> None:
    first = writer.quarantine.get(unknown(writer, "order-before"))
    seen: list[str] = []

    def follow() -> None:
        for e in writer.quarantine.follow(since=first.at + _MS, poll_interval=0.05):
            seen.append(e.ref)
            if len(seen) == 2:
                return

    # A daemon thread: the follow has no end of its own, and one that misses an entry
    # would hold the test for good.
    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    time.sleep(0.5)  # the follow has read every shard to its end
    written = [_written_behind(writer, first, "order-behind", 10_000)]
    written.append(unknown(writer, "order-after"))
    thread.join(10)
    assert seen == written


def test_an_entry_written_before_entries_had_us_is_windowed_by_its_at(writer: Settler) -> None:
    """An entry an earlier settle wrote has ``at`` (ms) and no ``us``: the script windows it
    by that ``at``, as every view shows it, not by its id's millisecond."""
    like = writer.quarantine.get(unknown(writer, "order-like"))
    ref = _written_behind(writer, like, "order-old", 10_000, us=False)
    at = writer.quarantine.get(ref).at
    assert at < like.at  # its at is 10 s before its id, and before the entry it copies
    assert ref in [e.ref for e in writer.quarantine.list(until=at)]
    assert ref not in [e.ref for e in writer.quarantine.list(since=at + _MS)]
    assert ref in [e.ref for e in writer.quarantine.scan(since=at, until=at)]


def test_an_entry_this_version_cannot_decode_is_windowed_by_its_own_time(
    writer: Settler,
) -> None:
    """An entry settle cannot decode (a kind a newer version wrote, in a rolling upgrade)
    whose id ran past ``until`` while its time is inside the window: the read script keeps
    it by that time, and the listing shows it marked (``ls``, the console), not dropped by
    its id's millisecond on the client; one whose time is past ``until`` stays out."""
    like = writer.quarantine.get(unknown(writer, "order-like"))
    stream = writer._core.keys.quarantine(like.shard)
    ((_, fields),) = writer.client.xrange(stream, like.id, like.id)
    now_s, now_us = writer.client.time()
    at_us = now_s * 1_000_000 + now_us - 10_000_000  # its time 10 s before its id's
    future = {**fields, b"kind": b"future_kind", b"at": at_us // 1000, b"us": at_us}
    ref = f"{like.shard}/{writer.client.xadd(stream, future).decode()}"
    until = _EPOCH + timedelta(microseconds=at_us)

    def listed(**window: datetime) -> list[str]:
        query = writer._core.quarantine_query(limit=100, **window).marking()
        return [e.ref for e in writer.quarantine._listed(query)]

    assert ref in listed(until=until)
    assert ref in listed(since=until, until=until)
    assert ref not in listed(until=until - _MS)
    assert ref not in listed(since=until + _MS)


def test_an_entry_whose_time_is_a_moment_after_its_id_is_in_a_window_from_its_time(
    writer: Settler, redis_url: str
) -> None:
    """On Redis 7.2 and later ``XADD *`` takes the time frozen when the script began and
    ``TIME`` reads the clock a moment later: an entry's ``at`` can be a millisecond or two
    after its id's time. ``since=<its at>`` keeps it (the ids were read from ``since``
    only, and it was missed), and ``since=<its at + 1 ms>`` leaves it out."""
    like = writer.quarantine.get(unknown(writer, "order-like"))
    ref = _written_behind(writer, like, "order-ahead", -3)  # its at 3 ms after its id's
    entry = writer.quarantine.get(ref)
    assert _ms(entry.at) > int(entry.id.split("-")[0])
    at = entry.at
    assert ref in [e.ref for e in writer.quarantine.list(since=at)]
    assert ref in [e.ref for e in writer.quarantine.scan(since=at, until=at)]
    assert ref in [h.ref for h in writer.quarantine.headers(since=at)]
    assert ref not in [e.ref for e in writer.quarantine.list(since=at + _MS)]
    args = ("--redis-url", redis_url, "--namespace", writer.config.namespace)
    shown = settle_json("quarantine", "ls", "--since", at.isoformat(), *args)
    assert ref in [row["ref"] for row in shown]
