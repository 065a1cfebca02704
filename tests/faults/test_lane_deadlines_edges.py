"""The asyncio lane's deadlines (settle/_runtime/deadlines.py) at their edges, where a hand-made
timer could differ from the ``asyncio.timeout`` per send and per read it replaced: a send
stalled on a full socket buffer, replies that each come within the timeout but together take
longer, a read that a maintenance notification relaxes, a caller's own cancellation at the
very moment of the deadline, an application's connection class, and what is left behind
after many calls and timeouts.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import Any

import pytest
import redis.asyncio as aredis
from redis import exceptions as rx
from redis.asyncio.connection import Connection, ConnectionPool
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from settle import AsyncSettler
from settle._runtime.deadlines import Deadlines
from settle.embedded import EmbeddedRedis
from tests.faults.servers import SOCKET_TIMEOUT, async_client, proxy_to
from tests.stopwatch import Stopwatch

pytestmark = [pytest.mark.faults, pytest.mark.asyncio]


def _not_cancelled() -> None:
    """No cancellation of the deadline's is left counted on the caller's task (a caller's
    own ``asyncio.timeout`` further on would take it for its own)."""
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0


#: A stalled send's timeout. On Python 3.13.0 here redis-py's own send of 64 MiB to a
#: stopped server returns in ~50 ms (the transport buffers it all; ``drain`` does not wait),
#: so the read times out instead, on ``main`` as on the lane.
_STALLED_SEND = (
    r"^Timeout writing to socket$"
    if sys.version_info < (3, 12)
    else r"^Timeout (writing to socket|reading from [^ ]+)$"
)


async def test_a_stalled_send_times_out_with_redis_pys_text(namespace: str) -> None:
    """64 MiB to a server that reads nothing (SIGSTOP): the send waits on a full socket
    buffer, and ends at the socket timeout as redis-py's own send does."""
    with EmbeddedRedis() as server:
        assert server.process is not None
        settler = AsyncSettler(async_client(server.port), namespace=namespace)
        try:
            lane = settler._runner._lane
            assert await lane.execute("PING") == b"PONG"
            # past the PING's deadline: the lane's timer is then armed by the send alone
            await asyncio.sleep(SOCKET_TIMEOUT * 1.5)
            os.kill(server.process.pid, signal.SIGSTOP)
            try:
                payload = b"x" * (64 << 20)  # made before the clock starts
                clock = Stopwatch()
                big = lane.execute("PING", payload)
                # Ended by the socket timeout: redis-py's TimeoutError, with its text. The
                # wait_for only keeps a hang from lasting for ever, and would end it with
                # asyncio's TimeoutError (not redis-py's): a bound of a few socket timeouts
                # was beaten by a loaded machine (the send copies the 64 MiB twice, 0.23 s
                # of CPU here, 2-4.6 s of wall time beside four busy loops).
                with pytest.raises(rx.TimeoutError, match=_STALLED_SEND):
                    await asyncio.wait_for(big, SOCKET_TIMEOUT * 60)
                # Not before the socket timeout; and no longer than it and the send's own
                # work (0.6 s in all beside CI's load), on the time this test was not kept
                # waiting for a CPU: the bound it had on wall time, which a timer 3x late
                # passes by (at 4 socket timeouts, it passed this test).
                assert clock.elapsed() >= SOCKET_TIMEOUT * 0.9
                assert clock.unloaded() < SOCKET_TIMEOUT + 1.0
                _not_cancelled()
            finally:
                os.kill(server.process.pid, signal.SIGCONT)
            assert await lane.execute("PING") == b"PONG"
        finally:
            await settler.aclose()


async def test_each_reply_of_a_batch_has_its_own_socket_timeout(
    redis_url: str, namespace: str
) -> None:
    """Four blocking pops of 0.2 s sent together: their replies come 0.2 s apart, 0.8 s in
    all, longer than the socket timeout (0.5 s) but each within it of the one before, as
    redis-py bounds each read by its own timeout."""
    proxy = proxy_to(redis_url)
    settler = AsyncSettler(async_client(proxy.port), namespace=namespace)
    try:
        lane = settler._runner._lane
        key = f"{namespace}:never-pushed"
        started = time.monotonic()
        calls = [lane.execute("BLPOP", key, 0.2) for _ in range(5)]  # one alone, a batch
        assert await asyncio.gather(*calls) == [None] * 5
        assert time.monotonic() - started > SOCKET_TIMEOUT
    finally:
        proxy.close()
        await settler.aclose()


async def test_a_relaxed_read_waits_for_the_relaxed_timeout(redis_url: str, namespace: str) -> None:
    """A maintenance notification relaxes the read in flight (redis-py's
    ``update_current_socket_timeout``, which reschedules the read's timeout): the withheld
    reply then times out at the relaxed timeout, not at the socket timeout."""
    proxy = proxy_to(redis_url)
    client = async_client(proxy.port)
    settler = AsyncSettler(client, namespace=namespace)
    try:
        lane = settler._runner._lane
        assert await lane.execute("PING") == b"PONG"
        proxy.cut("PING", "stall")
        call = asyncio.ensure_future(lane.execute("PING"))
        await asyncio.sleep(SOCKET_TIMEOUT / 5)
        (conn,) = client.connection_pool._in_use_connections
        conn.update_current_socket_timeout(relaxed_timeout=SOCKET_TIMEOUT * 3)
        started = time.monotonic()
        with pytest.raises(rx.TimeoutError, match=r"^Timeout reading from"):
            await call
        assert time.monotonic() - started >= SOCKET_TIMEOUT * 2.5
    finally:
        proxy.close()
        await settler.aclose()


async def test_a_read_relaxed_then_restored_times_out_at_the_socket_timeout(
    redis_url: str, namespace: str
) -> None:
    """The notification's end puts the socket timeout back on the read in flight (redis-py's
    ``update_current_socket_timeout(-1)``): the withheld reply times out a socket timeout
    after that, long before the relaxed deadline."""
    proxy = proxy_to(redis_url)
    client = async_client(proxy.port)
    settler = AsyncSettler(client, namespace=namespace)
    try:
        lane = settler._runner._lane
        assert await lane.execute("PING") == b"PONG"
        proxy.cut("PING", "stall")
        call = asyncio.ensure_future(lane.execute("PING"))
        await asyncio.sleep(SOCKET_TIMEOUT / 5)
        (conn,) = client.connection_pool._in_use_connections
        conn.update_current_socket_timeout(relaxed_timeout=SOCKET_TIMEOUT * 10)
        await asyncio.sleep(SOCKET_TIMEOUT * 1.5)  # past the deadline it had before
        assert not call.done()
        conn.update_current_socket_timeout(-1)
        clock = Stopwatch()
        with pytest.raises(rx.TimeoutError, match=r"^Timeout reading from"):
            # A hang's guard only: a wait_for due as the read's deadline is overdue on a
            # loaded machine can cancel the task beside it, and the timeout is then asyncio's.
            await asyncio.wait_for(call, SOCKET_TIMEOUT * 60)
        # A socket timeout after the restore, not the relaxed deadline (4 s later), on the
        # time this test was not kept waiting for a CPU.
        assert clock.unloaded() < SOCKET_TIMEOUT + 1.0
    finally:
        proxy.close()
        await settler.aclose()


async def test_a_cancellation_at_the_deadline_stays_a_cancellation() -> None:
    """Someone else cancels the task at the very moment its deadline passes (a caller's own
    ``asyncio.timeout`` of the same length): the cancellation is theirs, passed on, and not
    turned into the lane's timeout, as nested ``asyncio.timeout`` contexts do."""
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop)
    outcome: list[str] = []

    async def waits() -> None:
        watch = deadlines.start(0.05)
        assert watch is not None
        loop.call_at(watch.deadline, task.cancel)  # due on the same turn as the lane's timer
        try:
            await asyncio.sleep(1.0)
        except asyncio.CancelledError as exc:
            outcome.append("timeout" if deadlines.finish(watch, exc) else "cancelled")
            raise
        deadlines.finish(watch)
        outcome.append("done")

    task = asyncio.ensure_future(waits())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert outcome == ["cancelled"]
    assert task.cancelling() == 1  # the outside cancellation alone is left counted


async def test_a_call_in_a_cancelled_tasks_cleanup_still_times_out(
    redis_url: str, namespace: str
) -> None:
    """A task already cancelled calls settle while it cleans up (``except CancelledError:``
    then a release): a withheld reply still ends in the lane's timeout, and the task's own
    cancellation stays counted, as an ``asyncio.timeout`` entered there behaves."""
    proxy = proxy_to(redis_url)
    settler = AsyncSettler(async_client(proxy.port), namespace=namespace)
    seen: list[object] = []

    async def cleans_up() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            assert task is not None
            try:
                await lane.execute("PING")
            except rx.TimeoutError as exc:
                seen.append(type(exc))
            seen.append(task.cancelling())
            raise

    try:
        lane = settler._runner._lane
        assert await lane.execute("PING") == b"PONG"
        proxy.cut("PING", "stall")
        cleaning = asyncio.ensure_future(cleans_up())
        await asyncio.sleep(0.05)
        cleaning.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(cleaning, SOCKET_TIMEOUT * 4)
        assert seen == [rx.TimeoutError, 1]
    finally:
        proxy.close()
        await settler.aclose()


class _OwnSend(Connection):
    """An application's connection that sends its own way (and counts its sends)."""

    used = 0

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        _OwnSend.used += 1  # (settle may subclass it on Python 3.11: cancel_safe.py)
        await super().send_packed_command(command, check_health)


class _OwnRead(Connection):
    """An application's connection that reads its own way (and counts its reads, which
    redis-py's own code calls with no timeout of the caller's)."""

    used = 0

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        assert kwargs.get("timeout") is None, kwargs
        _OwnRead.used += 1
        return await super().read_response(*args, **kwargs)


@pytest.mark.parametrize("own", [_OwnSend, _OwnRead], ids=["own send", "own read"])
async def test_an_application_connection_class_keeps_its_own_timeouts(
    redis_url: str, namespace: str, own: type[Any]
) -> None:
    proxy = proxy_to(redis_url)
    pool = ConnectionPool(port=proxy.port, socket_timeout=SOCKET_TIMEOUT, connection_class=own)
    client = aredis.Redis(connection_pool=pool, retry=Retry(NoBackoff(), 0))
    settler = AsyncSettler(client, namespace=namespace)
    try:
        lane = settler._runner._lane
        assert await lane.execute("PING") == b"PONG"  # (and the settler's first checks)
        own.used = 0
        assert await lane.execute("PING") == b"PONG"
        assert own.used == 1  # its own send or read served the lane's call
        proxy.cut("PING", "stall")
        with pytest.raises(rx.TimeoutError, match=r"^Timeout reading from"):
            await lane.execute("PING")
        _not_cancelled()
    finally:
        proxy.close()
        await settler.aclose()
        await client.aclose()


async def test_no_watch_is_left_after_many_calls_and_timeouts(
    redis_url: str, namespace: str
) -> None:
    """Calls alone, batches finishing in any order, timeouts: once all have ended the lane
    watches nothing, and holds one timer at most."""
    proxy = proxy_to(redis_url)
    # 2 s, not the usual 0.5: 1,500 calls through the proxy before the cut, and one of them
    # once waited longer than 0.5 s for a CPU beside busy CI workers (a timeout, no fault).
    settler = AsyncSettler(async_client(proxy.port, socket_timeout=2.0), namespace=namespace)
    try:
        lane = settler._runner._lane
        for _ in range(300):
            assert await lane.execute("PING") == b"PONG"
        for _ in range(30):
            await asyncio.gather(*(lane.execute("PING") for _ in range(40)))
        assert len(lane._deadlines._open) == 0  # each batch's watch ended with it
        proxy.cut("PING", "stall", times=3)
        outcomes = await asyncio.gather(
            *(lane.execute("PING") for _ in range(6)), return_exceptions=True
        )
        assert any(isinstance(o, rx.TimeoutError) for o in outcomes), outcomes
        _not_cancelled()
        proxy.disarm()
        assert await lane.execute("PING") == b"PONG"
        assert len(lane._deadlines._open) == 0
    finally:
        proxy.close()
        await settler.aclose()


async def test_tiny_timeouts_never_hand_a_reply_to_another_call(namespace: str) -> None:
    """Socket timeouts of 0.05 to 1 ms against a real server: deadlines fire on the same turns as
    replies arrive, alone and in batches. Every call gets its own reply or redis-py's
    TimeoutError (never another call's reply, never a cancellation), and nothing is left
    counted on the caller's task or watched on the lane."""
    with EmbeddedRedis() as server:
        client = aredis.Redis(port=server.port, retry=Retry(NoBackoff(), 0), socket_timeout=1)
        settler = AsyncSettler(client, namespace=namespace)
        try:
            lane = settler._runner._lane
            assert await lane.execute("PING") == b"PONG"
            pool = client.connection_pool
            timeouts = replies = 0
            for round_ in range(300):
                tiny = (0.00005, 0.0001, 0.0002, 0.0005, 0.001)[round_ % 5]
                pool.connection_kwargs["socket_timeout"] = tiny
                for conn in [*pool._available_connections, *pool._in_use_connections]:
                    conn.socket_timeout = tiny
                sent = [f"{round_}:{n}".encode() for n in range(round_ % 7 + 1)]
                outcomes = await asyncio.gather(
                    *(lane.execute("ECHO", value) for value in sent), return_exceptions=True
                )
                for value, outcome in zip(sent, outcomes, strict=True):
                    if isinstance(outcome, rx.TimeoutError | rx.ConnectionError):
                        timeouts += 1
                    else:
                        assert outcome == value
                        replies += 1
                _not_cancelled()
            assert len(lane._deadlines._open) == 0
            assert timeouts + replies == sum(n % 7 + 1 for n in range(300))
        finally:
            await settler.aclose()
            await client.aclose()
