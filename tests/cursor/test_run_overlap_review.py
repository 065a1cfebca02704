"""Review of 7969072 (one run() goes over at most EMPTY_WINDOWS empty windows in a row).

A provider whose pages overlap by one (``since=`` inclusive: the last event seen comes back
on the next page) and whose coverage marker follows the clock: on a caught-up feed every
page holds only the event already applied (skipped, its receipt exists) and moves the
boundary. Nothing new either, but ``applied + skipped`` is not 0, so the counter of empty
windows is reset on every step and run() fetches ``max_steps`` times, as before 7969072."""

from __future__ import annotations

from settle.cursor import Coverage, CursorConsumer, CursorStore, Event, Page, ProviderContract
from settle.cursor._async import EMPTY_WINDOWS
from tests.cursor.conftest import Sink

CONTRACT = ProviderContract(coverage_watermarks=True, positions="sparse")


def test_run_stops_on_a_caught_up_overlapping_feed_whose_watermark_follows_the_clock(
    store: CursorStore, sink: Sink
) -> None:
    fetched: list[int] = []
    last = Event("evt-1", 1, {"amount": 10})

    def fetch(cursor: bytes) -> Page:
        after = int(cursor.decode().split(":")[1])
        through = after + 1  # the clock moved on; nothing happened meanwhile
        fetched.append(through)
        return Page([last], f"after:{through}".encode(), coverage=Coverage(0, through))

    store.start("feed", b"after:1", boundary=0)
    consumer = CursorConsumer(fetch, sink, CONTRACT, store=store, stream="feed")
    results = consumer.run(max_steps=200)
    assert sink.applied() == ["evt-1"]
    assert len(fetched) <= EMPTY_WINDOWS + 1, (
        f"run() fetched {len(fetched)} times over a caught-up feed: "
        f"{[(r.outcome.value, r.applied, r.skipped, r.boundary) for r in results[:4]]}"
    )
