"""A span ends after its children, whichever thread does their work: a renewal the sync
heartbeat has in flight when its attempt ends (the renewer thread is held in the real
SDK's span processor, as a slow exporter or a slow Redis would hold it).

Real Redis and the real SDK: the processor is a real ``SpanProcessor`` added to the test
process's provider, doing nothing until a test arms it."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider

from settle import Settler
from settle._telemetry import telemetry
from tests.telemetry.conftest import Telemetry

WHO = "tenant:acme"


class Holding(SpanProcessor):
    """Holds the thread that starts the first ``settle.renew`` span, once armed, until
    ``release`` is set; ``held`` is set when it holds one."""

    def __init__(self) -> None:
        self.armed = False
        self.held = threading.Event()
        self.release = threading.Event()

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        if self.armed and span.name == "settle.renew":
            self.armed = False
            self.held.set()
            self.release.wait(30)


_HOLDING = Holding()
cast("TracerProvider", trace.get_tracer_provider()).add_span_processor(_HOLDING)


@pytest.fixture
def holding(otel: Telemetry) -> Iterator[Holding]:
    _HOLDING.held.clear()
    _HOLDING.release.clear()
    _HOLDING.armed = True
    try:
        yield _HOLDING
    finally:
        _HOLDING.armed = False
        _HOLDING.release.set()


def _finished(otel: Telemetry, *names: str) -> dict[str, ReadableSpan]:
    deadline = time.monotonic() + 10
    while True:
        found = {s.name: s for s in otel.spans() if s.name in names}
        if len(found) == len(names) or time.monotonic() > deadline:
            return found
        time.sleep(0.01)


def test_a_renewal_in_flight_ends_before_its_attempt_and_operation(
    settler: Settler, otel: Telemetry, holding: Holding
) -> None:
    @settler.operation(key="charge:{n}", principal=WHO, result_type=int, lease=0.6)
    def charge(n: int) -> int:
        assert holding.held.wait(10)  # a renewal is on its way: the attempt ends under it
        return n

    assert charge(1) == 1
    holding.release.set()
    spans = _finished(otel, "settle.renew", "settle.attempt", "settle.operation")
    renewal, attempt = spans["settle.renew"], spans["settle.attempt"]
    operation = spans["settle.operation"]
    assert attempt.context is not None
    assert renewal.parent is not None
    assert renewal.parent.span_id == attempt.context.span_id  # still its child
    assert renewal.end_time is not None
    assert attempt.end_time is not None
    assert renewal.end_time <= attempt.end_time  # and ends first
    assert operation.end_time is not None
    assert attempt.end_time <= operation.end_time


def test_work_resumed_after_its_attempt_ended_is_no_child_of_it(otel: Telemetry) -> None:
    """A renewal that starts after its attempt's span has ended (the renewer took it just
    before the attempt ended) would start and end outside its parent: it is a root."""
    hooks = telemetry()
    operation = hooks.operation("ns", test_work_resumed_after_its_attempt_ended_is_no_child_of_it)
    with operation:
        operation.attempt(SimpleNamespace(number=1, generation=1))
        captured = operation.capture()
    with captured, trace.get_tracer("tests").start_as_current_span("late"):
        pass
    assert otel.span("settle.attempt").end_time is not None
    assert otel.span("late").parent is None


def test_a_child_forked_while_a_span_was_held_ends_its_spans(otel: Telemetry) -> None:
    """The lock that counts the work holding a span open (a heartbeat thread taking it at
    each renewal) is taken by another thread at the fork: the child (gunicorn --preload, a
    multiprocessing worker) must not inherit it taken, or its first decorated call would
    hang for good as it starts an attempt."""
    from settle._otel import spans  # noqa: PLC0415  # the lock of this module

    taken, done = threading.Event(), threading.Event()

    def holding_the_lock() -> None:
        with spans._HOLDS:
            taken.set()
            done.wait(10)

    thread = threading.Thread(target=holding_the_lock)
    thread.start()
    assert taken.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: the attempt starts and ends in another thread, given 5 s
        ended: list[bool] = []

        def attempt() -> None:
            operation = telemetry().operation("ns", attempt)
            with operation:
                operation.attempt(SimpleNamespace(number=1, generation=1))
            ended.append(True)

        try:
            worker = threading.Thread(target=attempt, daemon=True)
            worker.start()
            worker.join(5)
        finally:
            os._exit(0 if ended else 1)
    done.set()
    thread.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
