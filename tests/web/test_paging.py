"""Paging the quarantine never skips or repeats an entry, also when many shards write in the
same millisecond (found in review: the engine cut its listing by microsecond time while the
console paged by stream id, so an entry could fall between two pages)."""

from __future__ import annotations

from typing import Any

import pytest

from settle.testing import AsyncMemorySettler, ManualClock
from settle.web import _query
from settle.web._query import Filter, export_entries, page
from tests.web.evidence import ghost_of, listing_order

pytestmark = pytest.mark.asyncio


async def _ghost(settler: AsyncMemorySettler, n: int) -> str:
    """A response for an operation that has no record: one quarantine entry, its ref."""
    late = ghost_of(str(n))
    settled = await settler.complete(late, {"n": n})
    assert settled.quarantine_id is not None
    return settled.quarantine_id


async def _paged(settler: AsyncMemorySettler, size: int, newest_first: bool) -> list[str]:
    """Every page of the whole quarantine, from the first to the last: the refs shown."""
    seen: list[str] = []
    after = None
    for _ in range(1_000):  # far more pages than any test writes entries
        got = await page(settler, Filter(), after=after, size=size, newest_first=newest_first)
        seen += [e.ref for e in got.entries]
        if got.next is None:
            return seen
        after = got.next
    raise AssertionError(f"paging made no progress: {len(seen)} entries after 1,000 pages")


async def _in_order(settler: AsyncMemorySettler, refs: list[str]) -> list[str]:
    """The refs oldest first, in the listing's order."""
    entries = [await settler.quarantine.get(ref) for ref in refs]
    return [e.ref for e in sorted(entries, key=listing_order)]


async def test_every_entry_is_on_exactly_one_page_when_shards_share_a_millisecond() -> None:
    clock = ManualClock()  # every entry in one millisecond, on every shard
    settler = AsyncMemorySettler(namespace="paging", shards=4, clock=clock)
    refs = []
    for n in range(23):
        refs.append(await _ghost(settler, n))
        if n % 5 == 4:
            clock.advance(0.001)  # a few milliseconds, many entries in each
    assert len({r.split("/")[0] for r in refs}) > 1  # they really are on several shards
    order = await _in_order(settler, refs)
    for size in (1, 4):
        assert await _paged(settler, size, newest_first=True) == order[::-1]
        assert await _paged(settler, size, newest_first=False) == order
    assert [e.ref async for e in export_entries(settler, Filter(), batch=3)] == order
    # the scan (CLI export, stats) merges the shards in the same order
    assert [e.ref async for e in settler.quarantine.scan()] == order


async def test_every_entry_is_on_exactly_one_page_after_the_clock_stepped_back() -> None:
    # The clock steps back an hour between writes: a stream appends after its last id, so the
    # entries written after the step carry ids ahead of the clock on the shards written before
    # it, and not on the others: the ids' order is not the times'. Pages follow the ids,
    # which never go back.
    clock = ManualClock()
    settler = AsyncMemorySettler(namespace="stepped", shards=4, clock=clock)
    refs: list[str] = []
    for n in range(24):
        refs.append(await _ghost(settler, n))
        clock.advance(0.001)
        if n == 5:
            clock.now_ms -= 3_600_000
    order = await _in_order(settler, refs)
    entries = [await settler.quarantine.get(ref) for ref in refs]
    assert order != [e.ref for e in sorted(entries, key=lambda e: e.at)]  # the step is there
    for size in (1, 2, 5):
        assert await _paged(settler, size, newest_first=True) == order[::-1], size
        assert await _paged(settler, size, newest_first=False) == order, size
    assert [e.ref async for e in export_entries(settler, Filter(), batch=4)] == order


async def test_pages_go_on_past_more_entries_of_one_millisecond_than_a_listing_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # After a clock step back a shard's ids keep one millisecond for as long as the step, so
    # one millisecond can hold more entries than one listing reads (_LIST_MAX). A page that
    # went back to the cursor's millisecond read them all again on every page, and once they
    # were more than _LIST_MAX it never got past them.
    monkeypatch.setattr(_query, "_LIST_MAX", 20)
    settler = AsyncMemorySettler(namespace="one-ms", shards=4, clock=ManualClock())
    refs = [await _ghost(settler, n) for n in range(120)]
    order = await _in_order(settler, refs)
    listings = 0
    query = settler._core.quarantine_query

    def counted(**kwargs: Any) -> Any:
        nonlocal listings
        listings += 1
        if listings > 200:  # 2 x 12 pages need about 2 x 13 listings
            raise AssertionError("paging read the same entries again and again")
        return query(**kwargs)

    monkeypatch.setattr(settler._core, "quarantine_query", counted)
    for newest_first in (True, False):
        paged = await _paged(settler, 10, newest_first)
        assert paged == (order[::-1] if newest_first else order)
