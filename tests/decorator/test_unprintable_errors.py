"""An exception whose ``__str__`` raises is still the function's answer.

A terminal exception was stored with ``str(error)``; when that raised, the error escaped the
settlement (a ``RuntimeError`` out of the decorator), the record stayed pending under a live
lease, every call in the meantime got ``OperationInProgress``, and after the lease the
function ran again: a definite failure (a declined charge) was retried as if unknown.
"""

from __future__ import annotations

import pytest
import tenacity

from settle import AsyncSettler, OperationFailed, Settler
from settle.models import State

ONCE = tenacity.Retrying(stop=tenacity.stop_after_attempt(1))


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("cannot print this error")


def test_a_terminal_error_that_cannot_be_printed_is_stored_and_replayed(
    settler: Settler,
) -> None:
    runs: list[int] = []

    @settler.operation(
        key="charge:{order}", principal="tenant:a", retry=ONCE, terminal=(Exception,)
    )
    def charge(order: str) -> int:
        runs.append(1)
        raise Unprintable()

    with pytest.raises(OperationFailed) as first:
        charge("o-1")
    with pytest.raises(OperationFailed) as replayed:
        charge("o-1")
    assert runs == [1]
    record = settler.get("charge:o-1")
    assert record is not None
    assert record.state is State.FAILED
    for raised in (first.value, replayed.value):
        assert raised.failure is not None
        assert raised.failure.error_type.endswith("Unprintable")
        assert "Unprintable" in raised.failure.message


@pytest.mark.asyncio
async def test_an_async_terminal_error_that_cannot_be_printed_is_stored_and_replayed(
    async_settler: AsyncSettler,
) -> None:
    runs: list[int] = []

    @async_settler.operation(
        key="charge:{order}", principal="tenant:a", retry=ONCE, terminal=(Unprintable,)
    )
    async def charge(order: str) -> int:
        runs.append(1)
        raise Unprintable()

    with pytest.raises(OperationFailed):
        await charge("o-1")
    with pytest.raises(OperationFailed):
        await charge("o-1")
    assert runs == [1]
    record = await async_settler.get("charge:o-1")
    assert record is not None
    assert record.state is State.FAILED


def test_fail_with_an_unprintable_error_settles(settler: Settler) -> None:
    r = settler.reserve("op-1", {"a": 1}, principal="tenant:a", lease=30.0)
    settlement = settler.fail(r.reservation, Unprintable())
    assert settlement.record is not None
    assert settlement.record.state is State.FAILED


def test_an_unprintable_error_that_is_not_terminal_leaves_the_attempt_provisional(
    settler: Settler,
) -> None:
    @settler.operation(key="charge:{order}", principal="tenant:a", retry=ONCE)
    def charge(order: str) -> int:
        raise Unprintable()

    with pytest.raises(Unprintable):
        charge("o-1")
    record = settler.get("charge:o-1")
    assert record is not None
    assert record.state is State.PROVISIONAL
