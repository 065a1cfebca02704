"""An operation called inside its own attempt, by way of another operation (A runs B, B
calls A) or from a task of a ``TaskGroup`` (the refusal arrives in an exception group), is
refused without a retry of anything that made the call, and the refusal is never stored as
a definite failure, whatever ``terminal`` lists (``InvalidInput`` is a ``ValueError``).

Before, only the attempt of the very operation that was called again recognised the
refusal: the operation in between (B) took it for an uncertain error and the retry policy
ran B's body again (three runs of B per run of A), or, with ``terminal=(ValueError,)``,
stored it as B's failure for good; and a refusal inside an exception group had A itself
retried.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import tenacity

from settle import AsyncSettler, Settler, State
from settle.errors import InvalidInput

FAST = tenacity.Retrying(
    stop=tenacity.stop_after_attempt(3),
    wait=tenacity.wait_fixed(0.05),
    retry=tenacity.retry_if_exception_type(Exception),
)


@pytest.mark.parametrize("terminal", [(), (ValueError,)])
def test_an_operation_in_between_is_not_retried_nor_failed(
    settler: Settler, terminal: tuple[type[BaseException], ...]
) -> None:
    runs: list[str] = []

    @settler.operation(key="order:{order}", principal="tenant:a", retry=FAST)
    def place(order: str) -> str:
        runs.append("place")
        return capture(order)

    @settler.operation(key="capture:{order}", principal="tenant:a", retry=FAST, terminal=terminal)
    def capture(order: str) -> str:
        runs.append("capture")
        return place(order)  # the outer operation, inside its own attempt

    started = time.monotonic()
    with pytest.raises(InvalidInput, match="inside its own attempt"):
        place("A-1")
    assert time.monotonic() - started < 2.0
    assert runs == ["place", "capture"]  # neither body ran again
    for operation_id in ("order:A-1", "capture:A-1"):
        record = settler.get(operation_id)
        assert record is not None
        assert record.state is State.PROVISIONAL  # not a stored failure: the next call runs


@pytest.mark.asyncio
async def test_a_refusal_inside_a_task_group_is_not_retried(
    async_settler: AsyncSettler,
) -> None:
    runs: list[int] = []

    @async_settler.operation(key="refund:{order}", principal="tenant:a", retry=FAST)
    async def refund(order: str, depth: int) -> int:
        runs.append(depth)
        if depth == 0:
            return 0
        async with asyncio.TaskGroup() as group:
            inner = group.create_task(refund(order, depth))
        return inner.result() + 1

    with pytest.raises(ExceptionGroup) as info:
        await refund("A-2", 1)
    assert info.value.subgroup(InvalidInput) is not None  # the inner call's refusal
    assert runs == [1]  # the attempt was not run again
    record = await async_settler.get("refund:A-2")
    assert record is not None
    assert record.state is State.PROVISIONAL


@pytest.mark.asyncio
async def test_an_async_operation_in_between_is_not_retried(
    async_settler: AsyncSettler,
) -> None:
    runs: list[str] = []

    @async_settler.operation(key="order:{order}", principal="tenant:a", retry=FAST)
    async def place(order: str) -> str:
        runs.append("place")
        return await capture(order)

    @async_settler.operation(key="capture:{order}", principal="tenant:a", retry=FAST)
    async def capture(order: str) -> str:
        runs.append("capture")
        return await place(order)

    with pytest.raises(InvalidInput, match="inside its own attempt"):
        await place("A-3")
    assert runs == ["place", "capture"]


class RefundError(Exception):
    """A payment code's own error, that wraps whatever went wrong beneath it."""


@pytest.mark.parametrize("terminal", [(), (RefundError,)])
def test_a_refusal_wrapped_in_the_functions_own_error_is_not_retried(
    settler: Settler, terminal: tuple[type[BaseException], ...]
) -> None:
    runs: list[int] = []

    @settler.operation(key="refund:{order}", principal="tenant:a", retry=FAST, terminal=terminal)
    def refund(order: str, depth: int) -> int:
        runs.append(depth)
        if depth == 0:
            return 0
        try:
            return refund(order, depth) + 1
        except Exception as exc:
            raise RefundError(f"refund of {order} failed") from exc

    with pytest.raises(RefundError):
        refund("A-4", 1)
    assert runs == [1]
    record = settler.get("refund:A-4")
    assert record is not None
    assert record.state is State.PROVISIONAL  # no definite failure: a retry would succeed


@pytest.mark.asyncio
async def test_an_async_refusal_replaced_by_another_error_is_not_retried(
    async_settler: AsyncSettler,
) -> None:
    runs: list[int] = []

    @async_settler.operation(key="refund:{order}", principal="tenant:a", retry=FAST)
    async def refund(order: str, depth: int) -> int:
        runs.append(depth)
        if depth == 0:
            return 0
        try:
            return await refund(order, depth) + 1
        except InvalidInput:
            raise RefundError(f"refund of {order} failed") from None

    with pytest.raises(RefundError):
        await refund("A-5", 1)
    assert runs == [1]
