"""``run()`` goes on after an empty page whose coverage marker moved the boundary, as its
stop rule says ("a step that applied nothing new and did not move the boundary" stops it).

A provider with coverage watermarks answers each window of positions with the events in it
and ``Coverage(after, through)``; a window with no events moves the boundary all the same.
``run()`` took such a step for "nothing new" and stopped: each call advanced one empty
window, and an event behind a few of them waited that many runs (a consumer run every
minute fell behind a feed with quiet stretches for good)."""

from __future__ import annotations

import pytest

from settle.cursor import (
    AsyncCursorConsumer,
    AsyncCursorStore,
    Coverage,
    CursorConsumer,
    CursorStore,
    Event,
    Page,
    ProviderContract,
    StepOutcome,
)
from tests.cursor.conftest import Sink

LOG = [Event("evt-1", 1, {"n": 1}), Event("evt-45", 45, {"n": 45})]
HEAD = 50
CONTRACT = ProviderContract(coverage_watermarks=True, positions="sparse")


def window(cursor: bytes) -> Page:
    """The events in the 10 positions after the cursor's, with their coverage marker."""
    after = int(cursor.decode().split(":")[1])
    through = min(after + 10, HEAD)
    events = [e for e in LOG if after < e.position <= through]
    return Page(events, f"after:{through}".encode(), coverage=Coverage(after, through))


EXPECTED = [(StepOutcome.PROMOTED, b) for b in (10, 20, 30, 40, 50)] + [
    (StepOutcome.NO_PROGRESS, 50)
]


@pytest.mark.parametrize("start", [0, 10], ids=["events-first", "empty-window-first"])
def test_run_goes_on_over_empty_windows_a_coverage_marker_proves(
    store: CursorStore, sink: Sink, start: int
) -> None:
    store.start("feed", f"after:{start}".encode(), boundary=start)
    consumer = CursorConsumer(window, sink, CONTRACT, store=store, stream="feed")
    results = consumer.run()
    assert [(r.outcome, r.boundary) for r in results] == EXPECTED[start // 10 :]
    assert sink.applied() == [e.id for e in LOG if e.position > start]


@pytest.mark.asyncio
async def test_async_run_goes_on_over_empty_windows_too(
    redis_url: str, namespace: str, sink: Sink
) -> None:
    async def fetch(cursor: bytes) -> Page:
        return window(cursor)

    async with AsyncCursorStore.from_url(redis_url, namespace=namespace) as store:
        await store.start("feed", b"after:10", boundary=10)
        consumer = AsyncCursorConsumer(fetch, sink.handle, CONTRACT, store=store, stream="feed")
        results = await consumer.run()
    assert [(r.outcome, r.boundary) for r in results] == EXPECTED[1:]
    assert sink.applied() == ["evt-45"]
