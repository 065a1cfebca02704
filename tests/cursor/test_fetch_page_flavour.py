"""``fetch_page`` of the other flavour (real Redis): a plain function given to the
``AsyncCursorConsumer`` is taken as the handler is (its page stands: it ran), where awaiting
its ``Page`` raised a bare ``TypeError``; an ``async def`` given to the sync
``CursorConsumer`` is refused as an ``InvalidResponse`` that says so (reason ``awaitable``),
its coroutine closed, nothing written, where the error said only "got coroutine" and Python
warned later of a coroutine never awaited."""

from __future__ import annotations

import gc
import warnings

import pytest

from settle.cursor import (
    AsyncCursorConsumer,
    AsyncCursorStore,
    CursorConsumer,
    CursorStore,
    Event,
    EventContext,
    Page,
    ProviderContract,
    StepOutcome,
)
from settle.cursor.errors import InvalidResponse

LOG = [Event("e1", 1, {}), Event("e2", 2, {})]


def fetch(cursor: bytes) -> Page:
    return Page([e for e in LOG if e.position > int(cursor)], b"2")


async def afetch(cursor: bytes) -> Page:
    return fetch(cursor)


@pytest.mark.asyncio
async def test_the_async_consumer_takes_a_plain_fetch_page(redis_url: str, namespace: str) -> None:
    seen: list[str] = []

    async def handle(event: Event, ctx: EventContext) -> None:
        seen.append(event.id)

    async with AsyncCursorStore.from_url(redis_url, namespace=namespace) as store:
        await store.start("s", b"0")
        consumer = AsyncCursorConsumer(fetch, handle, ProviderContract(), store=store, stream="s")
        result = await consumer.step()
        assert (result.outcome, result.applied) == (StepOutcome.PROMOTED, 2)
        assert seen == ["e1", "e2"]
        checkpoint = await store.checkpoint("s")
        assert checkpoint is not None
        assert (checkpoint.cursor, checkpoint.boundary) == (b"2", 2)


def test_the_sync_consumer_refuses_an_async_fetch_page_and_writes_nothing(
    store: CursorStore,
) -> None:
    ck = store.start("s", b"0")

    def handle(event: Event, ctx: EventContext) -> None:
        raise AssertionError("nothing is handed over")

    consumer = CursorConsumer(afetch, handle, ProviderContract(), store=store, stream="s")  # type: ignore[arg-type]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(InvalidResponse, match="AsyncCursorConsumer") as raised:
            consumer.step()
        assert raised.value.reason == "awaitable"
        del raised
        gc.collect()
    assert [w for w in caught if "never awaited" in str(w.message)] == []
    assert store.checkpoint("s") == ck
    assert store.witnesses("s") == []
