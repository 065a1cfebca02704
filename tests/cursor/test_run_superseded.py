"""``run()`` goes on after a ``SUPERSEDED`` step, as its stop rule says, with two workers on
one stream and a real Redis.

A worker whose step lost the race before it handled anything (another worker promoted the
generation while it fetched) got ``SUPERSEDED`` with nothing applied or skipped, and
``run()`` stopped there, the general "nothing new" rule taking it for caught up: the events
after the other worker's promotion waited for the next ``run()``, however long the caller
waits between runs."""

from __future__ import annotations

import pytest

from settle.cursor import (
    AsyncCursorConsumer,
    AsyncCursorStore,
    CursorConsumer,
    CursorStore,
    Event,
    Page,
    ProviderContract,
    StepOutcome,
)
from tests.cursor.conftest import Sink

LOG = [Event(f"evt-{i}", i, {"n": i}) for i in range(1, 7)]


def page_at(cursor: bytes) -> Page:
    """Pages of 3 after the position the cursor names; the successor at the page's end."""
    after = int(cursor.decode().split(":")[1])
    events = [e for e in LOG if e.position > after][:3]
    return Page(events, successor=f"after:{events[-1].position if events else after}".encode())


def test_run_goes_on_after_a_step_another_worker_superseded(
    redis_url: str, namespace: str, sink: Sink
) -> None:
    with (
        CursorStore.from_url(redis_url, namespace=namespace) as store_a,
        CursorStore.from_url(redis_url, namespace=namespace) as store_b,
    ):
        store_a.start("s", b"after:0")
        other = CursorConsumer(page_at, sink, ProviderContract(), store=store_a, stream="s")
        raced = {"done": False}

        def fetch_b(cursor: bytes) -> Page:
            if not raced["done"]:  # the other worker promotes while this one fetches
                raced["done"] = True
                assert other.step().outcome is StepOutcome.PROMOTED
            return page_at(cursor)

        worker = CursorConsumer(fetch_b, sink, ProviderContract(), store=store_b, stream="s")
        results = worker.run()
        assert [r.outcome for r in results] == [
            StepOutcome.SUPERSEDED,
            StepOutcome.PROMOTED,
            StepOutcome.HELD,
        ]
        assert sink.applied() == [e.id for e in LOG]
        assert max(sink.calls.values()) == 1
        assert store_b.checkpoint("s").boundary == 6  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_async_run_goes_on_after_a_step_another_worker_superseded(
    redis_url: str, namespace: str, sink: Sink
) -> None:
    async def fetch_a(cursor: bytes) -> Page:
        return page_at(cursor)

    async with (
        AsyncCursorStore.from_url(redis_url, namespace=namespace) as store_a,
        AsyncCursorStore.from_url(redis_url, namespace=namespace) as store_b,
    ):
        await store_a.start("s", b"after:0")
        other = AsyncCursorConsumer(
            fetch_a, sink.handle, ProviderContract(), store=store_a, stream="s"
        )
        raced = {"done": False}

        async def fetch_b(cursor: bytes) -> Page:
            if not raced["done"]:
                raced["done"] = True
                assert (await other.step()).outcome is StepOutcome.PROMOTED
            return page_at(cursor)

        worker = AsyncCursorConsumer(
            fetch_b, sink.handle, ProviderContract(), store=store_b, stream="s"
        )
        results = await worker.run()
        assert [r.outcome for r in results] == [
            StepOutcome.SUPERSEDED,
            StepOutcome.PROMOTED,
            StepOutcome.HELD,
        ]
        assert sink.applied() == [e.id for e in LOG]
