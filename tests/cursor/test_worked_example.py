"""The seed's worked example, verbatim, against the real HTTP provider.

Generation 9 holds C41; the first response has 501, 502 and successor N7; 501 becomes
durable; crash; the retry returns 501, 502, 503 and N8; N8 is promoted, never N7. And the
variant where the retry omits 502 stops without advancing.
"""

from __future__ import annotations

import httpx
import pytest

from settle.cursor import (
    CoverageNotProven,
    CursorConsumer,
    CursorStore,
    Event,
    EventContext,
    ProviderContract,
    StepOutcome,
)
from settle.cursor.models import Classification, Disposition, Recovery
from tests.cursor.conftest import Sink
from tests.cursor.helpers import Crash
from tests.cursor.provider import Entry, fetcher


def _generation_9_at_c41(store: CursorStore, stream: str) -> int:
    """The checkpoint at C41, eight generations after its first (the SPEC's generation 9):
    returns the number of generation 1 (a checkpoint's first comes from the server clock)."""
    ck = store.start(stream, b"C41", boundary=500)
    first = ck.generation
    for g in range(first, first + 8):
        ck = store.reset(stream, cursor=b"C41", boundary=500, expected_generation=g)
    assert (ck.cursor, ck.generation - first, ck.boundary) == (b"C41", 8, 500)
    return first


@pytest.fixture
def example(serve, store: CursorStore, http: httpx.Client):
    server = serve(page_size=3, rotate=True)
    p = server.provider
    p.log = [Entry("501", 501, {"v": 501}), Entry("502", 502, {"v": 502})]
    p.token(500, name="C41")
    p.names.extend(["N7", "N8"])
    g9 = _generation_9_at_c41(store, "orders") + 8  # the SPEC's generation 9
    return server, fetcher(server.url, http), g9


def test_n8_is_promoted_never_n7(example, store: CursorStore, sink: Sink) -> None:
    server, fetch, g9 = example
    calls = {"n": 0}

    def crash_after_501(event: Event, ctx: EventContext) -> None:
        calls["n"] += 1
        if event.id == "502" and calls["n"] == 2:
            raise Crash  # 501 is durable (it has its receipt); the worker dies
        sink(event, ctx)

    first = CursorConsumer(fetch, crash_after_501, ProviderContract(), store=store, stream="orders")
    with pytest.raises(Crash):
        first.step()
    [w7] = store.witnesses("orders")
    assert (w7.successor, w7.disposition, w7.generation) == (b"N7", Disposition.PENDING, g9)
    assert [e.id for e in w7.events] == ["501", "502"]
    assert store.checkpoint("orders").cursor == b"C41"

    server.provider.insert(503, "503")  # the retry of C41 returns 501, 502, 503 and N8
    restarted = CursorConsumer(fetch, sink, ProviderContract(), store=store, stream="orders")
    result = restarted.step()

    assert result.outcome is StepOutcome.PROMOTED
    assert result.classification is Classification.SHIFTED_PAGE
    assert (result.applied, result.skipped) == (2, 1)  # 501 was satisfied by its receipt
    ck = store.checkpoint("orders")
    assert (ck.cursor, ck.generation, ck.boundary) == (b"N8", g9 + 1, 503)
    by_successor = {w.successor: w for w in store.witnesses("orders")}
    assert by_successor[b"N8"].disposition is Disposition.PROMOTED
    assert by_successor[b"N7"].disposition is Disposition.ABANDONED
    assert sink.applied() == ["501", "502", "503"]
    assert max(sink.calls.values()) == 1


def test_retry_that_omits_502_stops_without_advancing(
    example, store: CursorStore, sink: Sink
) -> None:
    server, fetch, g9 = example

    def crash_at_502(event: Event, ctx: EventContext) -> None:
        if event.id == "502":
            raise Crash
        sink(event, ctx)

    with pytest.raises(Crash):
        CursorConsumer(fetch, crash_at_502, ProviderContract(), store=store, stream="orders").step()

    server.provider.insert(503, "503")
    server.provider.delete("502")  # the retry returns 501, 503 and N8
    restarted = CursorConsumer(fetch, sink, ProviderContract(), store=store, stream="orders")
    with pytest.raises(CoverageNotProven) as info:
        restarted.step()

    assert info.value.recovery is Recovery.STABLE_BOUNDARY
    assert "reset(" in str(info.value)
    ck = store.checkpoint("orders")
    assert (ck.cursor, ck.generation, ck.boundary) == (b"C41", g9, 500)
    assert sink.applied() == ["501"]  # 503 was never handed over
    by_successor = {w.successor: w for w in store.witnesses("orders")}
    assert by_successor[b"N8"].disposition is Disposition.ABANDONED
    assert by_successor[b"N8"].reason == "divergent:gap"
    assert by_successor[b"N7"].disposition is Disposition.PENDING  # never promoted either

    # Retrying the same divergent response stops again, and is not witnessed twice.
    server.provider.names.append("N8")
    with pytest.raises(CoverageNotProven) as again:
        restarted.step()
    assert again.value.attempt_id == by_successor[b"N8"].attempt_id
    assert len(store.witnesses("orders")) == 2
    assert store.checkpoint("orders").generation == g9
