"""A decline raised inside a ``TaskGroup`` reaches the decorated function's caller as an
``ExceptionGroup``. It was taken as an uncertain outcome: the attempt marked provisional and
the charge retried, its definite answer never stored. A group whose every exception is
``terminal`` is a definite answer now (its one exception is stored, or the group); a group
with any other exception in it stays uncertain."""

from __future__ import annotations

import asyncio

import pytest
import tenacity

from settle import AsyncSettler, Settler
from settle.errors import OperationFailed
from settle.models import State


class Declined(Exception):
    pass


RETRY = tenacity.Retrying(stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_none())
ARETRY = tenacity.AsyncRetrying(stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_none())


@pytest.mark.asyncio
async def test_a_decline_inside_a_task_group_is_stored_and_replayed(
    async_settler: AsyncSettler,
) -> None:
    calls: list[str] = []

    @async_settler.operation(
        key="charge:{order_id}", principal="tenant:a", terminal=(Declined,), retry=ARETRY
    )
    async def charge(order_id: str) -> str:
        calls.append(order_id)

        async def authorize() -> None:
            raise Declined("card declined: insufficient funds")

        async with asyncio.TaskGroup() as group:
            group.create_task(authorize())
        return "charged"

    with pytest.raises(OperationFailed) as first:
        await charge("o-1")
    with pytest.raises(OperationFailed) as replayed:
        await charge("o-1")
    assert calls == ["o-1"]
    record = await async_settler.get("charge:o-1")
    assert record is not None
    assert record.state is State.FAILED
    for raised in (first.value, replayed.value):
        assert raised.failure.error_type.endswith("Declined")
        assert raised.failure.message == "card declined: insufficient funds"


def test_a_group_with_another_exception_in_it_stays_uncertain(settler: Settler) -> None:
    calls: list[str] = []

    @settler.operation(
        key="charge:{order_id}", principal="tenant:a", terminal=(Declined,), retry=RETRY
    )
    def charge(order_id: str) -> str:
        calls.append(order_id)
        raise ExceptionGroup("charge", [Declined("declined"), ConnectionError("reset")])

    with pytest.raises(ExceptionGroup):
        charge("o-2")
    assert calls == ["o-2"] * 3  # retried: one part of it may have happened
    record = settler.get("charge:o-2")
    assert record is not None
    assert record.state is State.PROVISIONAL


def test_a_group_of_declines_is_stored_as_the_group(settler: Settler) -> None:
    calls: list[str] = []

    @settler.operation(
        key="charge:{order_id}", principal="tenant:a", terminal=(Declined,), retry=RETRY
    )
    def charge(order_id: str) -> str:
        calls.append(order_id)
        raise ExceptionGroup("charge", [Declined("first card"), Declined("second card")])

    with pytest.raises(OperationFailed) as failed:
        charge("o-3")
    with pytest.raises(OperationFailed):
        charge("o-3")
    assert calls == ["o-3"]
    assert failed.value.failure.error_type.endswith("ExceptionGroup")
