"""Paging the quarantine never skips or repeats an entry, also when many shards write in the
same millisecond (found in review: the engine cut its listing by microsecond time while the
console paged by stream id, so an entry could fall between two pages)."""

from __future__ import annotations

import pytest

from settle.models import Reservation
from settle.testing import AsyncMemorySettler, ManualClock
from settle.web._query import Filter, export_entries, page
from tests.web.evidence import listing_order

pytestmark = pytest.mark.asyncio


async def _ghost(settler: AsyncMemorySettler, n: int) -> str:
    """A response for an operation that has no record: one quarantine entry, its ref."""
    late = Reservation(
        operation_id=f"ghost-{n}",
        fingerprint="a" * 64,
        fingerprint_version=1,
        binding="tenant:acme",
        generation=7,
        attempt_id=f"w-{n}",
    )
    settled = await settler.complete(late, {"n": n})
    assert settled.quarantine_id is not None
    return settled.quarantine_id


async def test_every_entry_is_on_exactly_one_page_when_shards_share_a_millisecond() -> None:
    clock = ManualClock()  # every entry in one millisecond, on every shard
    settler = AsyncMemorySettler(namespace="paging", shards=4, clock=clock)
    ids = set()
    for n in range(23):
        ids.add(await _ghost(settler, n))
        if n % 5 == 4:
            clock.advance(0.001)  # a few milliseconds, many entries in each
    assert len({i.split("/")[0] for i in ids}) > 1  # they really are on several shards

    for newest_first in (True, False):
        seen: list[str] = []
        after = None
        while True:
            got = await page(settler, Filter(), after=after, size=4, newest_first=newest_first)
            seen += [f"{e.shard}/{e.id}" for e in got.entries]
            if got.next is None:
                break
            after = got.next
        assert sorted(seen) == sorted(ids), f"newest_first={newest_first}"
    exported = [f"{e.shard}/{e.id}" async for e in export_entries(settler, Filter(), batch=3)]
    assert sorted(exported) == sorted(ids)


async def test_every_entry_is_on_exactly_one_page_after_the_clock_stepped_back() -> None:
    # The clock steps back an hour between writes: a stream appends after its last id, so the
    # entries written after the step carry ids ahead of their recorded times on the shards
    # written before it, and not on the others: the ids' order is not the times'. Pages
    # follow the ids, which never go back.
    clock = ManualClock()
    settler = AsyncMemorySettler(namespace="stepped", shards=4, clock=clock)
    refs: list[str] = []
    for n in range(24):
        refs.append(await _ghost(settler, n))
        clock.advance(0.001)
        if n == 5:
            clock.now_ms -= 3_600_000
    entries = [await settler.quarantine.get(ref) for ref in refs]
    order = [e.ref for e in sorted(entries, key=listing_order)]
    assert order != [e.ref for e in sorted(entries, key=lambda e: e.at)]  # the step is there
    for size in (1, 2, 5):
        for newest_first in (True, False):
            seen: list[str] = []
            after = None
            while True:
                got = await page(
                    settler, Filter(), after=after, size=size, newest_first=newest_first
                )
                seen += [e.ref for e in got.entries]
                if got.next is None:
                    break
                after = got.next
            assert seen == (order[::-1] if newest_first else order), (size, newest_first)
    assert [e.ref async for e in export_entries(settler, Filter(), batch=4)] == order
