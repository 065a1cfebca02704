"""The asyncio lane bounds its sends and reads by the connection's ``socket_timeout`` with one
timer per lane (settle/_runtime/deadlines.py), where redis-py arms an ``asyncio.timeout`` per
send and per read. What a caller relies on must not change: a reply that never comes ends in
redis-py's ``TimeoutError`` at the socket timeout, for a call alone and for every call of a
pipelined batch, on a closed connection; a cancellation from outside is still a cancellation;
and the timeout's own cancellation never leaks into the caller's next await.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from redis import exceptions as rx

from settle import AsyncSettler
from settle._runtime.deadlines import Deadlines
from tests.faults.servers import SOCKET_TIMEOUT, async_client, proxy_to
from tests.faults.tcp_proxy import FaultyProxy
from tests.stopwatch import Stopwatch

pytestmark = [pytest.mark.faults]


@dataclass
class Stalled:
    """The pipelined lane of a settler behind a proxy (``socket_timeout`` SOCKET_TIMEOUT),
    with one PING answered, and the replies of the next ten PINGs withheld."""

    proxy: FaultyProxy
    lane: Any

    async def answers(self) -> None:
        """The lane answers again (on a new connection where the timeout closed one)."""
        self.proxy.disarm()
        assert await self.lane.execute("PING") == b"PONG"


@pytest_asyncio.fixture
async def stalled(redis_url: str, namespace: str) -> AsyncIterator[Stalled]:
    proxy = proxy_to(redis_url)
    settler = AsyncSettler(async_client(proxy.port), namespace=namespace)
    await settler.check()
    try:
        assert await settler._runner._lane.execute("PING") == b"PONG"
        proxy.cut("PING", "stall", times=10)
        yield Stalled(proxy, settler._runner._lane)
    finally:
        proxy.close()
        await settler.aclose()


@pytest.mark.asyncio
async def test_a_withheld_reply_times_out_at_the_socket_timeout(stalled: Stalled) -> None:
    clock = Stopwatch()
    with pytest.raises(rx.TimeoutError, match=r"^Timeout reading from [^ ]+:[0-9]+$"):
        await stalled.lane.execute("PING")
    # At the socket timeout: not before it, and not a second after it on the time this test
    # was not kept waiting for a CPU (a loaded CI worker's wait is no part of the timeout).
    assert clock.elapsed() >= SOCKET_TIMEOUT * 0.9
    assert clock.unloaded() < SOCKET_TIMEOUT + 1.0
    assert stalled.proxy.fired == ["stall"]
    await asyncio.sleep(0)  # no cancellation left over for the caller's next await
    assert asyncio.current_task().cancelling() == 0  # nor counted on its task
    await stalled.answers()


@pytest.mark.asyncio
async def test_every_call_of_a_withheld_batch_times_out(stalled: Stalled) -> None:
    clock = Stopwatch()
    calls = [stalled.lane.execute("PING") for _ in range(4)]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    # Two socket timeouts (alone, then the batch), not four one after another: on the time
    # this test was not kept waiting for a CPU, which a loaded machine cannot stretch.
    assert clock.unloaded() < 2 * SOCKET_TIMEOUT + 1.0
    assert all(isinstance(o, rx.TimeoutError) for o in outcomes), outcomes
    assert all(str(o).startswith("Timeout reading from") for o in outcomes)
    await stalled.answers()


@pytest.mark.asyncio
async def test_a_cancellation_from_outside_stays_a_cancellation(stalled: Stalled) -> None:
    call = asyncio.ensure_future(stalled.lane.execute("PING"))
    await asyncio.sleep(SOCKET_TIMEOUT / 5)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await stalled.answers()


@pytest.mark.asyncio
async def test_a_watch_expires_as_asyncio_timeout_does() -> None:
    """One timer for many watches: each past its deadline cancels its own task only, the
    cancellation is taken back and reported as the timeout; a watch that ended in time never
    fires; a watch moved later (a maintenance notification relaxing a read) waits longer."""
    deadlines = Deadlines(asyncio.get_running_loop())
    outcomes: dict[str, str] = {}

    async def waits(name: str, seconds: float, sleep: float, moved_to: float | None) -> None:
        watch = deadlines.start(seconds)
        assert watch is not None
        if moved_to is not None:
            watch.reschedule(asyncio.get_running_loop().time() + moved_to)
        try:
            await asyncio.sleep(sleep)
        except asyncio.CancelledError as exc:
            outcomes[name] = "timeout" if deadlines.finish(watch, exc) else "cancelled"
            return
        deadlines.finish(watch)
        outcomes[name] = "done"

    await asyncio.gather(
        waits("late", 0.05, 1.0, None),
        waits("in time", 0.5, 0.01, None),
        waits("relaxed", 0.05, 0.2, 1.0),
        waits("late too", 0.1, 1.0, None),
    )
    assert outcomes == {
        "late": "timeout",
        "in time": "done",
        "relaxed": "done",
        "late too": "timeout",
    }
    assert deadlines.start(None) is None  # no socket_timeout: unbounded, as redis-py
