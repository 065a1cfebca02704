"""The provider's edges against the real HTTP provider and a real Redis: truncated retries on
a sparse stream, inclusive pages tied on a timestamp position, loops, empty answers kept on
record, two workers racing on a sparse stream, and reading receipts."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time

import httpx
import pytest
from structlog.testing import capture_logs

from settle._log import event_digest
from settle.cursor import (
    CoverageNotProven,
    CursorConsumer,
    CursorDivergence,
    CursorStore,
    EmptyPageSemantics,
    Event,
    EventContext,
    Page,
    ProviderContract,
    StepOutcome,
    StepResult,
)
from settle.cursor.models import Disposition, Recovery
from settle.errors import InvalidInput
from tests.cursor.conftest import Sink
from tests.cursor.helpers import Crash, drain, truth
from tests.cursor.provider import fetcher


def consumer(store, fetch, handle, **contract) -> CursorConsumer:
    return CursorConsumer(fetch, handle, ProviderContract(**contract), store=store, stream="s")


def crash_at(sink: Sink, event_id: str):
    state = {"armed": True}

    def handle(event: Event, ctx: EventContext) -> None:
        if state["armed"] and event.id == event_id:
            state["armed"] = False
            raise Crash
        sink(event, ctx)

    return handle


def assert_exactly_once(sink: Sink, expected: list[str]) -> None:
    assert sink.applied() == expected
    assert max(sink.calls.values()) == 1


@pytest.mark.parametrize("watermarks", [False, True])
def test_a_truncated_retry_never_skips_a_witnessed_event_beyond_its_last_position(
    serve, store: CursorStore, http, sink, watermarks: bool
) -> None:
    server = serve(page_size=3, watermarks=watermarks)
    p = server.provider
    p.append(3, gap=10)  # 10, 20, 30
    fetch = fetcher(server.url, http)
    contract = {"positions": "sparse", "coverage_watermarks": watermarks}
    g0 = store.start("s", p.token(0).encode()).generation
    with pytest.raises(Crash):  # witnessed 10, 20, 30; applied 10
        consumer(store, fetch, crash_at(sink, "e20"), **contract).step()
    p.append(1, gap=10)  # 40: the head moves on
    p.faults.append("short")  # the retry: 10, 20 and a successor at the head (past 30)

    # A shorter copy of the pending response: it stands down (it cannot tell a lagging
    # replica from a worker that fetched before another one saw more).
    assert consumer(store, fetch, sink, **contract).step().outcome is StepOutcome.LOST
    ck = store.checkpoint("s")
    assert (ck.generation, ck.boundary) == (g0, 0)
    drain(consumer(store, fetch, sink, **contract))
    assert_exactly_once(sink, truth(p))  # 30 was not skipped


@pytest.mark.parametrize("positions", ["dense", "sparse"])
def test_a_shorter_page_after_a_crash_stops_the_stream_once_the_response_stopped_moving(
    serve, store: CursorStore, http, sink, positions: str
) -> None:
    """A worker witnessed a page of four and died after the first event; the consumer comes
    back with a smaller page size. Every retry is a shorter copy of that response, which
    no retry will finish: it stands down while the response might still be moving, then
    the stream stops naming the recovery, instead of answering LOST for good. Pages as
    long as the witnessed one resume it, and every event is applied once."""
    server = serve(page_size=4)
    p = server.provider
    p.append(6)
    fetch = fetcher(server.url, http)
    g0 = store.start("s", p.token(0).encode()).generation
    # The provider issues a new token for every answer: the full page again later is a
    # token rotation of the witnessed one.
    contract = ProviderContract(positions=positions, rotation_allowed=True)
    with pytest.raises(Crash):  # witnessed e1..e4, applied e1
        CursorConsumer(fetch, crash_at(sink, "e2"), contract, store=store, stream="s").step()
    p.page_size = 2

    def restarted() -> CursorConsumer:
        return CursorConsumer(fetch, sink, contract, store=store, stream="s", stand_down_for=0.5)

    assert restarted().step().outcome is StepOutcome.LOST
    time.sleep(0.6)  # the server's clock: no receipt, no change to that response since
    with capture_logs() as logs, pytest.raises(CoverageNotProven) as info:
        restarted().run()
    assert (info.value.reason, info.value.recovery) == (
        "witnessed_event_missing",
        Recovery.STABLE_BOUNDARY,
    )
    assert [e["reason"] for e in logs if e["event"] == "settle.cursor.diverged"] == [
        "witnessed_event_missing"
    ]
    ck = store.checkpoint("s")
    assert (ck.generation, ck.boundary) == (g0, 0)
    assert sink.applied() == ["e1"]

    p.page_size = 4  # the page size restored: the witnessed response is resumed
    drain(restarted())
    assert_exactly_once(sink, truth(p))


def test_a_retry_missing_a_witnessed_event_in_its_middle_stops(
    serve, store: CursorStore, http, sink
) -> None:
    server = serve(page_size=3)
    p = server.provider
    p.append(3, gap=10)
    fetch = fetcher(server.url, http)
    g0 = store.start("s", p.token(0).encode()).generation
    with pytest.raises(Crash):
        consumer(store, fetch, crash_at(sink, "e10"), positions="sparse").step()
    p.delete("e20")  # the retry: 10, 30 (and 40): the witnessed, unsettled 20 is gone
    p.append(1, gap=10)

    with pytest.raises(CoverageNotProven) as info:
        consumer(store, fetch, sink, positions="sparse").step()

    assert info.value.reason == "witnessed_event_missing"
    assert store.checkpoint("s").generation == g0
    assert sink.applied() == []


def test_an_inclusive_page_may_repeat_the_boundary_event_after_events_tied_with_it(
    serve, store: CursorStore, http, sink
) -> None:
    server = serve(page_size=4, inclusive=True, tie_bucket=10)
    p = server.provider
    for position in (11, 21, 22, 23, 31, 32):  # timestamp 2 holds 21, 22, 23
        p.insert(position)
    fetch = fetcher(server.url, http)
    store.start("s", p.token(0).encode())
    c = consumer(store, fetch, sink, boundary="inclusive", positions="sparse")

    first = c.step()
    second = c.step()  # 21, 22, 23 (the boundary, third), 31: judged by the contract

    assert (first.boundary, second.outcome, second.boundary) == (23, StepOutcome.PROMOTED, 31)
    assert (second.applied, second.skipped) == (1, 3)
    drain(c)
    assert_exactly_once(sink, truth(p))


def test_an_inclusive_page_without_the_boundary_event_still_stops(serve, store, http, sink):
    server = serve(page_size=4, inclusive=True, tie_bucket=10)
    p = server.provider
    for position in (11, 21, 22, 23, 31):
        p.insert(position)
    fetch = fetcher(server.url, http)
    store.start("s", p.token(0).encode())
    c = consumer(store, fetch, sink, boundary="inclusive", positions="sparse")
    c.step()
    p.delete("e23")  # the boundary event is gone from the provider

    with pytest.raises(CoverageNotProven) as info:
        c.step()
    assert info.value.reason == "boundary_event_missing"


def test_a_successor_equal_to_the_cursor_with_nothing_new_makes_no_progress(
    serve, store: CursorStore, http, sink
) -> None:
    server = serve(page_size=3)
    p = server.provider
    p.append(3)
    fetch = fetcher(server.url, http)
    store.start("s", p.token(0).encode())
    c = consumer(store, fetch, sink, empty_page=EmptyPageSemantics.CAUGHT_UP)
    c.step()
    before = store.checkpoint("s")
    for _ in range(5):
        p.faults.append("loop")  # the provider answers with the very cursor it was sent

    results = c.run(max_steps=50)

    assert [r.outcome for r in results] == [StepOutcome.NO_PROGRESS]  # run() stops at once
    for _ in range(4):
        assert c.step().outcome is StepOutcome.NO_PROGRESS
    after = store.checkpoint("s")
    assert (after.generation, after.cursor) == (before.generation, before.cursor)
    assert len(store.witnesses("s", limit=100)) == 1  # no witness per loop, no pruning


def test_an_inclusive_loop_repeating_only_the_boundary_stops_run(store: CursorStore, sink):
    contract = ProviderContract(boundary="inclusive", empty_page=EmptyPageSemantics.CAUGHT_UP)
    g0 = store.start("s", b"C0", boundary=499).generation
    fetches: list[bytes] = []

    def fetch(cursor: bytes) -> Page:  # a provider stuck on its boundary event
        fetches.append(cursor)
        if cursor == b"C0":
            return Page([Event("500", 500, 1)], b"C500")
        return Page([Event("500", 500, 1)], b"C500-" + str(len(fetches)).encode())

    results = CursorConsumer(fetch, sink, contract, store=store, stream="s").run(max_steps=50)

    assert len(results) <= 2  # not one new generation per step until max_steps
    ck = store.checkpoint("s")
    assert ck.generation <= g0 + 2
    assert sink.applied() == ["500"]


def test_a_successor_already_passed_never_moves_the_checkpoint_back(
    serve, store: CursorStore, http, sink
) -> None:
    server = serve(page_size=3)
    p = server.provider
    p.append(6)
    fetch = fetcher(server.url, http)
    store.start("s", p.token(0).encode())
    c = consumer(store, fetch, sink, empty_page=EmptyPageSemantics.CAUGHT_UP)
    c.step()
    c.step()
    held = store.checkpoint("s")
    p.append(3)
    p.faults.append("rewind")  # 7, 8, 9 with the successor of two pages ago

    with pytest.raises(CursorDivergence) as info:
        c.step()
    assert info.value.reason == "successor_passed"
    assert store.checkpoint("s").cursor == held.cursor
    assert sink.applied() == [f"e{i}" for i in range(1, 7)]  # 7, 8, 9 were not applied

    c.step()  # a fault-free answer: 7, 8, 9
    p.faults.append("rewind")  # caught up, and the successor is a passed cursor
    result = c.step()
    assert result.outcome is StepOutcome.NO_PROGRESS
    assert store.checkpoint("s").boundary == 9
    assert_exactly_once(sink, truth(p))


def test_a_recently_passed_cursor_is_recognised_behind_a_long_history(
    redis_url: str, namespace: str, sink: Sink
) -> None:
    """With a large ``keep_generations`` more than 1024 witnesses of earlier generations are
    kept; the passed cursors were read oldest first and cut at 1024, so a provider looping
    back to a *recent* cursor was not recognised and the checkpoint moved back. The newest
    ones are read now."""
    store = CursorStore.from_url(redis_url, namespace=namespace, keep_generations=2000)
    log = [Event(f"e{i}", i, {"v": i}) for i in range(1, 1200)]
    loop: list[bool] = []

    def fetch(cursor: bytes) -> Page:
        after = int(cursor.decode())
        if loop:  # the provider answers nothing new, with the cursor of 5 pages ago
            return Page([], str(after - 5).encode())
        events = [e for e in log if e.position > after][:1]
        return Page(events, str(events[-1].position if events else after).encode())

    store.start("long", b"0")
    c = CursorConsumer(
        fetch,
        sink,
        ProviderContract(empty_page=EmptyPageSemantics.CAUGHT_UP),
        store=store,
        stream="long",
    )
    for _ in range(1100):
        assert c.step().outcome is StepOutcome.PROMOTED
    held = store.checkpoint("long")
    assert held is not None
    assert held.cursor == b"1100"
    loop.append(True)
    result = c.step()
    assert result.outcome is StepOutcome.NO_PROGRESS
    checkpoint = store.checkpoint("long")
    assert checkpoint is not None
    assert checkpoint.cursor == b"1100"  # never moved back to 1095
    store.close()


def test_bad_keep_generations_are_refused(redis_url: str, namespace: str) -> None:
    for keep in (0, 10_001, 1.5, "5", True, None):
        with pytest.raises(InvalidInput):
            CursorStore.from_url(redis_url, namespace=namespace, keep_generations=keep)


def test_an_empty_answer_without_evidence_is_kept_once_per_successor(store: CursorStore, sink):
    g0 = store.start("s", b"C0").generation
    c = CursorConsumer(lambda _: Page([], b"C1"), sink, ProviderContract(), store=store, stream="s")
    assert [c.step().outcome for _ in range(3)] == [StepOutcome.HELD] * 3
    [held] = store.witnesses("s")
    assert (held.disposition, held.reason, held.successor) == (Disposition.PENDING, "held", b"C1")
    assert store.checkpoint("s").generation == g0


def test_the_loser_of_a_race_on_a_sparse_stream_learns_it_lost(
    serve, redis_url: str, namespace: str, http
) -> None:
    """A witnesses 10, 20; the head moves; B witnesses 10, 20, 30 and dies before 30's
    receipt. A's promotion would skip 30, which B witnessed: A is told LOST (not a
    divergence), and the next step completes B's response."""
    server = serve(page_size=3)
    p = server.provider
    p.append(2, gap=10)
    fetch = fetcher(server.url, http)
    contract = {"positions": "sparse"}
    a_store = CursorStore.from_url(redis_url, namespace=namespace)
    b_store = CursorStore.from_url(redis_url, namespace=namespace)
    g0 = a_store.start("s", p.token(0).encode()).generation
    sink = Sink()

    def b_runs(event: Event, ctx: EventContext) -> None:
        sink(event, ctx)
        if event.id == "e20":  # A is between its last effect and that event's receipt
            p.append(1, gap=10)
            with pytest.raises(Crash):
                consumer(b_store, fetch, crash_at(sink, "e30"), **contract).step()

    result = consumer(a_store, fetch, b_runs, **contract).step()

    assert result.outcome is StepOutcome.LOST
    assert a_store.checkpoint("s").generation == g0
    drain(consumer(a_store, fetch, sink, **contract))
    assert sink.applied() == ["e10", "e20", "e30"]
    a_store.close()
    b_store.close()


def test_event_ids_reach_the_logs_only_as_keyed_digests(
    serve, redis_url: str, namespace: str, http
) -> None:
    """An event id is what the handler's idempotency key is made of: every event, at every
    level (capture_logs takes DEBUG too), names it only as ``event_digest`` (SPEC 12), the
    event a lost promotion lacks as ``missing_event_digest``. The race above, with ids that
    cannot occur in a hex digest by chance."""
    server = serve(page_size=3)
    p = server.provider
    p.append(2, gap=10)
    plain = fetcher(server.url, http)

    def fetch(cursor: bytes) -> Page:
        page = plain(cursor)
        events = [dataclasses.replace(e, id=f"EVENTID-{e.id}") for e in page.events]
        return dataclasses.replace(page, events=events)

    contract = {"positions": "sparse"}
    a_store = CursorStore.from_url(redis_url, namespace=namespace)
    b_store = CursorStore.from_url(redis_url, namespace=namespace)
    a_store.start("s", p.token(0).encode())
    sink = Sink()

    def b_runs(event: Event, ctx: EventContext) -> None:
        sink(event, ctx)
        if event.id == "EVENTID-e20":
            p.append(1, gap=10)
            with pytest.raises(Crash):
                consumer(b_store, fetch, crash_at(sink, "EVENTID-e30"), **contract).step()

    with capture_logs() as logs:
        assert consumer(a_store, fetch, b_runs, **contract).step().outcome is StepOutcome.LOST
        drain(consumer(a_store, fetch, sink, **contract))
    a_store.close()
    b_store.close()
    assert sink.applied() == ["EVENTID-e10", "EVENTID-e20", "EVENTID-e30"]
    for entry in logs:
        for field, value in entry.items():
            assert "EVENTID" not in str(value), (entry["event"], field)
    recorded = {e["event_digest"] for e in logs if e["event"] == "settle.cursor.event_recorded"}
    assert recorded == {event_digest(f"EVENTID-e{n}") for n in (10, 20, 30)}
    [lost] = [e for e in logs if e["event"] == "settle.cursor.lost" and e["at"] == "promote"]
    assert lost["missing_event_digest"] == event_digest("EVENTID-e30")


def test_two_threads_racing_on_a_sparse_stream_never_report_a_divergence(
    serve, redis_url: str, namespace: str
) -> None:
    server = serve(page_size=4)
    p = server.provider
    contract = ProviderContract(positions="sparse")
    for r in range(8):
        stream = f"sparse-race-{r}"
        p.log.clear()
        p.append(2, gap=10)
        setup = CursorStore.from_url(redis_url, namespace=namespace)
        setup.start(stream, p.token(0).encode())
        setup.close()
        sink = Sink()
        fetched = threading.Barrier(2, timeout=10)
        applying = threading.Barrier(2, timeout=10)
        results: list[StepResult] = []
        errors: list[BaseException] = []

        def worker(
            i: int,
            stream=stream,
            sink=sink,
            fetched=fetched,
            applying=applying,
            results=results,
            errors=errors,
        ) -> None:
            store = CursorStore.from_url(redis_url, namespace=namespace)
            with httpx.Client() as http:
                base = fetcher(server.url, http)

                def fetch(cursor: bytes) -> Page:
                    if i == 1:
                        fetched.wait()  # B fetches after A, and after the head moved
                    page = base(cursor)
                    if i == 0:
                        p.append(1, gap=10)
                        fetched.wait()
                    return page

                def handle(event: Event, ctx: EventContext) -> None:
                    if event.id == "e10":
                        # (broken: the other one already finished, no race left)
                        with contextlib.suppress(threading.BrokenBarrierError):
                            applying.wait()
                    sink(event, ctx)

                try:
                    c = CursorConsumer(fetch, handle, contract, store=store, stream=stream)
                    results.append(c.step())
                except BaseException as exc:
                    errors.append(exc)
                finally:
                    store.close()

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors
        outcomes = sorted(res.outcome.value for res in results)
        assert outcomes in (["lost", "promoted"], ["promoted", "superseded"]), outcomes
        check = CursorStore.from_url(redis_url, namespace=namespace)
        with httpx.Client() as http:
            drain(
                CursorConsumer(
                    fetcher(server.url, http), sink, contract, store=check, stream=stream
                )
            )
        check.close()
        assert sorted(sink.effects.values()) == ["e10", "e20", "e30"]


def test_receipts_are_readable_in_position_order(serve, store: CursorStore, http, sink) -> None:
    server = serve(page_size=2)
    server.provider.append(5)
    store.start("s", server.provider.token(0).encode())
    drain(consumer(store, fetcher(server.url, http), sink))

    receipts = store.receipts("s")
    assert [r.event_id for r in receipts] == ["e1", "e2", "e3", "e4", "e5"]
    assert [r.position for r in store.receipts("s", after=3, limit=1)] == [4]
    assert {r.outcome for r in receipts} == {"applied"}


def test_after_a_reset_the_cursors_walked_again_are_not_taken_for_a_loop(
    store: CursorStore, sink
) -> None:
    log = [Event(f"e{i}", i, i) for i in range(1, 7)]

    def fetch(cursor: bytes) -> Page:  # deterministic cursors: "after:<position>"
        after = int(cursor.split(b":")[1])
        events = [e for e in log if e.position > after][:2]
        return Page(events, b"after:%d" % (events[-1].position if events else after))

    store.start("s", b"after:0")
    c = CursorConsumer(fetch, sink, ProviderContract(), store=store, stream="s")
    c.run()
    ck = store.checkpoint("s")
    store.reset("s", cursor=b"after:2", boundary=2, expected_generation=ck.generation)

    results = c.run()  # after:4 and after:6 again: passed before the reset, not since

    assert [r.outcome for r in results][:2] == [StepOutcome.PROMOTED] * 2
    assert store.checkpoint("s").boundary == 6
    assert_exactly_once(sink, [e.id for e in log])
