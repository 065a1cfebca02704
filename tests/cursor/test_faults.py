"""Every fault of the issue against the real HTTP provider and its ground truth: no event
lost, none applied twice, and a divergence stops the stream without advancing it."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from settle.cursor import (
    AsyncCursorConsumer,
    AsyncCursorStore,
    CoverageNotProven,
    CursorConsumer,
    CursorDivergence,
    CursorExpired,
    CursorStore,
    EmptyPageSemantics,
    Event,
    EventContext,
    ProviderContract,
    StepOutcome,
)
from settle.cursor.errors import ReceiptConflict, RotationNotAllowed
from settle.cursor.models import Classification, Disposition, Recovery
from tests.cursor.conftest import Sink
from tests.cursor.helpers import Crash, drain, truth
from tests.cursor.provider import async_fetcher, fetcher


def crash_at(sink: Sink, event_id: str):
    """A handler that dies before the effect of ``event_id``, once."""
    state = {"armed": True}

    def handle(event: Event, ctx: EventContext) -> None:
        if state["armed"] and event.id == event_id:
            state["armed"] = False
            raise Crash
        sink(event, ctx)

    return handle


def consumer(store, fetch, handle, **contract) -> CursorConsumer:
    return CursorConsumer(fetch, handle, ProviderContract(**contract), store=store, stream="s")


def assert_exactly_once(sink: Sink, expected: list[str]) -> None:
    assert sink.applied() == expected
    assert set(sink.calls) == set(expected)
    assert max(sink.calls.values()) == 1


def test_exact_replay_resumes_the_same_witness(serve, store: CursorStore, http, sink) -> None:
    server = serve(page_size=3)
    server.provider.append(7)
    fetch = fetcher(server.url, http)
    store.start("s", server.provider.token(0).encode())
    with pytest.raises(Crash):
        consumer(store, fetch, crash_at(sink, "e2")).step()
    [first] = store.witnesses("s")

    result = consumer(store, fetch, sink).step()

    assert result.classification is Classification.EXACT_REPLAY
    assert result.attempt_id == first.attempt_id  # resumed, not a second witness
    assert (result.applied, result.skipped) == (2, 1)
    assert len(store.witnesses("s")) == 1
    drain(consumer(store, fetch, sink))
    assert_exactly_once(sink, truth(server.provider))


@pytest.mark.parametrize("revoke", [False, True], ids=["old-token-valid", "old-token-revoked"])
def test_token_rotation(serve, store: CursorStore, http, sink, revoke: bool) -> None:
    server = serve(page_size=3, rotate=True, revoke=revoke)
    server.provider.append(8)
    fetch = fetcher(server.url, http)
    store.start("s", server.provider.token(0).encode())
    with pytest.raises(Crash):
        consumer(store, fetch, crash_at(sink, "e3"), rotation_allowed=True).step()
    [old] = store.witnesses("s")

    result = consumer(store, fetch, sink, rotation_allowed=True).step()

    assert result.classification is Classification.TOKEN_ROTATION
    ck = store.checkpoint("s")
    assert ck.cursor != old.successor  # the successor of the response that was applied
    new = {w.successor: w for w in store.witnesses("s")}
    assert new[ck.cursor].disposition is Disposition.PROMOTED
    assert new[old.successor].disposition is Disposition.ABANDONED
    assert (old.successor.decode() in server.provider.revoked) is revoke
    drain(consumer(store, fetch, sink, rotation_allowed=True))
    assert_exactly_once(sink, truth(server.provider))
    assert server.provider.gone == 0  # a revoked token was never sent


def test_rotation_against_the_contract_stops(serve, store: CursorStore, http, sink) -> None:
    server = serve(page_size=3, rotate=True)
    server.provider.append(4)
    fetch = fetcher(server.url, http)
    g0 = store.start("s", server.provider.token(0).encode()).generation
    with pytest.raises(Crash):
        consumer(store, fetch, crash_at(sink, "e2")).step()

    with pytest.raises(RotationNotAllowed) as info:
        consumer(store, fetch, sink).step()

    assert info.value.recovery is Recovery.STABLE_BOUNDARY
    assert store.checkpoint("s").generation == g0
    assert sink.applied() == ["e1"]


def test_page_shifted_by_an_insert_before_the_cursor(serve, store, http, sink) -> None:
    # Offset tokens over sparse positions: a late event sorted before the cursor shifts
    # the retried page back by one, onto an event already applied.
    server = serve(page_size=4, offsets=True)
    p = server.provider
    p.append(6, gap=10)
    fetch = fetcher(server.url, http)
    store.start("s", p.token(0).encode())
    drain(consumer(store, fetch, sink, positions="sparse"))
    p.append(3, gap=10)  # 70, 80, 90
    with pytest.raises(Crash):
        consumer(store, fetch, crash_at(sink, "e80"), positions="sparse").step()
    p.insert(15)  # before the cursor: the retry at the same offset returns 60, 70, 80, 90

    result = consumer(store, fetch, sink, positions="sparse").step()

    assert result.classification is Classification.SHIFTED_PAGE
    assert (result.applied, result.skipped) == (2, 2)  # 60 and 70 matched their receipts
    drain(consumer(store, fetch, sink, positions="sparse"))
    # e15 landed below the applied boundary: no forward cursor can deliver it (documented).
    assert_exactly_once(sink, [e for e in truth(p) if e != "e15"])


def test_page_shifted_by_a_delete_before_the_cursor(serve, store, http, sink) -> None:
    server = serve(page_size=3, offsets=True)
    p = server.provider
    p.append(6)
    fetch = fetcher(server.url, http)
    store.start("s", p.token(0).encode())
    drain(consumer(store, fetch, sink))
    p.append(3)
    p.delete("e3")  # applied already; the offset cursor now skips e7

    with pytest.raises(CoverageNotProven) as info:
        consumer(store, fetch, sink).step()

    assert info.value.recovery is Recovery.STABLE_BOUNDARY
    ck = store.checkpoint("s")
    assert ck.boundary == 6
    # Recovery from the stable boundary: a cursor at position 6 (index 5 after the delete).
    store.reset("s", cursor=p.token(5).encode(), boundary=6, expected_generation=ck.generation)
    drain(consumer(store, fetch, sink))
    assert_exactly_once(sink, [f"e{i}" for i in range(1, 10)])


def test_same_id_with_a_changed_payload(serve, store, http, sink) -> None:
    server = serve(page_size=3)
    server.provider.append(5)
    fetch = fetcher(server.url, http)
    g0 = store.start("s", server.provider.token(0).encode()).generation
    with pytest.raises(Crash):
        consumer(store, fetch, crash_at(sink, "e3")).step()
    server.provider.mutate("e2")  # applied already

    with pytest.raises(ReceiptConflict) as info:
        consumer(store, fetch, sink).step()

    assert info.value.recovery is Recovery.FRESH_SNAPSHOT
    assert info.value.reason == "changed_payload"
    assert store.checkpoint("s").generation == g0
    assert sink.applied() == ["e1", "e2"]


def test_response_lost_after_the_successor_was_issued(serve, store, http, sink) -> None:
    server = serve(page_size=2, rotate=True, revoke=True)
    p = server.provider
    p.append(7)
    p.faults.extend([None, "drop", None, "drop", "drop"])
    fetch = fetcher(server.url, http)
    store.start("s", p.token(0).encode())

    drain(consumer(store, fetch, sink, rotation_allowed=True))

    assert_exactly_once(sink, truth(p))
    assert p.gone == 0
    ck = store.checkpoint("s")
    promoted = [w for w in store.witnesses("s") if w.disposition is Disposition.PROMOTED]
    assert ck.cursor == promoted[0].successor


def test_expired_cursor_by_ttl_is_never_sent(serve, store, http, sink) -> None:
    server = serve(page_size=3)
    server.provider.append(2)
    fetch = fetcher(server.url, http)
    g0 = store.start("s", server.provider.token(0).encode()).generation
    time.sleep(0.3)
    before = server.provider.requests

    with pytest.raises(CursorExpired) as info:
        consumer(store, fetch, sink, cursor_ttl=0.2).step()

    assert server.provider.requests == before
    assert info.value.recovery is Recovery.STABLE_BOUNDARY
    assert store.checkpoint("s").generation == g0


def test_expired_cursor_reported_by_the_provider(serve, store, http, sink) -> None:
    server = serve(page_size=3)
    p = server.provider
    p.append(5)
    p.faults.extend([None, "expire"])
    fetch = fetcher(server.url, http)
    g0 = store.start("s", p.token(0).encode()).generation
    consumer(store, fetch, sink).step()

    with pytest.raises(CursorExpired):
        consumer(store, fetch, sink).step()

    ck = store.checkpoint("s")
    assert (ck.generation, ck.boundary) == (g0 + 1, 3)
    store.reset("s", cursor=p.token(3).encode(), boundary=3, expected_generation=g0 + 1)
    drain(consumer(store, fetch, sink))
    assert_exactly_once(sink, truth(p))


def test_empty_page_without_evidence_holds(serve, store, http, sink) -> None:
    server = serve(page_size=3, watermarks=True)
    p = server.provider
    p.append(4)
    p.faults.append("empty")  # a lagging replica: no events, no watermark
    fetch = fetcher(server.url, http)
    g0 = store.start("s", p.token(0).encode()).generation

    result = consumer(store, fetch, sink, coverage_watermarks=True).step()

    assert result.outcome is StepOutcome.HELD
    ck = store.checkpoint("s")
    assert (ck.generation, ck.boundary) == (g0, 0)
    # The empty response is on record (pending, never promoted), so the evidence exists.
    [held] = store.witnesses("s")
    assert (held.events, held.disposition, held.reason) == ((), Disposition.PENDING, "held")
    assert held.successor != ck.cursor
    drain(consumer(store, fetch, sink, coverage_watermarks=True))
    assert_exactly_once(sink, truth(p))


def test_empty_page_with_a_watermark_advances(serve, store, http, sink) -> None:
    server = serve(page_size=3, watermarks=True)
    p = server.provider
    p.append(3)
    fetch = fetcher(server.url, http)
    g0 = store.start("s", p.token(0).encode()).generation
    c = consumer(store, fetch, sink, coverage_watermarks=True)
    c.step()

    result = c.step()  # empty, with coverage (3, 3] bound to this response

    assert result.outcome is StepOutcome.PROMOTED
    assert (result.generation, result.boundary) == (g0 + 2, 3)
    [empty, _] = store.witnesses("s")
    assert empty.events == ()
    assert empty.coverage == (3, 3)
    p.append(2)
    drain(c)
    assert_exactly_once(sink, truth(p))


def test_empty_page_under_documented_semantics_advances(serve, store, http, sink) -> None:
    server = serve(page_size=3)
    server.provider.append(3)
    fetch = fetcher(server.url, http)
    store.start("s", server.provider.token(0).encode())
    plain = consumer(store, fetch, sink)
    plain.step()
    assert plain.step().outcome is StepOutcome.HELD

    documented = consumer(store, fetch, sink, empty_page=EmptyPageSemantics.CAUGHT_UP)
    assert documented.step().outcome is StepOutcome.PROMOTED


def test_sparse_positions_without_coverage_prove_nothing(serve, store, http, sink) -> None:
    server = serve(page_size=3)
    p = server.provider
    p.append(3, gap=10)  # 10, 20, 30
    fetch = fetcher(server.url, http)
    g0 = store.start("s", p.token(0).encode()).generation
    with pytest.raises(Crash):
        consumer(store, fetch, crash_at(sink, "e10"), positions="sparse").step()
    p.insert(5)  # the retry returns 5, 10, 20: nothing ties it to the applied boundary

    with pytest.raises(CoverageNotProven) as info:
        consumer(store, fetch, sink, positions="sparse").step()

    assert info.value.reason == "sparse_unproven"
    assert store.checkpoint("s").generation == g0
    assert sink.applied() == []


def test_sparse_shifted_page_with_coverage_is_accepted(serve, store, http, sink) -> None:
    server = serve(page_size=4, watermarks=True)
    p = server.provider
    p.append(3, gap=10)
    fetch = fetcher(server.url, http)
    store.start("s", p.token(0).encode())
    contract = {"positions": "sparse", "coverage_watermarks": True}
    with pytest.raises(Crash):
        consumer(store, fetch, crash_at(sink, "e10"), **contract).step()
    p.insert(5)

    result = consumer(store, fetch, sink, **contract).step()

    assert result.classification is Classification.SHIFTED_PAGE
    drain(consumer(store, fetch, sink, **contract))
    assert_exactly_once(sink, truth(p))


def test_inclusive_boundary_repeats_are_satisfied_by_receipts(serve, store, http, sink) -> None:
    server = serve(page_size=3, inclusive=True)
    p = server.provider
    p.append(7, gap=5)
    fetch = fetcher(server.url, http)
    store.start("s", p.token(0).encode())

    drain(consumer(store, fetch, sink, positions="sparse", boundary="inclusive"))

    assert_exactly_once(sink, truth(p))
    p.delete("e35")  # the boundary event vanishes: the next page cannot prove contiguity
    p.insert(40)
    with pytest.raises(CoverageNotProven):
        consumer(store, fetch, sink, positions="sparse", boundary="inclusive").step()


def test_async_consumer_runs_the_same_procedure(serve, redis_url, namespace) -> None:
    server = serve(page_size=2, rotate=True)
    server.provider.append(5)
    sink = Sink()

    async def handle(event: Event, ctx: EventContext) -> None:
        await asyncio.sleep(0)
        sink(event, ctx)

    async def main() -> None:
        async with (
            AsyncCursorStore.from_url(redis_url, namespace=namespace) as store,
            httpx.AsyncClient() as client,
        ):
            await store.start("s", server.provider.token(0).encode())
            c = AsyncCursorConsumer(
                async_fetcher(server.url, client),
                handle,
                ProviderContract(rotation_allowed=True),
                store=store,
                stream="s",
            )
            results = await c.run()
            assert results[-1].outcome is StepOutcome.HELD  # caught up
            assert sum(r.applied for r in results) == 5
            assert (await store.checkpoint("s")).boundary == 5

    asyncio.run(main())
    assert_exactly_once(sink, truth(server.provider))


def test_stable_snapshot_contract(serve, store, http, sink) -> None:
    server = serve(page_size=3, snapshot="snap-1")
    p = server.provider
    p.append(2)
    fetch = fetcher(server.url, http)
    store.start("s", p.token(0).encode())
    with pytest.raises(Crash):
        consumer(store, fetch, crash_at(sink, "e2"), stable_snapshots=True).step()
    p.append(1)  # the "stable" snapshot answers the same cursor with other events

    with pytest.raises(CursorDivergence) as info:
        consumer(store, fetch, sink, stable_snapshots=True).step()
    assert (info.value.reason, info.value.recovery) == ("snapshot_changed", Recovery.FRESH_SNAPSHOT)

    # Recovery: a fresh snapshot from the start; receipts keep e1 from being applied twice.
    p.snapshot = "snap-2"
    ck = store.checkpoint("s")
    store.reset("s", cursor=p.token(0).encode(), boundary=0, expected_generation=ck.generation)
    c = consumer(store, fetch, sink, stable_snapshots=True)
    first = c.step()
    assert (first.applied, first.skipped) == (2, 1)
    empty = c.step()  # an empty page under the snapshot ends it: evidence to advance
    assert empty.outcome is StepOutcome.PROMOTED
    assert_exactly_once(sink, truth(p))
