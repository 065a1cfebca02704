"""An attempt settle stopped (its ``timeout``) is uncertain, whatever ``terminal`` lists.

settle stops an async attempt at its timeout with a ``TimeoutError`` (a sync one through
``Attempt.check()``). With ``terminal=(Exception,)``, ``(OSError,)`` or ``(TimeoutError,)``
that error was taken for the function's definite answer: the operation was stored
``failed`` and every later call got ``OperationFailed``, although the charge may have gone
through (SPEC 6: a timeout marks the attempt provisional). The function's own terminal
error is still stored, also when it comes after the deadline.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import tenacity

from settle import AsyncSettler, Attempt, OperationFailed, Settler
from settle.models import State

ONCE = tenacity.Retrying(stop=tenacity.stop_after_attempt(1))


class Declined(Exception):
    pass


@pytest.mark.asyncio
@pytest.mark.parametrize("terminal", [Exception, OSError, TimeoutError])
async def test_an_async_timeout_is_provisional_whatever_terminal_lists(
    async_settler: AsyncSettler, terminal: type[BaseException]
) -> None:
    runs: list[int] = []

    @async_settler.operation(
        key="charge:{order}", principal="tenant:a", timeout=0.1, retry=ONCE, terminal=terminal
    )
    async def charge(order: str) -> int:
        runs.append(1)
        if len(runs) == 1:
            await asyncio.sleep(5)  # the provider answers too late
        return len(runs)

    with pytest.raises(TimeoutError):
        await charge("o-1")
    record = await async_settler.get("charge:o-1")
    assert record is not None
    assert (record.state, record.reason) == (State.PROVISIONAL, "timeout")
    assert await charge("o-1") == 2  # the retry runs it again, under a new generation


@pytest.mark.parametrize("terminal", [Exception, TimeoutError])
def test_a_sync_check_past_the_deadline_is_provisional_whatever_terminal_lists(
    settler: Settler, terminal: type[BaseException]
) -> None:
    @settler.operation(
        key="charge:{order}", principal="tenant:a", timeout=0.05, retry=ONCE, terminal=terminal
    )
    def charge(order: str, attempt: Attempt = Attempt.INJECTED) -> int:
        time.sleep(0.1)
        attempt.check()  # the timeout passed: settle's signal to stop
        return 1

    with pytest.raises(TimeoutError):
        charge("o-1")
    record = settler.get("charge:o-1")
    assert record is not None
    assert (record.state, record.reason) == (State.PROVISIONAL, "timeout")


def test_the_functions_own_terminal_error_after_the_deadline_is_stored(settler: Settler) -> None:
    @settler.operation(
        key="charge:{order}", principal="tenant:a", timeout=0.05, retry=ONCE, terminal=Exception
    )
    def charge(order: str) -> int:
        time.sleep(0.1)
        raise Declined("card declined")

    with pytest.raises(OperationFailed):
        charge("o-1")
    record = settler.get("charge:o-1")
    assert record is not None
    assert record.state is State.FAILED
