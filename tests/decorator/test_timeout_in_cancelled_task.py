"""A timeout is settle's own whoever calls: an operation called from a task that was
cancelled before the call (a cancellation handler that runs a compensating refund) and
whose attempt the ``timeout`` stops is timed out and retried, not taken for a caller that
cancels meanwhile (docs/outbound-calls.md, "What happens to each outcome"). The async
decorator tells the two apart by the task's count of cancellation requests, counted from
the call's own start. Real Redis."""

from __future__ import annotations

import asyncio

import pytest
import tenacity

from settle import AsyncSettler, State

pytestmark = pytest.mark.asyncio

P = "customer:c-7"


async def test_a_timeout_in_a_task_cancelled_before_the_call_is_a_timeout(
    async_settler: AsyncSettler,
) -> None:
    runs: list[int] = []

    @async_settler.operation(
        key="refund:{order}",
        principal=P,
        timeout=0.05,
        retry=tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(2), wait=tenacity.wait_fixed(0)
        ),
    )
    async def refund(order: int) -> str:
        runs.append(order)
        await asyncio.sleep(30 if len(runs) == 1 else 0)  # the first attempt hangs
        return "re_1"

    started = asyncio.Event()

    async def worker() -> str:
        try:
            started.set()
            await asyncio.sleep(30)
        except asyncio.CancelledError:  # shutting down: refund what was charged
            return await refund(1)
        return "not cancelled"

    task = asyncio.create_task(worker())
    await started.wait()
    task.cancel()
    assert await asyncio.wait_for(task, 10) == "re_1"
    assert runs == [1, 1]  # the first attempt timed out, and was retried
    record = await async_settler.get("refund:1")
    assert record is not None
    assert record.state is State.COMPLETED
