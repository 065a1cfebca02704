"""Telemetry never changes what settle does. A span processor that raises (a broken exporter
pipeline) leaves every verdict, return value and heartbeat as it is without telemetry; the
failure is logged as ``settle.telemetry.failed`` with its class only, once. And the sync
heartbeat's renewals are children of the attempt they renew.

Real Redis and the real SDK: the processor is a real ``SpanProcessor`` added to the test
process's provider, raising only for the span names a test gives it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from structlog.testing import capture_logs

from settle import (
    AsyncSettler,
    OperationInProgress,
    Replay,
    Reserved,
    Settler,
    State,
    Verdict,
    _telemetry,
)
from settle.asgi import IdempotencyMiddleware
from tests.telemetry.conftest import Telemetry

WHO = "tenant:acme"
REQUEST = {"amount": 1000}
#: A lease the heartbeat renews every third of; a decorated function below outlives several.
LEASE = 1.0


class Broken(RuntimeError):
    """What the processor raises."""


class Fatal(BaseException):
    """What no ``except Exception`` catches (as ``SystemExit``): it ends a thread."""


class Raising(SpanProcessor):
    """Raises ``Broken`` when a span named in ``starting`` starts or one in ``ending`` ends
    (after the exporter, added first, has the span), ``Fatal`` once when one in ``fatal``
    ends. The message names an operation: settle must never log it."""

    def __init__(self) -> None:
        self.starting: set[str] = set()
        self.ending: set[str] = set()
        self.fatal: set[str] = set()

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        if span.name in self.starting:
            raise Broken("exporter pipeline broke at op-secret-1")

    def on_end(self, span: ReadableSpan) -> None:
        if span.name in self.fatal:
            self.fatal.discard(span.name)
            raise Fatal
        if span.name in self.ending:
            raise Broken("exporter pipeline broke at op-secret-1")


_RAISING = Raising()
cast("TracerProvider", trace.get_tracer_provider()).add_span_processor(_RAISING)


@pytest.fixture
def broken(otel: Telemetry, monkeypatch: pytest.MonkeyPatch) -> Iterator[Raising]:
    # A fresh rate limit: the test's first failure is logged whatever earlier tests did.
    monkeypatch.setattr(_telemetry, "_failed", _telemetry._Failures())
    yield _RAISING
    for names in (_RAISING.starting, _RAISING.ending, _RAISING.fatal):
        names.clear()


def _failures(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "settle.telemetry.failed"]


def _check_logged_once(logs: list[dict[str, Any]]) -> None:
    """Every failure of the test, logged once, by class: no message, no payload."""
    assert _failures(logs) == [
        {
            "event": "settle.telemetry.failed",
            "log_level": "warning",
            "error": "Broken",
            "suppressed": 0,
        }
    ]
    assert "op-secret" not in repr(logs)


# -- settle calls ----------------------------------------------------------------------------

CALLS = ("settle.reserve", "settle.complete", "settle.get")


@pytest.mark.parametrize("where", ["starting", "ending"])
def test_a_raising_processor_changes_no_verdict(
    settler: Settler, broken: Raising, where: str
) -> None:
    getattr(broken, where).update(CALLS)
    with capture_logs() as logs:
        reserved = settler.reserve("op-1", REQUEST, principal=WHO)
        assert isinstance(reserved, Reserved)
        settled = settler.complete(reserved.reservation, {"charged": 1})
        assert settled.verdict is Verdict.ACCEPTED
        replay = settler.reserve("op-1", REQUEST, principal=WHO)
        assert isinstance(replay, Replay)
        assert replay.record.value(dict) == {"charged": 1}
        record = settler.get("op-1")
        assert record is not None
        assert record.state is State.COMPLETED
    _check_logged_once(logs)


@pytest.mark.asyncio
@pytest.mark.parametrize("where", ["starting", "ending"])
async def test_a_raising_processor_changes_no_async_verdict(
    async_settler: AsyncSettler, broken: Raising, where: str
) -> None:
    getattr(broken, where).update(CALLS)
    with capture_logs() as logs:
        reserved = await async_settler.reserve("op-1", REQUEST, principal=WHO)
        assert isinstance(reserved, Reserved)
        settled = await async_settler.complete(reserved.reservation, {"charged": 1})
        assert settled.verdict is Verdict.ACCEPTED
        replay = await async_settler.reserve("op-1", REQUEST, principal=WHO)
        assert isinstance(replay, Replay)
        assert replay.record.value(dict) == {"charged": 1}
        record = await async_settler.get("op-1")
        assert record is not None
        assert record.state is State.COMPLETED
    _check_logged_once(logs)


DECORATED = ("settle.operation", "settle.attempt", "settle.reserve", "settle.complete")


def test_a_raising_processor_changes_no_decorated_call(settler: Settler, broken: Raising) -> None:
    broken.ending.update(DECORATED)
    runs: list[int] = []

    @settler.operation(key="charge:{n}", principal=WHO, result_type=int)
    def charge(n: int) -> int:
        runs.append(n)
        return n * 10

    with capture_logs() as logs:
        assert charge(7) == 70
        assert charge(7) == 70  # replayed
    assert runs == [7]
    _check_logged_once(logs)


@pytest.mark.asyncio
async def test_a_raising_processor_changes_no_async_decorated_call(
    async_settler: AsyncSettler, broken: Raising
) -> None:
    broken.ending.update(DECORATED)
    runs: list[int] = []

    @async_settler.operation(key="charge:{n}", principal=WHO, result_type=int)
    async def charge(n: int) -> int:
        runs.append(n)
        return n * 10

    with capture_logs() as logs:
        assert await charge(7) == 70
        assert await charge(7) == 70
    assert runs == [7]
    _check_logged_once(logs)


# -- heartbeats ------------------------------------------------------------------------------


def _runs_once_beside_a_second_caller(settler: Settler, otel: Telemetry) -> None:
    """A function that outlives 3.5 leases, called again from another thread after each of
    the first two: every second call finds it in progress, it runs once, and its lease was
    renewed all along (about ten renewals)."""
    effects: list[str] = []

    @settler.operation(key="charge:{n}", principal=WHO, result_type=int, lease=LEASE, wait=0.0)
    def charge(n: int) -> int:
        effects.append(threading.current_thread().name)
        time.sleep(3.5 * LEASE)
        return n

    with ThreadPoolExecutor(1, thread_name_prefix="first") as pool:
        first = pool.submit(charge, 1)
        for _ in range(2):
            time.sleep(1.4 * LEASE)
            with pytest.raises(OperationInProgress):
                charge(1)
        assert first.result() == 1
    assert len(effects) == 1
    assert len(otel.spans("settle.renew")) >= 6


def test_a_raising_renewal_span_stops_no_heartbeat(
    settler: Settler, otel: Telemetry, broken: Raising
) -> None:
    broken.ending.add("settle.renew")
    with capture_logs() as logs:
        _runs_once_beside_a_second_caller(settler, otel)
    _check_logged_once(logs)
    assert not [e for e in logs if e["event"] == "settle.operation.heartbeat_failed"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_heartbeat_thread_that_died_is_replaced(
    settler: Settler, otel: Telemetry, broken: Raising
) -> None:
    broken.fatal.add("settle.renew")  # ends the heartbeat thread at its first renewal
    _runs_once_beside_a_second_caller(settler, otel)
    assert not broken.fatal  # it struck


@pytest.mark.asyncio
async def test_a_raising_renewal_span_stops_no_async_heartbeat(
    async_settler: AsyncSettler, otel: Telemetry, broken: Raising
) -> None:
    broken.ending.add("settle.renew")
    effects: list[int] = []

    @async_settler.operation(
        key="charge:{n}", principal=WHO, result_type=int, lease=LEASE, wait=0.0
    )
    async def charge(n: int) -> int:
        effects.append(n)
        await asyncio.sleep(3.5 * LEASE)
        return n

    with capture_logs() as logs:
        first = asyncio.create_task(charge(1))
        for _ in range(2):
            await asyncio.sleep(1.4 * LEASE)
            with pytest.raises(OperationInProgress):
                await charge(1)
        assert await first == 1
    assert effects == [1]
    assert len(otel.spans("settle.renew")) >= 6
    _check_logged_once(logs)


@pytest.mark.asyncio
async def test_a_raising_renewal_span_stops_no_asgi_heartbeat(
    async_settler: AsyncSettler, otel: Telemetry, broken: Raising
) -> None:
    """The HTTP middleware's handler outlives four leases; a retry meanwhile gets 409."""
    broken.ending.add("settle.renew")
    runs = 0

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal runs
        await receive()
        runs += 1
        await asyncio.sleep(4 * 0.6)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"paid"})

    guarded = IdempotencyMiddleware(
        app, settler=async_settler, principal=lambda scope: WHO, lease=0.6
    )
    transport = httpx.ASGITransport(app=guarded)
    headers = {"Idempotency-Key": "k1"}
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        first = asyncio.create_task(client.post("/pay", headers=headers))
        await asyncio.sleep(1.5)
        retry = await client.post("/pay", headers=headers)
        assert retry.status_code == 409
        assert (await first).status_code == 200
    assert runs == 1
    assert len(otel.spans("settle.renew")) >= 6


# -- where renewals are in the trace -----------------------------------------------------------


def test_sync_renewals_are_children_of_the_attempt(settler: Settler, otel: Telemetry) -> None:
    """Renewed from the heartbeat thread, in the attempt's context (the async heartbeat's
    task inherits it)."""

    @settler.operation(key="charge:{n}", principal=WHO, result_type=int, lease=0.6)
    def charge(n: int) -> int:
        time.sleep(0.7)
        return n

    assert charge(1) == 1
    attempt = otel.span("settle.attempt")
    assert attempt.context is not None
    renewals = otel.spans("settle.renew")
    assert len(renewals) >= 2
    for renewal in renewals:
        assert renewal.parent is not None
        assert renewal.parent.span_id == attempt.context.span_id
        assert renewal.context is not None
        assert renewal.context.trace_id == attempt.context.trace_id
