"""What the console reads: quarantine pages by stream id across every shard, the export,
and the overview's counts. Everything goes through :class:`~settle.AsyncSettler`'s public
quarantine API and reads a bounded number of entries per request, however large the
streams are.

A page is addressed by a cursor: the ``shard/ms-seq`` ref of the last entry shown. The next
page lists every shard from that stream id on and drops the entries at or before the cursor
in the listing's order, so paging never skips nor repeats an entry, even when entries of
several shards share one millisecond or a server's clock stepped back (the order is by
stream id first, which never goes back, not by the entries' recorded times, which may).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from redis.asyncio import RedisCluster

from settle._async.settler import AsyncSettler
from settle._core.codec import UndecodableEntry
from settle._core.engine import MAX_LISTING
from settle._core.keys import Keys
from settle._runtime.transient import failures_as_settle_errors
from settle.cli.stats import RECORD_BATCH, SCAN_COUNT, operation_id_of, record_key_match, tally
from settle.errors import ConfigurationError, InvalidInput
from settle.models import QuarantineEntry, QuarantineKind, State
from settle.web._security import answered

__all__ = [
    "Filter",
    "Listed",
    "Overview",
    "Page",
    "Position",
    "check_namespace",
    "export_entries",
    "overview",
    "page",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_CURSOR = re.compile(r"(\d{1,20}):(\d{1,6})/(\d{1,20})-(\d{1,20})", re.ASCII)
#: The most entries one page reads from Redis when its status filter (applied here rather
#: than in the script) keeps few of them; the page then ends early with a cursor to go on.
SCAN_BUDGET = 5_000
_LIST_MAX = MAX_LISTING
#: What a page lists: an entry, or the mark of one this version cannot decode (another
#: version or another program wrote it), in its place in the order.
Listed = QuarantineEntry | UndecodableEntry


@dataclass(frozen=True, order=True, slots=True)
class Position:
    """Where an entry sits in the console's order, which is the engine's order of a listing
    across shards: the stream id's millisecond and sequence, then the server time in
    microseconds, then the shard. The id comes first: a shard whose ids ran ahead of its
    clock (the clock stepped back) would otherwise have entries that fall between two pages;
    the time orders entries of different shards with the same id as they were written."""

    ms: int
    seq: int
    at_us: int
    shard: int

    @classmethod
    def of(cls, entry: Listed) -> Position:
        ms, seq = entry.id.split("-")
        at_us = (entry.at - _EPOCH) // timedelta(microseconds=1)
        return cls(int(ms), int(seq), at_us, entry.shard)

    @classmethod
    def parse(cls, ref: str) -> Position:
        match = _CURSOR.fullmatch(ref)
        if match is None:
            raise InvalidInput(f"{ref!r} is not a page cursor (us:shard/ms-seq); start from page 1")
        at_us, shard, ms, seq = (int(g) for g in match.groups())
        if ms > _MAX_MS or at_us > _MAX_MS * 1000 or seq >= 2**64:
            # No entry is written after year 9999; such a cursor was made by hand, and its
            # instant is past what a datetime holds.
            raise InvalidInput(f"{ref!r} is not a page cursor of this console; start from page 1")
        return cls(ms, seq, at_us, shard)

    @property
    def ref(self) -> str:
        return f"{self.at_us}:{self.shard}/{self.ms}-{self.seq}"


#: The last millisecond a datetime holds (9999-12-31T23:59:59.999Z), with a second to spare.
_MAX_MS = (datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC) - _EPOCH) // timedelta(
    milliseconds=1
) - 1000


@dataclass(frozen=True, slots=True)
class Filter:
    """The console's filter: the engine's filters (kind, operation, time range) plus the
    status, kept here so that a page's reading stays within its budget."""

    kind: QuarantineKind | None = None
    operation_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    status: str = "all"  # all | unresolved | resolved

    def keeps(self, entry: Listed) -> bool:
        if self.status == "all":
            return True
        return resolved(entry) == (self.status == "resolved")


def resolved(entry: Listed) -> bool:
    """Whether ``entry`` is resolved (for a mark: whether a resolution is stored for it)."""
    if isinstance(entry, UndecodableEntry):
        return entry.resolved
    return entry.resolution is not None


@dataclass(slots=True)
class Page:
    entries: list[Listed]
    #: The cursor of the next page (older entries, or newer with ``newest_first=False``).
    next: str | None
    #: How many entries were read from Redis for this page.
    scanned: int = 0
    #: True when the scan budget ended the page before it was full.
    partial: bool = False


#: Entries a page with a status filter reads at a time (at least a page and one more):
#: the filter may keep few of them, and a read of one page's worth at a time would take
#: hundreds of round trips to reach :data:`SCAN_BUDGET`.
FILTER_BATCH = 100


async def page(
    settler: AsyncSettler,
    flt: Filter,
    *,
    after: str | None = None,
    size: int = 50,
    newest_first: bool = True,
    budget: int = SCAN_BUDGET,
) -> Page:
    """Up to ``size`` entries matching ``flt`` that come after the cursor ``after`` in the
    chosen order, and the cursor of the page that follows (None at the end).

    At most ``budget`` entries are read for the page: the status filter is applied here,
    and a page that did not fill within the budget ends early with a cursor to go on from
    (``partial``). Each listing asks for what the page still needs (one more to know that
    there is a next page; :data:`FILTER_BATCH` when a status filter may drop entries), so a
    page reads about as many entries as it shows, not that many from every shard."""
    bound = Position.parse(after) if after else None
    found: list[Listed] = []
    scanned = 0
    wanted = size + 1 if flt.status == "all" else max(size + 1, FILTER_BATCH)
    extra = 0
    while True:
        # What the page still may read, and the entries of the cursor's very stream id on
        # other shards (at most one a shard), read again and dropped below; more when every
        # entry read was one of those. With the budget spent, that listing only tells
        # whether an entry is left (the page then ends early) or none (it is the last).
        again = 0 if bound is None else settler.config.shards
        limit = min(min(wanted, budget - scanned) + again + extra, _LIST_MAX)
        got = await _listing(
            settler, flt, limit, newest_first, None if bound is None else (bound.ms, bound.seq)
        )
        fresh = [e for e in got if bound is None or _beyond(Position.of(e), bound, newest_first)]
        exhausted = len(got) < limit
        if not fresh and not exhausted:
            # Every entry read has the cursor's very stream id (on other shards) and was
            # shown already: at most one a shard, so a larger read gets past them.
            extra = max(2 * extra, wanted)
            continue
        for entry in fresh:
            if scanned >= budget:
                # The budget is spent and an entry is left: the page ends early and the
                # next one goes on after the last entry read. Checked before reading one,
                # not after: a listing of exactly what the page still could read may hold
                # the last entry there is, and a page that read it said it stopped early
                # and linked to an empty page.
                assert bound is not None  # an entry was read: scanned >= budget >= 1
                return Page(found, bound.ref, scanned, partial=True)
            scanned += 1
            bound = Position.of(entry)
            if flt.keeps(entry):
                found.append(entry)
            if len(found) > size:
                return Page(found[:size], Position.of(found[size - 1]).ref, scanned)
        if exhausted:
            return Page(found, None, scanned)
        extra = 0


async def _listing(
    settler: AsyncSettler,
    flt: Filter,
    limit: int,
    newest_first: bool,
    start: tuple[int, int] | None,
) -> list[Listed]:
    """``quarantine.list`` with the engine's filters, starting at the cursor's stream id on
    every shard (bounding by its millisecond alone would read every entry of that
    millisecond again on each page: after a clock step back, a shard's ids keep one
    millisecond for as long as the step). The status is filtered by :func:`page`, within
    its budget: filtered in the script, a page of unresolved entries among a million
    resolved ones read all of them."""
    planned = settler._core.quarantine_query(
        kind=flt.kind,
        operation_id=flt.operation_id,
        since=flt.since,
        until=flt.until,
        limit=limit,
        newest_first=newest_first,
        start=start,
    )
    # Marking: one entry another version or program wrote made the whole page a 500, and
    # the dispute settler saw none of the entries settle can read.
    return await settler.quarantine._listed(planned.marking())


def _beyond(pos: Position, bound: Position, newest_first: bool) -> bool:
    return pos < bound if newest_first else pos > bound


async def export_entries(
    settler: AsyncSettler, flt: Filter, *, batch: int = 500
) -> AsyncIterator[Listed]:
    """Every entry matching ``flt``, oldest first, read ``batch`` at a time."""
    after: str | None = None
    while True:
        got = await page(settler, flt, after=after, size=batch, newest_first=False)
        for entry in got.entries:
            yield entry
        if got.next is None:
            return
        after = got.next


@dataclass(slots=True)
class Overview:
    """What the overview page shows. Counts are read within bounds and say so."""

    records: dict[str, int]
    records_capped: bool
    by_kind: dict[str, dict[str, int]]
    sample: int
    sample_capped: bool
    since: datetime
    until: datetime
    buckets: list[tuple[datetime, int]] = field(default_factory=list)
    #: Entries of the window this version cannot decode (counted apart, by stream time).
    undecodable: int = 0


#: The chart's windows: name -> (length, bucket).
WINDOWS = {
    "1h": (timedelta(hours=1), timedelta(minutes=5)),
    "24h": (timedelta(hours=24), timedelta(hours=1)),
    "7d": (timedelta(days=7), timedelta(hours=6)),
    "30d": (timedelta(days=30), timedelta(days=1)),
}


async def overview(
    settler: AsyncSettler,
    *,
    window: str,
    now: datetime,
    record_limit: int,
    entry_limit: int,
) -> Overview:
    """Records by state (at most ``record_limit`` records read), and the quarantine of the
    last ``window`` by kind and over time (at most ``entry_limit`` entries read, as headers:
    kind, time and status, never a payload)."""
    states, capped = await _count_records(settler, record_limit)
    length, step = WINDOWS[window]
    since = now - length
    # Marking: one entry another version or program wrote made the overview a 500.
    planned = settler._core.quarantine_query(since=since, limit=entry_limit).header_marking()
    entries = await settler.quarantine._listed(planned)
    by_kind = {k.value: {"unresolved": 0, "resolved": 0} for k in QuarantineKind}
    undecodable = 0
    for e in entries:
        if isinstance(e, UndecodableEntry):
            undecodable += 1
        else:
            by_kind[e.kind.value]["resolved" if e.resolved else "unresolved"] += 1
    if not entries and not any(states.values()):
        await check_namespace(settler)
    n = int(length / step)
    counts = [0] * n
    for e in entries:
        slot = int((e.at - since) / step)
        counts[min(max(slot, 0), n - 1)] += 1
    return Overview(
        records=dict(states),
        records_capped=capped,
        by_kind=by_kind,
        sample=len(entries),
        sample_capped=len(entries) >= entry_limit,
        since=since,
        until=now,
        buckets=[(since + i * step, c) for i, c in enumerate(counts)],
        undecodable=undecodable,
    )


async def _count_records(settler: AsyncSettler, limit: int) -> tuple[Counter[str], bool]:
    """Records by effective state, reading at most ``limit`` of them as ``settle stats``
    does: the SCAN, then the records found read :data:`RECORD_BATCH` at a time
    (``get_many``: one script call per shard and 100 records), not one script call each."""
    states: Counter[str] = Counter({s.value: 0 for s in State})
    batch: list[str] = []
    seen, capped = 0, False
    client = _client(settler)
    keys = Keys(settler.config.namespace, settler.config.shards)
    with failures_as_settle_errors("SCAN"):  # Redis down: a BackendError (503), not a 500
        async for key in _scan(client, record_key_match(settler.config.namespace)):
            operation_id = operation_id_of(key, keys)
            if operation_id is None:  # not a record key (an attempt log whose id has "}:op:")
                continue
            if seen >= limit:
                capped = True
                break
            seen += 1
            batch.append(operation_id)
            if len(batch) == RECORD_BATCH:
                tally(states, await settler.get_many(batch))
                batch = []
    if batch:
        tally(states, await settler.get_many(batch))
    return states, capped


async def _scan(client: Any, match: str) -> AsyncIterator[Any]:
    """The keys matching ``match``, as ``scan_iter`` (every primary's on a cluster), each
    SCAN reply :func:`answered`: a walk of a large keyspace is as long as the keyspace,
    and the request's bound is for a Redis that does not answer."""
    nodes: list[tuple[Any, Any]] = [(None, None)]  # one server
    if isinstance(client, RedisCluster):
        nodes = [(node, node.name) for node in client.get_primaries()]
    for node, name in nodes:
        cursor: Any = 0
        while True:
            if node is None:
                cursor, found = await client.scan(cursor, match=match, count=SCAN_COUNT)
            else:
                cursors, found = await client.scan(
                    cursor, match=match, count=SCAN_COUNT, target_nodes=node
                )
                cursor = cursors[name]
            answered()
            for key in found:
                yield key
            if int(cursor) == 0:
                break


def _client(settler: AsyncSettler) -> Any:
    """The redis-py asyncio client the settler runs its scripts on."""
    return settler.client


async def check_namespace(settler: AsyncSettler) -> None:
    """A :class:`ConfigurationError` (a 503 page) when the namespace's metadata is gone,
    as ``settle quarantine ls`` says with exit 3. Asked when a page found nothing: after a
    Redis restart that lost its data (no persistence, a FLUSHALL) the console showed an
    empty quarantine, which a dispute settler reads as "all clear". One ``EXISTS``."""
    meta = Keys(settler.config.namespace, 1).meta
    if not await settler._command("EXISTS", lambda client: client.exists(meta), key=meta):
        raise ConfigurationError(
            f"namespace {settler.config.namespace!r} does not exist in this Redis: nothing "
            "was ever written to it, or Redis lost its data (restarted without persistence, "
            "flushed). The quarantine is not known to be empty; check the Redis and "
            "restore it before settling disputes."
        )


async def server_now(settler: AsyncSettler) -> datetime:
    """The server's clock: quarantine stream ids and entry times are server time."""
    seconds, micros = await settler._command("TIME", lambda client: client.time())
    return datetime.fromtimestamp(int(seconds) + int(micros) / 1e6, tz=UTC)
