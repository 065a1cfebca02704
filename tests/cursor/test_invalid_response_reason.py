"""A page ``fetch_page`` returns that its contract does not allow (real Redis, sync and
async): the step raises ``InvalidResponse`` naming what was wrong in ``reason``, logs it in
``settle.cursor.invalid_response``, and writes nothing. Before, the log line had no field at
all: a provider listing newest first (Stripe's events list) looked like any bad page."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from settle.cursor import (
    AsyncCursorConsumer,
    AsyncCursorStore,
    CursorConsumer,
    CursorStore,
    Event,
    EventContext,
    Page,
    ProviderContract,
)
from settle.cursor.errors import InvalidResponse

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
