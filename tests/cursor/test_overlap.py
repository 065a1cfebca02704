"""Two workers whose steps on the same (cursor, generation) overlap: the second worker loads
its view, the first witnesses and applies part of its response, then the second writes its
witness. The overlapping retry must be judged against the first response exactly as a retry
run after it would be (found in review: it used to be judged against what it saw before)."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from structlog.testing import capture_logs

from settle.cursor import (
    CoverageNotProven,
    CursorConsumer,
    CursorStore,
    EmptyPageSemantics,
    Event,
    Page,
    ProviderContract,
    StepOutcome,
)
from settle.cursor._core import STAND_DOWN_FOR
from settle.cursor.errors import ReceiptConflict

STAND_DOWN_MS = int(STAND_DOWN_FOR * 1000)
SHORTER_STANDS_DOWN_FOR = 0.3  # _shorter's worker: a response idle that long is idle


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


def _drive(
    steps: Any,
    store: CursorStore,
    page: Page,
    handled: list[tuple[str, str]],
    who: str,
    *,
    until: str | None = None,
    resume: bool = False,
) -> Any:
    """Drive one worker's step procedure by hand: run its scripts, hand it ``page``, handle
    its events; stop before handling event ``until`` (returned) or at the end (the result).
    ``resume``: go on after a stop (the stopped event counts as handled by the caller)."""
    from settle.cursor._step import Done, FetchPage, HandleEvent, RunScript  # noqa: PLC0415

    instruction = steps.send(None) if resume else next(steps)
    while True:
        if isinstance(instruction, Done):
            return instruction.result
        if isinstance(instruction, RunScript):
            reply = store.run(instruction.call)
        elif isinstance(instruction, FetchPage):
            reply = page
        elif isinstance(instruction, HandleEvent):
            if instruction.event.id == until:
                return instruction
            handled.append((who, instruction.event.id))
            reply = None
        else:  # pragma: no cover - the procedure's instructions are the ones above
            raise AssertionError(instruction)
        instruction = steps.send(reply)


def test_a_coverage_marker_above_the_boundary_never_lets_a_promotion_skip_an_event(
    store: CursorStore,
) -> None:
    """Worker A's response lists e1 e2 e5 with a coverage marker over (2, 10]; worker B's,
    for the same cursor, lists e1 e2 e4 e5. The marker starts above the applied boundary (0),
    so it proves nothing about e4: the classification ignores it, and so must the promotion.
    A finishes first: its promotion used to count B's unsettled e4 as covered, abandon B,
    and move the checkpoint past e4, which no handler ever saw. Now A's promotion is refused
    and B's response, which has e4, is completed and promoted."""
    from settle.cursor import Coverage  # noqa: PLC0415
    from settle.cursor._step import procedure  # noqa: PLC0415

    contract = ProviderContract(positions="sparse", coverage_watermarks=True)
    e1, e2, e4, e5 = (Event(f"e{i}", i, {"v": i}) for i in (1, 2, 4, 5))
    page_a = Page([e1, e2, e5], successor=b"A", coverage=Coverage(2, 10))
    page_b = Page([e1, e2, e4, e5], successor=b"B")
    g0 = store.start("s", b"0").generation
    a, b = (procedure(store.core, "s", contract, STAND_DOWN_MS) for _ in "ab")
    handled: list[tuple[str, str]] = []
    _drive(a, store, page_a, handled, "A", until="e2")  # A witnessed, applied e1
    _drive(b, store, page_b, handled, "B", until="e2")  # B witnessed its response
    handled.append(("A", "e2"))
    result_a = _drive(a, store, page_a, handled, "A", resume=True)
    handled.append(("B", "e2"))
    result_b = _drive(b, store, page_b, handled, "B", resume=True)
    assert ("B", "e4") in handled  # e4 reached a handler
    assert {r.event_id for r in store.receipts("s")} >= {"e1", "e2", "e4", "e5"}
    checkpoint = store.checkpoint("s")
    assert checkpoint is not None
    assert (checkpoint.cursor, checkpoint.generation) == (b"B", g0 + 1)
    assert result_a.outcome is StepOutcome.LOST
    assert result_b.outcome is StepOutcome.PROMOTED


def test_event_keys_of_two_streams_never_collide(store: CursorStore) -> None:
    """``ctx.key`` is ``<namespace>:<stream>:<event id>``; stream ``a:b`` with event ``c``
    and stream ``a`` with event ``b:c`` made the same key, so a handler deduplicating under
    it (as the quick start does) never applied the second event. A ``:`` or ``%`` in the
    stream name is escaped; other names keep the key they always had."""
    keys: dict[str, str] = {}
    for stream, event_id in (("a:b", "c"), ("a", "b:c"), ("a%3Ab", "c"), ("orders", "e1")):
        store.start(stream, b"0")
        page = Page([Event(event_id, 1, {"v": 1})], successor=b"1")

        def handle(event: Event, ctx: Any, stream: str = stream) -> None:
            keys[stream] = ctx.key

        consumer = CursorConsumer(
            lambda _, page=page: page, handle, ProviderContract(), store=store, stream=stream
        )
        consumer.step()
    assert len(set(keys.values())) == 4
    namespace = store.core.namespace
    assert keys["orders"] == f"{namespace}:orders:e1"  # unchanged where it was unambiguous
    assert keys["a:b"] == f"{namespace}:a%3Ab:c"
    assert keys["a%3Ab"] == f"{namespace}:a%253Ab:c"


# -- a shorter copy of a pending response: it stands down while that response moves --------

SPARSE = ProviderContract(positions="sparse")


def _ev(i: int) -> Event:
    return Event(f"e{i}", i, {"v": i})


def _shorter(store: CursorStore, successor: Any = b"N2", **contract: Any) -> CursorConsumer:
    """A worker whose provider answers e1 e2 only (a smaller page size, a lagging replica),
    with ``stand_down_for`` of 0.3 s."""
    return CursorConsumer(
        lambda _: Page([_ev(1), _ev(2)], successor() if callable(successor) else successor),
        lambda e, c: None,
        ProviderContract(positions="sparse", **contract),
        store=store,
        stream="s",
        stand_down_for=SHORTER_STANDS_DOWN_FOR,
    )


def test_a_worker_resuming_an_idle_response_makes_a_shorter_copy_stand_down(
    redis_url: str, namespace: str
) -> None:
    """A witnessed e1..e4 and died in e2's handler; long after, R resumes that response by
    an exact replay and is in e2's handler now. The resume is that response's progress: B's
    shorter copy stands down (LOST) instead of stopping the stream under a live worker, and
    R promotes."""
    for attempt in range(5):
        store = CursorStore.from_url(redis_url, namespace=f"{namespace}-{attempt}")
        try:
            if _resume_then_shorter_copy(store):
                return
        finally:
            store.close()
    raise AssertionError("every attempt was held past B's stand-down time after R's resume")


def _resume_then_shorter_copy(store: CursorStore) -> bool:
    """The scene of the test above; false when a loaded machine held B's step past its
    stand-down time after R's resume (R's progress then did look idle: no verdict)."""
    from settle.cursor._step import HandleEvent, procedure  # noqa: PLC0415

    page = Page([_ev(1), _ev(2), _ev(3), _ev(4)], b"N4")
    store.start("s", b"C0")
    handled: list[tuple[str, str]] = []
    a = procedure(store.core, "s", SPARSE, STAND_DOWN_MS)
    assert isinstance(_drive(a, store, page, handled, "A", until="e2"), HandleEvent)
    a.close()  # A died in e2's handler
    time.sleep(0.5)  # longer than B's stand_down_for: nothing happened to A's response
    with pytest.raises(CoverageNotProven):  # no worker on it: B stops the stream
        _shorter(store).step()

    started = time.monotonic()  # R's progress is made after this
    r = procedure(store.core, "s", SPARSE, STAND_DOWN_MS)
    with capture_logs() as logs:
        assert isinstance(_drive(r, store, page, handled, "R", until="e2"), HandleEvent)
    assert [e["event"] for e in logs if e["event"] == "settle.cursor.resumed"] == [
        "settle.cursor.resumed"
    ]
    try:
        outcome = _shorter(store).step().outcome
    except CoverageNotProven:
        if time.monotonic() - started < SHORTER_STANDS_DOWN_FOR:
            raise  # R moved less than the stand-down time ago: B had to stand down
        return False
    assert outcome is StepOutcome.LOST
    handled.append(("R", "e2"))
    assert _drive(r, store, page, handled, "R", resume=True).outcome is StepOutcome.PROMOTED
    assert [e for who, e in handled if who != "A"] == ["e2", "e3", "e4"]
    return True


def test_an_idle_response_never_hides_a_moving_longer_one(redis_url: str, namespace: str) -> None:
    """W1 (e1 e2 e3) died long ago after e1; W2 (e1..e4: the provider had one more event)
    was witnessed just now and is in e2's handler. B's e1 e2 is a shorter copy of both: W2
    is moving, so B stands down, whichever of the two the view lists first (both orders are
    run: the witnesses are listed by attempt id, which is random)."""
    from settle.cursor._step import HandleEvent, procedure  # noqa: PLC0415

    orders = set()
    for attempt in range(60):
        store = CursorStore.from_url(redis_url, namespace=f"{namespace}-{attempt}")
        try:
            store.start("s", b"C0")
            handled: list[tuple[str, str]] = []
            w1 = procedure(store.core, "s", SPARSE, STAND_DOWN_MS)
            _drive(w1, store, Page([_ev(1), _ev(2), _ev(3)], b"N3"), handled, "W1", until="e2")
            w1.close()
            time.sleep(0.35)
            started = time.monotonic()  # W2's progress is made after this
            w2 = procedure(store.core, "s", SPARSE, STAND_DOWN_MS)
            at = _drive(
                w2, store, Page([_ev(1), _ev(2), _ev(3), _ev(4)], b"N4"), handled, "W2", until="e2"
            )
            assert isinstance(at, HandleEvent)
            by_id = sorted(store.witnesses("s"), key=lambda w: w.attempt_id)
            try:
                outcome = _shorter(store).step().outcome
            except CoverageNotProven:
                if time.monotonic() - started < SHORTER_STANDS_DOWN_FOR:
                    raise  # W2 moved less than the stand-down time ago: B had to stand down
                continue  # a loaded machine held this attempt past it: W2 did look idle
            assert outcome is StepOutcome.LOST
            orders.add(tuple(len(w.events) for w in by_id))
        finally:
            store.close()
        if len(orders) == 2:
            return
    raise AssertionError(f"only the orders {orders} came up")


def test_a_stopped_stream_writes_nothing_however_often_a_rotating_provider_is_asked(
    store: CursorStore,
) -> None:
    """After the stand-down time every retry stops the stream; a provider that issues a new
    token on every answer must not leave an abandoned witness per retry (every step loads
    them all)."""
    from settle.cursor._step import procedure  # noqa: PLC0415

    store.start("s", b"C0")
    a = procedure(store.core, "s", SPARSE, STAND_DOWN_MS)
    _drive(a, store, Page([_ev(1), _ev(2), _ev(3), _ev(4)], b"N4"), [], "A", until="e2")
    a.close()
    time.sleep(0.35)
    tokens = itertools.count()

    def rotating() -> bytes:  # a new token on every answer
        return f"T{next(tokens)}".encode()

    b = _shorter(store, rotating, rotation_allowed=True)
    for _ in range(10):
        with pytest.raises(CoverageNotProven):
            b.step()
    assert len(store.witnesses("s", limit=1000)) == 1  # A's, pending
