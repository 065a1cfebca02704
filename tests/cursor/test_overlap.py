"""Two workers whose steps on the same (cursor, generation) overlap: the second worker loads
its view, the first witnesses and applies part of its response, then the second writes its
witness. The overlapping retry must be judged against the first response exactly as a retry
run after it would be (found in review: it used to be judged against what it saw before)."""

from __future__ import annotations

from typing import Any

import pytest

from settle.cursor import (
    CoverageNotProven,
    CursorConsumer,
    CursorStore,
    EmptyPageSemantics,
    Event,
    Page,
    ProviderContract,
)
from settle.cursor.errors import ReceiptConflict


class Crash(Exception):
    pass


def _overlapping_store(url: str, namespace: str, first: CursorConsumer) -> CursorStore:
    """A store whose first witness write lets ``first`` run a whole step (until it crashes)."""

    class Overlapping(CursorStore):
        fired = False

        def run(self, call: Any) -> Any:
            if call.script == "witness" and not Overlapping.fired:
                Overlapping.fired = True
                with pytest.raises(Crash):
                    first.step()
            return super().run(call)

    return Overlapping.from_url(url, namespace=namespace)


def _first_worker(store: CursorStore, page: Page, handled: list[tuple[str, str]]) -> CursorConsumer:
    def handle(event: Event, ctx: Any) -> None:
        if event.id == "502":
            raise Crash
        handled.append(("A", event.id))

    return CursorConsumer(
        lambda _: page, handle, ProviderContract(positions="sparse"), store=store, stream="orders"
    )


def test_an_overlapping_retry_that_omits_a_witnessed_event_stops(
    redis_url: str, namespace: str
) -> None:
    a_store = CursorStore.from_url(redis_url, namespace=namespace)
    a_store.start("orders", b"C41", boundary=500)
    handled: list[tuple[str, str]] = []
    a = _first_worker(
        a_store, Page([Event("501", 501, {"v": 1}), Event("502", 502, {"v": 2})], b"N7"), handled
    )
    b = CursorConsumer(
        lambda _: Page([Event("501", 501, {"v": 1}), Event("503", 503, {"v": 3})], b"N8"),
        lambda event, ctx: handled.append(("B", event.id)),
        ProviderContract(positions="sparse"),
        store=_overlapping_store(redis_url, namespace, a),
        stream="orders",
    )
    with pytest.raises(CoverageNotProven):
        b.step()
    checkpoint = a_store.checkpoint("orders")
    assert checkpoint is not None
    assert (checkpoint.cursor, checkpoint.boundary) == (b"C41", 500)  # N8 never published
    assert handled == [("A", "501")]  # 503 was not handed over past the missing 502


def test_one_event_with_two_payloads_meets_in_one_idempotency_key(
    redis_url: str, namespace: str
) -> None:
    a_store = CursorStore.from_url(redis_url, namespace=namespace)
    a_store.start("orders", b"C41", boundary=500)
    keys: dict[str, list[tuple[str, Any]]] = {}

    def handle_a(event: Event, ctx: Any) -> None:
        if event.id == "502":
            raise Crash
        keys.setdefault(ctx.key, []).append(("A", event.payload))

    a = CursorConsumer(
        lambda _: Page([Event("501", 501, {"amount": 10}), Event("502", 502, 1)], b"N7"),
        handle_a,
        ProviderContract(),
        store=a_store,
        stream="orders",
    )
    b = CursorConsumer(
        lambda _: Page([Event("501", 501, {"amount": 99}), Event("502", 502, 1)], b"N8"),
        lambda event, ctx: keys.setdefault(ctx.key, []).append(("B", event.payload)),
        ProviderContract(),
        store=_overlapping_store(redis_url, namespace, a),
        stream="orders",
    )
    with pytest.raises(ReceiptConflict):
        b.step()
    # Whatever was handed over for event 501 carries one key, so an idempotent sink keeps one.
    assert [k for k in keys if k.endswith(":501")] == [f"{namespace}:orders:501"]


def test_an_inclusive_retry_repeating_only_the_boundary_does_not_pass_a_witnessed_event(
    redis_url: str, namespace: str
) -> None:
    contract = ProviderContract(boundary="inclusive", empty_page=EmptyPageSemantics.CAUGHT_UP)
    store = CursorStore.from_url(redis_url, namespace=namespace)
    store.start("orders", b"C0", boundary=499)
    handled: list[str] = []
    CursorConsumer(
        lambda _: Page([Event("500", 500, 1)], b"C41"),
        lambda e, x: handled.append(e.id),
        contract,
        store=store,
        stream="orders",
    ).step()

    def crash_at_502(event: Event, ctx: Any) -> None:
        if event.id == "502":
            raise Crash
        handled.append(event.id)

    first = Page([Event("500", 500, 1), Event("501", 501, 1), Event("502", 502, 1)], b"N7")
    with pytest.raises(Crash):
        CursorConsumer(lambda _: first, crash_at_502, contract, store=store, stream="orders").step()
    retry = CursorConsumer(
        lambda _: Page([Event("500", 500, 1)], b"N8"),
        lambda e, x: handled.append(e.id),
        contract,
        store=store,
        stream="orders",
    )
    with pytest.raises(CoverageNotProven):
        retry.step()
    checkpoint = store.checkpoint("orders")
    assert checkpoint is not None
    assert checkpoint.cursor == b"C41"  # 502 is still ahead, N8 was not promoted
