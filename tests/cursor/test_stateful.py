"""Hypothesis drives random fault schedules through the real HTTP provider and a real Redis,
and checks the ground truth after every step: nothing below the checkpoint is missing,
nothing is applied twice, and a final fault-free drain applies the whole log exactly once."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import httpx
import structlog
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from settle.cursor import (
    CursorConsumer,
    CursorDivergence,
    CursorExpired,
    CursorStore,
    Event,
    EventContext,
    ProviderContract,
)
from settle.cursor.models import Disposition
from tests.cursor.conftest import Sink
from tests.cursor.helpers import Crash, drain, truth
from tests.cursor.provider import Provider, ProviderServer, TransportLost, fetcher

CUTS = [
    "settle.cursor.classified",
    "settle.cursor.witness_recorded",
    "settle.cursor.event_recorded",
    "settle.cursor.promoted",
]
_streams = itertools.count()


class CursorMachine(RuleBasedStateMachine):
    redis_url: str
    namespace: str

    def __init__(self) -> None:
        super().__init__()
        self.stream = f"h{next(_streams)}"
        self.sink = Sink()
        self.effect_cuts: Counter[str] = Counter()
        self.cut: tuple[str, int] | None = None
        self.saved = structlog.get_config()
        structlog.configure(processors=[self._maybe_crash, structlog.processors.JSONRenderer()])
        self.http = httpx.Client(timeout=5.0)
        self.store = CursorStore.from_url(self.redis_url, namespace=self.namespace)

    def _maybe_crash(self, _: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
        if self.cut is not None and event.get("event") == self.cut[0]:
            name, n = self.cut
            self.cut = (name, n - 1) if n > 1 else None
            if n == 1:
                raise Crash(name)
        return event

    @initialize(
        rotate=st.booleans(), revoke=st.booleans(), size=st.integers(1, 4), sparse=st.booleans()
    )
    def start(self, rotate: bool, revoke: bool, size: int, sparse: bool) -> None:
        self.server = ProviderServer(
            Provider(page_size=size, rotate=rotate, revoke=revoke)
        ).__enter__()
        self.provider = self.server.provider
        self.gap = 3 if sparse else 1
        self.contract = ProviderContract(
            rotation_allowed=True, positions="sparse" if sparse else "dense"
        )
        self.high = (0, 0)  # (generation, boundary) last seen: never moves back
        self.suspect = False
        self.fetch = fetcher(self.server.url, self.http)
        self.store.start(self.stream, self.provider.token(0).encode())

    def consumer(self, handle: Any) -> CursorConsumer:
        return CursorConsumer(
            self.fetch, handle, self.contract, store=self.store, stream=self.stream
        )

    def step_with(self, handle: Any) -> None:
        try:
            self.consumer(handle).step()
        except (Crash, TransportLost):
            pass
        except CursorExpired:
            self.recover()
        except CursorDivergence:
            # Only a truncated or rewound answer may be refused (and only since one was
            # drawn): any other divergence under these faults is a bug.
            if not self.suspect:
                raise
            self.recover()
        finally:
            self.cut = None

    def recover(self) -> None:
        """The operator's recovery from the stable boundary: the provider resumes from a
        position."""
        self.suspect = False
        ck = self.store.checkpoint(self.stream)
        assert ck is not None
        self.store.reset(
            self.stream,
            cursor=self.provider.token(ck.boundary).encode(),
            boundary=ck.boundary,
            expected_generation=ck.generation,
        )

    @rule(n=st.integers(1, 3))
    def append(self, n: int) -> None:
        self.provider.append(n, gap=self.gap)

    # loop / rewind: the successor is the cursor sent, or one already passed.
    @rule(fault=st.sampled_from(["drop", "empty", "expire", "loop", "rewind"]))
    def provider_fault(self, fault: str) -> None:
        self.suspect = self.suspect or fault in ("loop", "rewind")
        self.provider.faults.append(fault)

    @rule()
    def truncated_retry(self) -> None:
        """A retry of a cursor whose response is witnessed and pending with an event still
        owed (a crash cut it short before that event's receipt) is answered by a lagging
        replica: the page without its last event and a successor at the head.

        Only then can a short page be told from a full one: a first response is trusted to
        end where its successor points, and so is a retry of a response whose events all
        have receipts (a ``held`` answer that brought nothing new): a successor is opaque,
        and the pending response owes nothing the retry could be checked against (see
        docs/cursor-checkpoints.md, "Every witnessed event is owed")."""
        ck = self.store.checkpoint(self.stream)
        assert ck is not None
        received = {
            (r.event_id, r.position, r.digest)
            for r in self.store.receipts(self.stream, after=ck.boundary, limit=1000)
        }
        owing = [
            w
            for w in self.store.witnesses(self.stream, limit=100)
            if w.generation == ck.generation
            and w.disposition.value == "pending"
            and any(
                e.position > ck.boundary and (e.id, e.position, e.digest) not in received
                for e in w.events
            )
        ]
        if owing:
            self.suspect = True
            self.provider.faults.clear()
            # The replica lags: it has the pending response's page up to, not including, its
            # last event (owed: events are handled in order). Not the page as it is now,
            # whose last event may be one appended since, which no response ever showed: a
            # page without it and a successor past it is a provider skipping an event no
            # consumer can see (sparse positions), not a truncated retry.
            self.provider.short_below = max(e.position for e in owing[0].events)
            self.provider.faults.append("short")
            self.step_with(self.sink)
            self.provider.short_below = None

    @rule()
    def step(self) -> None:
        self.step_with(self.sink)

    @rule(cut=st.sampled_from(CUTS), n=st.integers(1, 3))
    def crash_at_log_cut(self, cut: str, n: int) -> None:
        self.cut = (cut, n)
        self.step_with(self.sink)

    @rule(k=st.integers(1, 4), after_effect=st.booleans())
    def crash_in_handler(self, k: int, after_effect: bool) -> None:
        seen = {"n": 0}

        def handle(event: Event, ctx: EventContext) -> None:
            seen["n"] += 1
            if seen["n"] == k and not after_effect:
                raise Crash
            self.sink(event, ctx)
            if seen["n"] == k:
                self.effect_cuts[event.id] += 1
                raise Crash

        self.step_with(handle)

    @invariant()
    @precondition(lambda self: hasattr(self, "provider"))
    def ground_truth(self) -> None:
        ck = self.store.checkpoint(self.stream)
        assert ck is not None
        applied = self.sink.applied()
        assert len(applied) == len(set(applied))  # no effect twice
        log = {e.id: e.position for e in self.provider.log}
        assert set(applied) <= set(log)
        below = {i for i, pos in log.items() if pos <= ck.boundary}
        assert below <= set(applied)  # nothing lost below the checkpoint
        assert (ck.generation, ck.boundary) >= self.high  # never back, never a lower boundary
        assert ck.boundary >= self.high[1]
        self.high = (ck.generation, ck.boundary)
        for event_id, calls in self.sink.calls.items():
            assert calls <= 1 + self.effect_cuts[event_id]

    def teardown(self) -> None:
        try:
            if hasattr(self, "provider"):
                self.provider.faults.clear()
                drain(self.consumer(self.sink))
                ck = self.store.checkpoint(self.stream)
                if ck is not None and ck.boundary < max(
                    (e.position for e in self.provider.log), default=0
                ):
                    # A loop left the cursor behind its boundary (the provider answered with
                    # the cursor it was sent): the stream holds until the operator resets.
                    self.recover()
                    drain(self.consumer(self.sink))
                assert self.sink.applied() == truth(self.provider)
                ck = self.store.checkpoint(self.stream)
                assert ck is not None
                if ck.promoted_witness is not None:
                    [w] = [
                        w
                        for w in self.store.witnesses(self.stream, limit=100)
                        if w.attempt_id == ck.promoted_witness
                    ]
                    assert w.disposition is Disposition.PROMOTED
                    assert w.successor == ck.cursor
        finally:
            structlog.configure(**self.saved)
            self.store.close()
            self.http.close()
            if hasattr(self, "server"):
                self.server.__exit__(None, None, None)


def test_random_fault_schedules_against_ground_truth(redis_url: str, namespace: str) -> None:
    CursorMachine.redis_url = redis_url
    CursorMachine.namespace = namespace
    run_state_machine_as_test(
        CursorMachine,
        settings=settings(
            max_examples=40,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
