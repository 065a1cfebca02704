"""A caller that cancels its call gets the cancellation, and its operation is not run again
(docs/outbound-calls.md, "What happens to each outcome": cancelled, ``mark_provisional
("cancelled")``, the cancellation, without retry). When the cancellation came while the
attempt's ``timeout`` had already stopped the function (in its cleanup: closing the HTTP
client after the timeout), settle took it for its own timeout: the attempt was marked
``timeout``, tenacity retried it (the charge ran twice more for a caller who had gone)
and the caller's task ended with ``TimeoutError``, not cancelled. Real Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import tenacity

from settle import AsyncSettler, OperationRecord, State

pytestmark = pytest.mark.asyncio

PRINCIPAL = "customer:c-7"


def _operation(async_settler: AsyncSettler, runs: list[int], stopped: asyncio.Event) -> Any:
    @async_settler.operation(
        key="charge:{order}",
        principal=PRINCIPAL,
        timeout=0.05,
        retry=tenacity.Retrying(stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_fixed(0)),
    )
    async def charge(order: int, swallow: bool = False) -> str:
        runs.append(order)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:  # the timeout stopped it
            stopped.set()
            try:
                # closing the client; the caller cancels meanwhile (a retry's is quick)
                await asyncio.sleep(30 if len(runs) == 1 else 0)
            except asyncio.CancelledError:
                if swallow:  # the cleanup finishes all the same and returns
                    return "ch_late"
                raise
            raise
        return "ch_1"

    return charge


async def _cancelled_while_stopped(
    async_settler: AsyncSettler, order: int, *, swallow: bool
) -> tuple[Any, list[int], OperationRecord | None]:
    """Call, cancel the call once the timeout has stopped the function, and read the
    record: the decorated function, the orders it ran for and the record."""
    runs: list[int] = []
    stopped = asyncio.Event()
    charge = _operation(async_settler, runs, stopped)
    task = asyncio.create_task(charge(order, swallow=swallow))
    await asyncio.wait_for(stopped.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    return charge, runs, await async_settler.get(f"charge:{order}")


async def test_a_caller_cancelled_while_the_timeout_stops_the_function_is_cancelled(
    async_settler: AsyncSettler,
) -> None:
    _, runs, record = await _cancelled_while_stopped(async_settler, 1, swallow=False)
    assert runs == [1]  # not retried for a caller that has gone
    assert record is not None
    assert (record.state, record.reason) == (State.PROVISIONAL, "cancelled")


async def test_a_value_returned_after_both_is_completed_then_the_caller_is_cancelled(
    async_settler: AsyncSettler,
) -> None:
    charge, runs, record = await _cancelled_while_stopped(async_settler, 2, swallow=True)
    assert runs == [2]
    assert record is not None
    assert record.state is State.COMPLETED
    assert await charge(2, swallow=True) == "ch_late"  # replayed
    assert runs == [2]
