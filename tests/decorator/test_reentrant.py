"""An operation called inside its own attempt (recursion, or a task it awaits) is refused at
once: the inner call raises ``InvalidInput`` without writing anything, and the outer attempt
is marked provisional and raises it without a retry.

Before, the inner call found its own attempt's live lease and waited for it (``wait``, 5 s
by default) before raising ``OperationInProgress`` naming the caller's own attempt; the
outer attempt took that for an uncertain error and the retry policy ran the function again,
each time re-running what its body did before the inner call (the default policy: three
runs and some 15 s of waiting for itself, then ``OperationInProgress``).
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from structlog.testing import capture_logs

from settle import AsyncSettler, Settler, State
from settle.decorator._plan import _RUNNING
from settle.errors import InvalidInput, OperationFailed


def test_a_sync_operation_called_inside_itself_is_refused_at_once(settler: Settler) -> None:
    runs: list[int] = []

    @settler.operation(key="refund:{order}", principal="tenant:a")
    def refund(order: str, depth: int) -> int:
        runs.append(depth)  # the effect before the nested call
        if depth == 0:
            return 0
        return refund(order, depth) + 1  # the same operation, inside itself

    started = time.monotonic()
    with capture_logs() as logs, pytest.raises(InvalidInput, match="inside its own attempt"):
        refund("A-1", 1)
    assert time.monotonic() - started < 2.0  # no waiting for itself (`wait` is 5 s)
    assert runs == [1]  # the body ran once: no retry of a call that can only fail the same
    record = settler.get("refund:A-1")
    assert record is not None
    assert record.state is State.PROVISIONAL  # not left pending: the next call runs it
    assert [e["event"] for e in logs if e["event"] == "settle.operation.reentered"] == [
        "settle.operation.reentered"
    ]


def test_a_thread_run_in_the_attempts_context_is_refused_too(settler: Settler) -> None:
    runs: list[int] = []

    @settler.operation(key="refund:{order}", principal="tenant:a")
    def refund(order: str, depth: int) -> int:
        runs.append(depth)
        if depth == 0:
            return 0
        with ThreadPoolExecutor(1) as pool:  # a real thread, in a copy of the context
            context = contextvars.copy_context()
            return pool.submit(context.run, refund, order, depth).result() + 1

    started = time.monotonic()
    with pytest.raises(InvalidInput, match="inside its own attempt"):
        refund("A-5", 1)
    assert time.monotonic() - started < 2.0
    assert runs == [1]


def test_other_operations_inside_one_and_its_later_calls_run_as_before(settler: Settler) -> None:
    runs: list[str] = []

    @settler.operation(key="refund:{order}", principal="tenant:a")
    def refund(order: str, parts: list[str]) -> int:
        runs.append(order)
        return sum(refund(part, []) for part in parts) + 1  # other operation ids

    assert refund("A-2", ["A-2a", "A-2b"]) == 3
    assert refund("A-2", ["A-2a", "A-2b"]) == 3  # replayed, in the same thread
    assert refund("A-2a", []) == 1  # replayed: its id was held only while it ran
    assert runs == ["A-2", "A-2a", "A-2b"]


@pytest.mark.asyncio
async def test_an_async_operation_awaiting_itself_is_refused_at_once(
    async_settler: AsyncSettler,
) -> None:
    runs: list[int] = []

    @async_settler.operation(key="refund:{order}", principal="tenant:a")
    async def refund(order: str, depth: int) -> int:
        runs.append(depth)
        if depth == 0:
            return 0
        # In a task of its own (which copies the caller's context) as well as awaited.
        inner = await asyncio.create_task(refund(order, depth))
        return inner + await refund(order, depth)

    started = time.monotonic()
    with pytest.raises(InvalidInput, match="inside its own attempt"):
        await refund("A-3", 1)
    assert time.monotonic() - started < 2.0
    assert runs == [1]
    record = await async_settler.get("refund:A-3")
    assert record is not None
    assert record.state is State.PROVISIONAL


@pytest.mark.asyncio
async def test_concurrent_async_calls_of_one_operation_still_wait_for_each_other(
    async_settler: AsyncSettler,
) -> None:
    runs: list[str] = []

    @async_settler.operation(key="refund:{order}", principal="tenant:a")
    async def refund(order: str) -> str:
        runs.append(order)
        await asyncio.sleep(0.2)
        return order

    # Sibling tasks started by the caller, not by the attempt: one runs, the others wait.
    assert await asyncio.gather(*(refund("A-4") for _ in range(5))) == ["A-4"] * 5
    assert runs == ["A-4"]


def test_an_attempt_is_remembered_only_while_it_runs(settler: Settler) -> None:
    """The mark an attempt leaves in its context is gone when it ends, however it ends: a
    call of the operation after it, in the same thread, while its record still names that
    attempt (its settlement could not be sent), must wait as any other caller's, not be
    refused as a call inside it."""

    @settler.operation(key="refund:{order}", principal="tenant:a", terminal=(LookupError,))
    def refund(order: str, fail: bool) -> str:
        assert _RUNNING.get()  # marked while it runs
        if fail:
            raise LookupError(order)
        return order

    assert refund("A-6", False) == "A-6"
    with pytest.raises(OperationFailed):
        refund("A-7", True)
    assert _RUNNING.get() == ()


@pytest.mark.asyncio
async def test_an_async_attempt_is_remembered_only_while_it_runs(
    async_settler: AsyncSettler,
) -> None:
    """The async twin: awaited in the caller's own task, the mark is gone when the attempt
    ends, whether it returned, failed or was cancelled (a timeout around the call)."""

    @async_settler.operation(key="refund:{order}", principal="tenant:a", terminal=(LookupError,))
    async def refund(order: str, how: str) -> str:
        assert _RUNNING.get()  # marked while it runs
        if how == "fail":
            raise LookupError(order)
        if how == "hang":
            await asyncio.sleep(30)
        return order

    assert await refund("A-8", "return") == "A-8"
    assert _RUNNING.get() == ()
    with pytest.raises(OperationFailed):
        await refund("A-9", "fail")
    assert _RUNNING.get() == ()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await refund("A-10", "hang")
    assert _RUNNING.get() == ()
