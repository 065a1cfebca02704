"""A page ``fetch_page`` returns that its contract does not allow (real Redis, sync and
async): the step raises ``InvalidResponse`` naming what was wrong in ``reason``, logs it in
``settle.cursor.invalid_response``, and writes nothing. Before, the log line had no field at
all: a provider listing newest first (Stripe's events list) looked like any bad page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from settle.cursor import (
    AsyncCursorConsumer,
    AsyncCursorStore,
    Coverage,
    CursorConsumer,
    CursorStore,
    Event,
    EventContext,
    Page,
    ProviderContract,
)
from settle.cursor._classify import MAX_EVENTS_PER_PAGE
from settle.cursor._core import CursorCore
from settle.cursor.errors import InvalidResponse

DOCS = Path(__file__).resolve().parents[2] / "docs"

NEWEST_FIRST = [Event("evt_3", 3, {}), Event("evt_2", 2, {}), Event("evt_1", 1, {})]
REPEATED = [Event("evt_1", 1, {}), Event("evt_1", 2, {})]


def handle(event: Event, ctx: EventContext) -> None:
    raise AssertionError("nothing is handed over from an invalid page")


async def ahandle(event: Event, ctx: EventContext) -> None:
    handle(event, ctx)


@pytest.mark.parametrize(
    ("events", "reason"),
    [(NEWEST_FIRST, "positions_not_increasing"), (REPEATED, "duplicate_event_id")],
)
def test_an_invalid_page_says_why_and_writes_nothing(
    store: CursorStore, events: list[Event], reason: str
) -> None:
    ck = store.start("s", b"0")
    consumer = CursorConsumer(
        lambda c: Page(events, b"next"), handle, ProviderContract(), store=store, stream="s"
    )
    with capture_logs() as logs, pytest.raises(InvalidResponse) as raised:
        consumer.step()
    assert raised.value.reason == reason
    [logged] = [e for e in logs if e["event"] == "settle.cursor.invalid_response"]
    assert logged["reason"] == reason
    assert store.witnesses("s") == []
    assert store.checkpoint("s") == ck


def test_a_newest_first_page_is_told_to_be_reversed(store: CursorStore) -> None:
    store.start("s", b"0")
    consumer = CursorConsumer(
        lambda c: Page(NEWEST_FIRST, b"next"), handle, ProviderContract(), store=store, stream="s"
    )
    with pytest.raises(InvalidResponse, match="newest first"):
        consumer.step()


@pytest.mark.asyncio
async def test_the_async_consumer_says_why_alike(redis_url: str, namespace: str) -> None:
    async def fetch(cursor: bytes) -> Page:
        return Page(NEWEST_FIRST, b"next")

    async with AsyncCursorStore.from_url(redis_url, namespace=namespace) as store:
        ck = await store.start("s", b"0")
        consumer = AsyncCursorConsumer(fetch, ahandle, ProviderContract(), store=store, stream="s")
        with capture_logs() as logs, pytest.raises(InvalidResponse) as raised:
            await consumer.step()
        assert raised.value.reason == "positions_not_increasing"
        [logged] = [e for e in logs if e["event"] == "settle.cursor.invalid_response"]
        assert logged["reason"] == "positions_not_increasing"
        assert await store.witnesses("s") == []
        assert await store.checkpoint("s") == ck


async def _never_run(cursor: bytes) -> Page:
    raise AssertionError("closed, never run")


def _bad_pages() -> dict[str, object]:
    """One page per reason, each wrong in that way only."""
    ok = Event("evt_1", 1, {})
    return {
        "awaitable": _never_run(b"0"),
        "not_a_page": {"events": [], "successor": b"next"},
        "successor": Page([ok], "next"),  # type: ignore[arg-type]
        "snapshot": Page([ok], b"next", snapshot=""),
        "coverage_undeclared": Page([ok], b"next", coverage=Coverage(0, 1)),
        "coverage": Page([ok], b"next", coverage=Coverage(2, 1)),
        "events": Page("evt_1", b"next"),  # type: ignore[arg-type]
        "too_many_events": Page(
            [Event(f"e{i}", i, {}) for i in range(MAX_EVENTS_PER_PAGE + 1)], b"next"
        ),
        "event_id": Page([Event("", 1, {})], b"next"),
        "position": Page([Event("evt_1", -1, {})], b"next"),
        "digest": Page([Event("evt_1", 1, {}, digest="has space")], b"next"),
        "positions_not_increasing": Page(NEWEST_FIRST, b"next"),
        "duplicate_event_id": Page(REPEATED, b"next"),
    }


def test_every_documented_reason_is_the_one_its_page_gets() -> None:
    """The reasons are stable names a user alerts on: each bad page gets its own, in the
    error and the log event, and docs/observability.md lists exactly these."""
    core = CursorCore("reasons")
    pages = _bad_pages()
    coverage = ProviderContract(coverage_watermarks=True)
    for reason, page in pages.items():
        contract = ProviderContract() if reason == "coverage_undeclared" else coverage
        with capture_logs() as logs, pytest.raises(InvalidResponse) as raised:
            core.check_page("s", contract, page)
        assert raised.value.reason == reason
        assert [e["reason"] for e in logs if e["event"] == "settle.cursor.invalid_response"] == [
            reason
        ]
    [row] = [
        line
        for line in (DOCS / "observability.md").read_text().splitlines()
        if line.startswith("| `settle.cursor.invalid_response` |")
    ]
    documented = set(re.findall(r"`(\w+)`", row.split("|")[3])) - {"reason", "InvalidResponse"}
    assert documented == set(pages)
