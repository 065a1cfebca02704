"""A reset below the receipts ``receipt_horizon`` pruned (real Redis, sync and async).

The docs' recovery ("receipts stay, so events applied before are recognised and not applied
twice") holds only where receipts are kept. With ``receipt_horizon``, a reset to a fresh
snapshot's first cursor, or to any boundary below a pruned receipt, handed every event whose
receipt was pruned to ``handle_event`` again as new, with nothing said. It is refused now
(``CursorError``, ``settle.cursor.reset_rejected`` with reason ``receipts_pruned``, nothing
reset) unless the caller accepts it with ``reapply_pruned=True``.
"""

from __future__ import annotations

from collections import Counter

import pytest
import redis
from structlog.testing import capture_logs

from settle.cursor import (
    AsyncCursorConsumer,
    AsyncCursorStore,
    Checkpoint,
    CoverageNotProven,
    CursorConsumer,
    CursorError,
    CursorStore,
    Event,
    EventContext,
    Page,
    ProviderContract,
)
from settle.cursor._keys import stream_keys
from settle.errors import CorruptRecord, InvalidInput

LOG = [Event(f"e{i}", i, {"n": i}) for i in range(1, 11)]


def fetch(cursor: bytes) -> Page:
    after = int(cursor)
    page = [e for e in LOG if e.position > after][:2]
    return Page(page, str(page[-1].position if page else after).encode())


async def afetch(cursor: bytes) -> Page:
    return fetch(cursor)


def applied_to_the_end(store: CursorStore) -> tuple[CursorConsumer, Checkpoint]:
    """Stream "s" started and run through LOG by a handler that does nothing."""
    store.start("s", b"0")
    consumer = CursorConsumer(
        fetch, lambda e, ctx: None, ProviderContract(), store=store, stream="s"
    )
    consumer.run()
    ck = store.checkpoint("s")
    assert ck is not None
    return consumer, ck


def test_a_reset_below_pruned_receipts_is_refused_and_nothing_is_applied_twice(
    redis_url: str, namespace: str
) -> None:
    calls: Counter[str] = Counter()

    def handle(event: Event, ctx: EventContext) -> None:
        calls[event.id] += 1

    with CursorStore.from_url(redis_url, namespace=namespace, receipt_horizon=3) as store:
        store.start("s", b"0")
        consumer = CursorConsumer(fetch, handle, ProviderContract(), store=store, stream="s")
        consumer.run()
        ck = store.checkpoint("s")
        assert ck is not None
        assert ck.boundary == 10
        assert [r.event_id for r in store.receipts("s", after=-1)] == ["e7", "e8", "e9", "e10"]

        # A fresh snapshot from the start, and a boundary just below the pruned e6: refused.
        for boundary in (0, 5):
            with capture_logs() as logs, pytest.raises(CursorError, match="reapply_pruned"):
                store.reset(
                    "s",
                    cursor=str(boundary).encode(),
                    boundary=boundary,
                    expected_generation=ck.generation,
                )
            [rejected] = [e for e in logs if e["event"] == "settle.cursor.reset_rejected"]
            assert (rejected["reason"], rejected["pruned"], rejected["boundary"]) == (
                "receipts_pruned",
                6,
                boundary,
            )
            assert store.checkpoint("s") == ck  # nothing reset
        consumer.run()
        assert set(calls.values()) == {1}

        # At the highest pruned position: every event above it still has its receipt.
        with capture_logs() as logs:
            again = store.reset("s", cursor=b"6", boundary=6, expected_generation=ck.generation)
        [reset] = [e for e in logs if e["event"] == "settle.cursor.reset"]
        assert "pruned" not in reset  # nothing comes again
        assert again.generation == ck.generation + 1
        consumer.run()
        assert calls == Counter({e.id: 1 for e in LOG})

        # Asked for: the pruned events come again (the handler is idempotent under ctx.key).
        ck = store.checkpoint("s")
        assert ck is not None
        with capture_logs() as logs:
            store.reset(
                "s", cursor=b"0", boundary=0, expected_generation=ck.generation, reapply_pruned=True
            )
        [reset] = [e for e in logs if e["event"] == "settle.cursor.reset"]
        assert (reset["boundary"], reset["pruned"]) == (0, 6)  # said: e1..e6 come again
        consumer.run()
        assert [calls[e.id] for e in LOG] == [2] * 6 + [1] * 4


def test_reapply_pruned_takes_a_bool_only(store: CursorStore) -> None:
    ck = store.start("s", b"0")
    for bad in ("yes", 1, None):
        with pytest.raises(InvalidInput, match="reapply_pruned"):
            store.reset(
                "s",
                cursor=b"1",
                boundary=0,
                expected_generation=ck.generation,
                reapply_pruned=bad,  # type: ignore[arg-type]
            )
    assert store.checkpoint("s") == ck


def test_without_a_horizon_nothing_is_pruned_and_any_reset_is_taken(store: CursorStore) -> None:
    calls: Counter[str] = Counter()

    def handle(event: Event, ctx: EventContext) -> None:
        calls[event.id] += 1

    store.start("s", b"0")
    consumer = CursorConsumer(fetch, handle, ProviderContract(), store=store, stream="s")
    consumer.run()
    ck = store.checkpoint("s")
    assert ck is not None
    store.reset("s", cursor=b"0", boundary=0, expected_generation=ck.generation)
    consumer.run()
    assert calls == Counter({e.id: 1 for e in LOG})  # every receipt kept: none again


@pytest.mark.asyncio
async def test_the_async_store_refuses_it_alike(redis_url: str, namespace: str) -> None:
    calls: Counter[str] = Counter()

    async def handle(event: Event, ctx: EventContext) -> None:
        calls[event.id] += 1

    async with AsyncCursorStore.from_url(
        redis_url, namespace=namespace, receipt_horizon=3
    ) as store:
        await store.start("s", b"0")
        consumer = AsyncCursorConsumer(afetch, handle, ProviderContract(), store=store, stream="s")
        await consumer.run()
        ck = await store.checkpoint("s")
        assert ck is not None
        with pytest.raises(CursorError, match="up to position 6"):
            await store.reset("s", cursor=b"0", boundary=0, expected_generation=ck.generation)
        assert await store.checkpoint("s") == ck
        await consumer.run()
        assert calls == Counter({e.id: 1 for e in LOG})


def test_the_highest_pruned_position_is_kept_when_reapplied_receipts_are_pruned_again(
    redis_url: str, namespace: str
) -> None:
    """After a reset with ``reapply_pruned``, the events come again and their new receipts
    are pruned again, lower than before: the checkpoint keeps the highest pruned position
    (8), so a reset to 5 stays refused while e6..e8 have no receipt (a checkpoint that took
    the last pruning's position, 2, let it through and handed them over again)."""
    with CursorStore.from_url(redis_url, namespace=namespace, receipt_horizon=1) as store:
        consumer, ck = applied_to_the_end(store)
        store.reset(
            "s", cursor=b"0", boundary=0, expected_generation=ck.generation, reapply_pruned=True
        )
        consumer.run(max_steps=2)  # to boundary 4: e1 and e2 pruned again
        ck = store.checkpoint("s")
        assert ck is not None
        assert ck.boundary == 4
        assert [r.event_id for r in store.receipts("s", after=-1)] == ["e3", "e4", "e9", "e10"]
        with capture_logs() as logs, pytest.raises(CursorError, match="up to position 8"):
            store.reset("s", cursor=b"5", boundary=5, expected_generation=ck.generation)
        [rejected] = [e for e in logs if e["event"] == "settle.cursor.reset_rejected"]
        assert rejected["pruned"] == 8
        assert store.checkpoint("s") == ck


def test_a_pruned_field_that_is_no_integer_is_a_corrupt_checkpoint(
    store: CursorStore, redis_url: str
) -> None:
    """A checkpoint whose ``pruned`` is not an integer settle wrote (changed by hand): the
    reset is ``CorruptRecord``, logged, nothing written; it was a Lua error, a
    ``BackendError`` saying the server may be unreachable."""
    ck = store.start("s", b"0")
    key = stream_keys(store.core.namespace, "s")[0]
    with redis.Redis.from_url(redis_url) as raw:
        raw.hset(key, "pruned", "junk")
        before = raw.hgetall(key)
        with capture_logs() as logs, pytest.raises(CorruptRecord):
            store.reset("s", cursor=b"1", boundary=0, expected_generation=ck.generation)
        assert [e["script"] for e in logs if e["event"] == "settle.cursor.corrupt"] == ["reset"]
        assert raw.hgetall(key) == before


def test_a_reset_naming_another_generation_is_rejected_with_its_reason(
    store: CursorStore,
) -> None:
    """``settle.cursor.reset_rejected`` has two reasons now; the older one says so too."""
    ck = store.start("s", b"0")
    with capture_logs() as logs, pytest.raises(CursorError, match="nothing was reset"):
        store.reset("s", cursor=b"1", boundary=0, expected_generation=ck.generation - 1)
    [rejected] = [e for e in logs if e["event"] == "settle.cursor.reset_rejected"]
    assert (rejected["reason"], rejected["expected_generation"], rejected["generation"]) == (
        "generation",
        ck.generation - 1,
        ck.generation,
    )
    assert store.checkpoint("s") == ck


def test_the_refusal_says_the_cursor_must_start_after_the_pruned_position(
    redis_url: str, namespace: str
) -> None:
    """Following the refusal's advice with a fresh snapshot's first cursor (a boundary at
    the pruned position, a page from the start) stops the stream at the first pruned event
    (``CoverageNotProven``, ``below_boundary``): it has no receipt. The advice says so: a
    cursor whose page starts after that position (a stable boundary), or
    ``reapply_pruned=True``; it said only "a boundary of at least 6"."""
    with CursorStore.from_url(redis_url, namespace=namespace, receipt_horizon=3) as store:
        consumer, ck = applied_to_the_end(store)
        with pytest.raises(CursorError) as refused:
            store.reset("s", cursor=b"0", boundary=0, expected_generation=ck.generation)
        assert "a cursor whose page starts after position 6" in str(refused.value)
        store.reset("s", cursor=b"0", boundary=6, expected_generation=ck.generation)
        with pytest.raises(CoverageNotProven) as stopped:
            consumer.step()
        assert stopped.value.reason == "below_boundary"
