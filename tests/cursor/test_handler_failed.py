"""A ``handle_event`` that raises halfway through a page (real Redis, sync and async): the
step raises the handler's own error, says so (``settle.cursor.handler_failed``), the events
before it keep their receipts, and the next step hands over only that event and those after
it. Before, nothing was logged."""

from __future__ import annotations

from collections import Counter

import pytest
from structlog.testing import capture_logs

from settle._log import event_digest
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

LOG = [Event(f"e{i}", i, {"card": f"secret-{i}"}) for i in range(1, 4)]


class Boom(Exception):
    pass


def fetch(cursor: bytes) -> Page:
    after = int(cursor)
    page = [e for e in LOG if e.position > after]
    return Page(page, str(page[-1].position if page else after).encode())


async def afetch(cursor: bytes) -> Page:
    return fetch(cursor)


class Handler:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.fail_on: str | None = "e2"

    def __call__(self, event: Event, ctx: EventContext) -> None:
        self.calls[event.id] += 1
        if event.id == self.fail_on:
            raise Boom("declined for card secret-2")

    async def handle(self, event: Event, ctx: EventContext) -> None:
        self(event, ctx)


def check_failed(logs: list[dict], store_witness_aid: str) -> None:
    [failed] = [e for e in logs if e["event"] == "settle.cursor.handler_failed"]
    assert failed["log_level"] == "warning"
    assert (failed["attempt_id"], failed["position"], failed["error_type"]) == (
        store_witness_aid,
        2,
        "Boom",
    )
    assert failed["event_digest"] == event_digest("e2")
    assert "secret" not in repr(logs)  # neither the payload nor the error's text


def test_a_handler_that_raises_is_logged_and_the_page_resumes_after_its_receipts(
    store: CursorStore,
) -> None:
    handler = Handler()
    store.start("s", b"0")
    consumer = CursorConsumer(fetch, handler, ProviderContract(), store=store, stream="s")
    with capture_logs() as logs, pytest.raises(Boom, match="secret-2"):
        consumer.step()
    [witness] = store.witnesses("s")
    check_failed(logs, witness.attempt_id)
    assert [r.event_id for r in store.receipts("s")] == ["e1"]
    handler.fail_on = None
    result = consumer.step()
    assert (result.outcome, result.applied, result.skipped) == (StepOutcome.PROMOTED, 2, 1)
    assert handler.calls == Counter({"e1": 1, "e2": 2, "e3": 1})


@pytest.mark.asyncio
async def test_the_async_consumer_logs_it_alike(redis_url: str, namespace: str) -> None:
    handler = Handler()
    async with AsyncCursorStore.from_url(redis_url, namespace=namespace) as store:
        await store.start("s", b"0")
        consumer = AsyncCursorConsumer(
            afetch, handler.handle, ProviderContract(), store=store, stream="s"
        )
        with capture_logs() as logs, pytest.raises(Boom):
            await consumer.run()
        [witness] = await store.witnesses("s")
        check_failed(logs, witness.attempt_id)
        handler.fail_on = None
        result = await consumer.step()
        assert (result.outcome, result.applied, result.skipped) == (StepOutcome.PROMOTED, 2, 1)
        assert handler.calls == Counter({"e1": 1, "e2": 2, "e3": 1})
