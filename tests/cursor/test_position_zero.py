"""A provider whose positions start at 0 (offsets, sequence numbers, row numbers counted
from 0): its first event is applied like any other, against the real HTTP provider and a
real Redis.

The applied boundary is the highest position applied, and a checkpoint started at the
default boundary 0 counts position 0 as applied. Before ``boundary=-1`` was accepted, such
a provider's first page stopped the stream (``CoverageNotProven``, ``below_boundary``) and
no ``start`` or ``reset`` could ever get its event at position 0 applied."""

from __future__ import annotations

import httpx
import pytest

from settle.cursor import (
    AsyncCursorConsumer,
    AsyncCursorStore,
    Coverage,
    CoverageNotProven,
    CursorConsumer,
    CursorStore,
    Event,
    EventContext,
    Page,
    ProviderContract,
    StepOutcome,
)
from settle.cursor.errors import InvalidResponse
from settle.errors import InvalidInput
from tests.cursor.conftest import Sink
from tests.cursor.helpers import drain, truth
from tests.cursor.provider import Provider, async_fetcher, fetcher


def zero_based(provider: Provider) -> str:
    """Positions 0 to 6 in the provider's log; its first cursor, before position 0."""
    provider.insert(0)
    provider.append(6)
    return provider.token(-1)


def test_the_event_at_position_0_is_applied_after_a_start_at_boundary_minus_1(
    serve, store: CursorStore, http: httpx.Client, sink: Sink
) -> None:
    server = serve()
    first = zero_based(server.provider)
    checkpoint = store.start("s", first.encode(), boundary=-1)
    assert checkpoint.boundary == -1
    consumer = CursorConsumer(
        fetcher(server.url, http), sink, ProviderContract(), store=store, stream="s"
    )
    drain(consumer)
    assert sink.applied() == truth(server.provider) == [f"e{i}" for i in range(7)]
    assert max(sink.calls.values()) == 1
    assert store.checkpoint("s").boundary == 6  # type: ignore[union-attr]
    assert [r.position for r in store.receipts("s")] == list(range(7))
    # Read from the boundary it started at, as from any boundary.
    assert [r.position for r in store.receipts("s", after=checkpoint.boundary)] == list(range(7))


def test_the_default_boundary_still_counts_position_0_as_applied(
    serve, store: CursorStore, http: httpx.Client, sink: Sink
) -> None:
    """What the default means is unchanged: a page that shows position 0 to a checkpoint
    at boundary 0 cannot be placed, and nothing is applied."""
    server = serve()
    store.start("s", zero_based(server.provider).encode())
    consumer = CursorConsumer(
        fetcher(server.url, http), sink, ProviderContract(), store=store, stream="s"
    )
    with pytest.raises(CoverageNotProven) as caught:
        consumer.step()
    assert caught.value.reason == "below_boundary"
    assert sink.applied() == []


def test_a_reset_to_boundary_minus_1_reads_from_position_0_again_applying_nothing_twice(
    serve, store: CursorStore, http: httpx.Client, sink: Sink
) -> None:
    server = serve()
    store.start("s", zero_based(server.provider).encode(), boundary=-1)
    consumer = CursorConsumer(
        fetcher(server.url, http), sink, ProviderContract(), store=store, stream="s"
    )
    drain(consumer)
    ck = store.checkpoint("s")
    assert ck is not None
    after = store.reset(
        "s",
        cursor=server.provider.token(-1).encode(),
        boundary=-1,
        expected_generation=ck.generation,
    )
    assert (after.boundary, after.generation) == (-1, ck.generation + 1)
    results = drain(consumer)
    assert sum(r.applied for r in results) == 0
    assert sum(r.skipped for r in results) == 7
    assert max(sink.calls.values()) == 1
    assert store.checkpoint("s").boundary == 6  # type: ignore[union-attr]


def test_a_coverage_marker_from_minus_1_proves_an_empty_zero_based_log(store: CursorStore) -> None:
    """(after, through] with after -1 is every position from 0: an empty answer bound to it
    advances the boundary to ``through``."""
    contract = ProviderContract(coverage_watermarks=True)

    def fetch_page(cursor: bytes) -> Page:
        return Page([], successor=b"at:4", coverage=Coverage(-1, 4))

    def handle(event: Event, ctx: EventContext) -> None:
        raise AssertionError("no event to handle")

    store.start("s", b"start", boundary=-1)
    result = CursorConsumer(fetch_page, handle, contract, store=store, stream="s").step()
    assert (result.outcome, result.boundary) == (StepOutcome.PROMOTED, 4)


@pytest.mark.parametrize("boundary", [-2, -(2**53)])
def test_a_boundary_below_minus_1_is_refused(store: CursorStore, boundary: int) -> None:
    with pytest.raises(InvalidInput, match=r"boundary must be an integer in \[-1, 2\*\*53 - 1\]"):
        store.start("s", b"c", boundary=boundary)
    assert store.checkpoint("s") is None


@pytest.mark.parametrize("boundary", [-2, -(2**53)])
def test_a_reset_below_minus_1_is_refused_and_the_checkpoint_kept(
    store: CursorStore, boundary: int
) -> None:
    ck = store.start("s", b"c", boundary=-1)
    with pytest.raises(InvalidInput, match="boundary"):
        store.reset("s", cursor=b"d", boundary=boundary, expected_generation=ck.generation)
    assert store.checkpoint("s") == ck


def test_receipts_after_below_minus_1_is_refused(store: CursorStore) -> None:
    """``after=-1`` reads from position 0; nothing lies below it to read from."""
    store.start("s", b"c", boundary=-1)
    assert store.receipts("s", after=-1) == []
    with pytest.raises(InvalidInput, match=r"after must be an integer in \[-1, 2\*\*53 - 1\]"):
        store.receipts("s", after=-2)


@pytest.mark.parametrize(
    "coverage",
    [Coverage(-2, 4), Coverage(-1, -1)],
    ids=["after below -1", "through below 0"],
)
def test_a_coverage_marker_below_minus_1_is_an_invalid_response(
    store: CursorStore, coverage: Coverage
) -> None:
    """Only ``after`` may be -1: ``through`` is a position, 0 or more."""
    contract = ProviderContract(coverage_watermarks=True)
    store.start("s", b"start", boundary=-1)
    consumer = CursorConsumer(
        lambda c: Page([], successor=b"x", coverage=coverage),
        lambda e, ctx: None,
        contract,
        store=store,
        stream="s",
    )
    with pytest.raises(InvalidResponse, match="coverage"):
        consumer.step()
    assert store.witnesses("s") == []


@pytest.mark.asyncio
async def test_the_async_store_starts_a_zero_based_stream_too(
    serve, redis_url: str, namespace: str, sink: Sink
) -> None:
    server = serve()
    first = zero_based(server.provider)
    async with (
        AsyncCursorStore.from_url(redis_url, namespace=namespace) as store,
        httpx.AsyncClient(timeout=5.0) as client,
    ):
        await store.start("s", first.encode(), boundary=-1)
        fetch = async_fetcher(server.url, client)

        consumer = AsyncCursorConsumer(
            fetch, sink.handle, ProviderContract(), store=store, stream="s"
        )
        await consumer.run()
        assert sink.applied() == [f"e{i}" for i in range(7)]
        assert (await store.checkpoint("s")).boundary == 6  # type: ignore[union-attr]
