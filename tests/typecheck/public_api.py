"""The public API as a user writes it, checked by mypy --strict (tests/unit/test_public_surface.py).

Never run: it is only type-checked, so each call's argument and return types are what a user's
own type checker sees. A rename or a loosened type in the public surface fails that test.
"""

from __future__ import annotations

from typing import assert_type

import settle
from settle import (
    AsyncSettler,
    Attempt,
    BindingMismatch,
    DurabilityError,
    FingerprintMismatch,
    InProgress,
    OperationRecord,
    QuarantineEntry,
    QuarantineKind,
    Replay,
    Reservation,
    Reserved,
    SettleConfig,
    SettleError,
    Settlement,
    Settler,
    State,
    Verdict,
    fingerprint,
)
from settle.cursor import (
    AsyncCursorConsumer,
    AsyncCursorStore,
    CursorConsumer,
    CursorStore,
    Event,
    Page,
    ProviderContract,
    Receipt,
    StepResult,
)
from settle.progress import (
    Applied,
    AsyncProgressStore,
    DeliveryId,
    EffectContext,
    EmissionId,
    ProgressStore,
    ProviderScope,
    StreamConsumer,
)


def sync_api() -> None:
    settler = Settler.from_url("redis://localhost:6379/0", namespace="payments", min_replicas=1)
    cluster = Settler.from_cluster(["127.0.0.1:7000"], SettleConfig(namespace="payments"))
    assert_type(cluster, Settler)
    r = settler.reserve("order-42", {"amount": 100}, principal="tenant:acme", lease=30.0)
    assert_type(r, Reserved | Replay | InProgress)
    match r:
        case Reserved(reservation=reservation):
            assert_type(reservation, Reservation)
            done = settler.complete(reservation, {"charge": "ch_1"})
            assert_type(done, Settlement)
            assert_type(done.verdict, Verdict)
            settler.renew(reservation, lease=30.0)
            settler.mark_provisional(reservation, reason="timeout")
            settler.fail(reservation, ValueError("declined"))
        case Replay():
            pass
        case InProgress():
            pass
    record = settler.get("order-42")
    assert_type(record, OperationRecord | None)
    if record is not None:
        assert_type(record.state, State)
    entries = settler.quarantine.list(kind=QuarantineKind.STALE_GENERATION, limit=10)
    assert_type(entries, list[QuarantineEntry])
    assert_type(settler.get_many(["order-42", "order-43"]), list[OperationRecord | None])
    assert_type(fingerprint({"a": 1}), str)

    @settler.operation(key="charge:{order_id}", principal="tenant:acme")
    def charge(order_id: str, attempt: Attempt = Attempt.INJECTED) -> str:
        return f"{order_id}:{attempt.generation}"

    assert_type(charge("o-1"), str)
    settler.close()


async def async_api() -> None:
    async with AsyncSettler.from_url("redis://localhost", namespace="payments") as settler:
        r = await settler.reserve("order-42", None, principal="tenant:acme")
        assert_type(r, Reserved | Replay | InProgress)
        assert_type(await settler.get_many(["order-42"]), list[OperationRecord | None])
        try:
            await settler.get("order-42")
        except (FingerprintMismatch, BindingMismatch, DurabilityError) as exc:
            assert_type(exc.operation_id, str | None)
        except SettleError:
            pass


def companions() -> None:
    store = CursorStore.from_url("redis://localhost", namespace="feeds", min_replicas=1)

    def fetch(cursor: bytes) -> Page:
        return Page(events=[Event("e1", 1, {})], successor=cursor)

    consumer = CursorConsumer(
        fetch, lambda event, context: None, ProviderContract(), store=store, stream="orders"
    )
    assert_type(consumer.step(), StepResult)
    progress = ProgressStore.from_url("redis://localhost", consumer="billing", min_replicas=1)
    worker = StreamConsumer.from_urls(
        "redis://localhost/0", "redis://localhost/1", consumer="billing", stream="s", group="g"
    )

    def effect(context: EffectContext) -> None:
        assert_type(context, EffectContext)

    worker.run(effect, polls=1)
    with worker as same:
        assert_type(same, StreamConsumer)
        assert_type(same.dead_letter_key, str)
    assert_type(store.receipts("orders", after=3, limit=10), list[Receipt])
    progress.close()
    assert_type(AsyncProgressStore.from_url("redis://x", consumer="c"), AsyncProgressStore)


async def async_companions() -> None:
    store = AsyncProgressStore.from_url("redis://x", consumer="c")
    await store.close()  # the same as aclose()
    async with AsyncProgressStore.from_url("redis://x", consumer="c") as other:
        assert_type(other, AsyncProgressStore)
    cursors = AsyncCursorStore.from_url("redis://x")
    assert_type(await cursors.receipts("s"), list[Receipt])

    # The async shells take a plain function too (its value stands: it ran).
    async def fetch(cursor: bytes) -> Page:
        return Page([], cursor)

    def handle(event: Event, context: object) -> None:
        return None

    AsyncCursorConsumer(fetch, handle, ProviderContract(), store=cursors, stream="s")

    def effect(context: EffectContext) -> None:
        return None

    scope = ProviderScope("orders", "billing", "inc1")
    assert_type(await store.apply(scope, DeliveryId("1-1"), EmissionId("e1"), effect), Applied)
    await cursors.aclose()
    assert_type(Applied, type[Applied])
    assert_type(settle.__version__, str)
