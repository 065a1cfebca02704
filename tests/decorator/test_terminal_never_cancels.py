"""A cancellation, an interrupt or an exit is never a definite answer, whatever ``terminal``
lists (``BaseException``, ``KeyboardInterrupt``, ``asyncio.CancelledError``).

Before, ``terminal=(BaseException,)`` (a catch-all "every error is final") stored a Ctrl-C
or a caller's ``task.cancel()`` with ``fail``: the operation never ran again under its id,
every later call raised ``OperationFailed`` (``KeyboardInterrupt``), and the cancelled
caller itself got ``OperationFailed`` instead of its ``CancelledError``. The attempt is
marked provisional (``cancelled``) and the caller gets the cancellation, as without
``terminal`` (docs/outbound-calls.md, "What happens to each outcome").
"""

from __future__ import annotations

import asyncio

import pytest

from settle import AsyncSettler, Settler, State


class CardDeclined(Exception):
    pass


@pytest.mark.parametrize("terminal", [(BaseException,), (CardDeclined, KeyboardInterrupt)])
def test_an_interrupt_is_not_stored_as_a_failure(
    settler: Settler, terminal: tuple[type[BaseException], ...]
) -> None:
    runs: list[str] = []

    @settler.operation(key="charge:{order}", principal="tenant:a", terminal=terminal)
    def charge(order: str) -> str:
        runs.append(order)
        if len(runs) == 1:
            raise KeyboardInterrupt  # the operator's Ctrl-C, mid-call
        return "ch_1"

    with pytest.raises(KeyboardInterrupt):
        charge("A-1")
    record = settler.get("charge:A-1")
    assert record is not None
    assert record.state is State.PROVISIONAL
    assert charge("A-1") == "ch_1"  # the next call runs it
    assert runs == ["A-1", "A-1"]


@pytest.mark.asyncio
async def test_a_cancelled_caller_gets_its_cancellation_not_a_stored_failure(
    async_settler: AsyncSettler,
) -> None:
    started = asyncio.Event()

    @async_settler.operation(key="charge:{order}", principal="tenant:a", terminal=(BaseException,))
    async def charge(order: str) -> str:
        started.set()
        await asyncio.sleep(30)
        return "ch_1"

    task = asyncio.create_task(charge("A-2"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    record = await async_settler.get("charge:A-2")
    assert record is not None
    assert record.state is State.PROVISIONAL
