"""``run()`` on a feed that is caught up but whose coverage marker follows the clock.

A provider with coverage watermarks that answers "nothing in (after, now]" moves the
boundary on every fetch, however quiet the feed. Since 6c3e436 an empty page that moved the
boundary is progress to ``run()``, so on such a feed it never stops by its rule: every call
makes ``max_steps`` (1000) fetches, witnesses and promotions for nothing new, where it made
one before. Now one ``run()`` goes over at most ``EMPTY_WINDOWS`` empty windows in a row.
(Review rev-b: fails on 39e6260.)"""

from __future__ import annotations

from settle.cursor import Coverage, CursorConsumer, CursorStore, Page, ProviderContract
from settle.cursor._async import EMPTY_WINDOWS
from tests.cursor.conftest import Sink

CONTRACT = ProviderContract(coverage_watermarks=True, positions="sparse")


def test_run_stops_on_a_caught_up_feed_whose_watermark_follows_the_clock(
    store: CursorStore, sink: Sink
) -> None:
    fetched: list[int] = []

    def fetch(cursor: bytes) -> Page:
        after = int(cursor.decode().split(":")[1])
        through = after + 1  # the clock moved on; nothing happened meanwhile
        fetched.append(through)
        return Page([], f"after:{through}".encode(), coverage=Coverage(after, through))

    store.start("feed", b"after:0", boundary=0)
    consumer = CursorConsumer(fetch, sink, CONTRACT, store=store, stream="feed")
    results = consumer.run()
    assert sink.applied() == []
    assert len(fetched) < 100, f"run() fetched {len(fetched)} times over a caught-up feed"
    assert len(fetched) == EMPTY_WINDOWS  # the empty windows one run() goes over
    assert len(results) == len(fetched)
