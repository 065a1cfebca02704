"""``SingleFlight``: concurrent callers of one check share one run of it, in tasks (the
asyncio runtime) and in threads (the sync runtime, generated from it). A failure reaches
every waiter as its own copy of the typed error, the next call runs the check again, and a
cancelled leader leaves its waiters to run it themselves. (The burst on a real server is in
tests/faults/test_faults_burst.py.)"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from settle._runtime._async import SingleFlight as AsyncSingleFlight
from settle._runtime._sync import SingleFlight
from settle.errors import ConfigurationError


@pytest.mark.asyncio
async def test_tasks_share_one_run_and_its_result() -> None:
    flight, runs = AsyncSingleFlight(), []

    async def check() -> str:
        runs.append(1)
        await asyncio.sleep(0.05)
        return "checked"

    results = await asyncio.gather(*(flight.run("k", check) for _ in range(300)))
    assert results == ["checked"] * 300
    assert len(runs) == 1
    assert await flight.run("k", check) == "checked"  # a later call runs it again
    assert len(runs) == 2


@pytest.mark.asyncio
async def test_a_failure_reaches_every_waiter_as_its_own_copy() -> None:
    flight, runs = AsyncSingleFlight(), []

    async def check() -> None:
        runs.append(1)
        await asyncio.sleep(0.05)
        raise ConfigurationError("refused", operation_id=None)

    async def one(i: int) -> ConfigurationError:
        try:
            await flight.run("k", check)
        except ConfigurationError as exc:
            exc.operation_id = exc.operation_id or f"op-{i}"  # as ``naming`` does
            return exc
        raise AssertionError("no error")

    errors = await asyncio.gather(*(one(i) for i in range(50)))
    assert len(runs) == 1
    assert len({id(e) for e in errors}) == 50  # each caller's own object
    assert sorted(e.operation_id or "" for e in errors) == sorted(f"op-{i}" for i in range(50))
    assert all(str(e) == "refused" for e in errors)


@pytest.mark.asyncio
async def test_a_cancelled_leader_does_not_strand_its_waiters() -> None:
    flight, runs = AsyncSingleFlight(), []
    started = asyncio.Event()

    async def check() -> str:
        runs.append(1)
        started.set()
        await asyncio.sleep(0.2 if len(runs) == 1 else 0)
        return "checked"

    leader = asyncio.create_task(flight.run("k", check))
    await started.wait()
    waiters = [asyncio.create_task(flight.run("k", check)) for _ in range(20)]
    await asyncio.sleep(0.01)
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    assert await asyncio.wait_for(asyncio.gather(*waiters), 5) == ["checked"] * 20
    assert len(runs) == 2  # one waiter ran it again, the others shared that run


@pytest.mark.asyncio
async def test_a_cancelled_waiter_leaves_the_others_alone() -> None:
    flight = AsyncSingleFlight()

    async def check() -> str:
        await asyncio.sleep(0.1)
        return "checked"

    tasks = [asyncio.create_task(flight.run("k", check)) for _ in range(10)]
    await asyncio.sleep(0.01)
    tasks[3].cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(done[3], asyncio.CancelledError)
    assert [d for i, d in enumerate(done) if i != 3] == ["checked"] * 9


def test_threads_share_one_run_and_a_failure() -> None:
    flight, runs, lock = SingleFlight(), [], threading.Lock()
    go = threading.Event()
    out: list[object] = []

    def check() -> str:
        with lock:
            runs.append(1)
        # The run lasts until the 59 other threads wait for it (CPython's Event keeps its
        # waiters in its Condition): with a fixed 0.1 s, a thread a loaded machine woke later
        # than that found no run under way and began one of its own.
        waiting = flight._flights["k"].done._cond._waiters  # type: ignore[attr-defined]
        deadline = time.monotonic() + 30
        while len(waiting) < 59:
            assert time.monotonic() < deadline, f"only {len(waiting)} threads wait for the run"
            time.sleep(0.001)
        if len(runs) == 2:
            raise ConfigurationError("refused")
        return "checked"

    def one() -> None:
        go.wait()
        try:
            found: object = flight.run("k", check)
        except ConfigurationError as exc:
            found = exc
        with lock:
            out.append(found)

    for round_ in (1, 2):
        out.clear()
        threads = [threading.Thread(target=one) for _ in range(60)]
        for thread in threads:
            thread.start()
        go.set()
        for thread in threads:
            thread.join(10)
        go.clear()
        assert len(runs) == round_  # one run per burst
        if round_ == 1:
            assert out == ["checked"] * 60
        else:
            assert all(isinstance(e, ConfigurationError) for e in out)
            assert len({id(e) for e in out}) == 60
