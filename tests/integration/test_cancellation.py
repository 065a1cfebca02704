"""A cancelled task stops: no settle call swallows the cancellation.

On Python 3.11 redis-py bounds each send with ``asyncio.wait_for``, which returns normally
when the task is cancelled just after the send finished, so a task that called Redis in a
loop ran on after most cancellations (settle/_runtime/cancel_safe.py). Each test cancels a
task that calls settle in a loop, at a spread of moments, and requires that it end every
time; on Python 3.12+ they hold the same behaviour."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
from typing import Any

import pytest
import redis.asyncio as aredis
from redis import exceptions as rx
from redis.asyncio.connection import Connection

from settle import AsyncSettler
from settle.embedded import EmbeddedRedis
from tests.cancelling import ENDS_WITHIN, ROUNDS, lost_cancellations

pytestmark = pytest.mark.asyncio


async def test_a_task_calling_the_settler_stops_when_cancelled(
    async_settler: AsyncSettler,
) -> None:
    n = itertools.count()

    @async_settler.operation(key="order:{i}", principal="tenant:a")
    async def charge(i: int) -> dict[str, int]:
        return {"i": i}

    await charge(-1)
    # a replay (the read head), a new operation (reserve + complete), a plain redis-py
    # command (the quarantine's XRANGE, not the script lane)
    assert await lost_cancellations(lambda: charge(-1)) == 0
    assert await lost_cancellations(lambda: charge(next(n))) == 0
    assert await lost_cancellations(lambda: async_settler.quarantine.list(limit=5)) == 0


async def test_asyncio_timeout_around_settle_calls_fires(async_settler: AsyncSettler) -> None:
    n = itertools.count()

    @async_settler.operation(key="order:{i}", principal="tenant:a")
    async def charge(i: int) -> dict[str, int]:
        return {"i": i}

    async def charge_until_timeout() -> None:
        loop = asyncio.get_running_loop()
        until = loop.time() + ENDS_WITHIN
        async with asyncio.timeout(0.003):
            while loop.time() < until:
                await charge(next(n))

    for _ in range(ROUNDS):
        with pytest.raises(TimeoutError):
            await charge_until_timeout()


async def test_a_settler_on_the_users_own_client_stops_when_cancelled(
    redis_url: str, namespace: str
) -> None:
    client = aredis.Redis.from_url(redis_url, socket_timeout=5.0)
    await client.get("warm")  # a connection made before settle saw the client
    settler = AsyncSettler(client, namespace=namespace, shards=4)
    try:
        assert await lost_cancellations(lambda: settler.get("op:none")) == 0
        # the client's other commands keep cancellations too
        assert await lost_cancellations(lambda: client.get("k")) == 0
    finally:
        await settler.aclose()
        await client.aclose()


class _OwnSend(Connection):
    """A user's connection class with a send of its own."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        self.sent = getattr(self, "sent", 0) + 1
        await super().send_packed_command(command, check_health)


async def test_a_connection_class_with_its_own_send_keeps_it(
    redis_url: str, namespace: str
) -> None:
    pool = aredis.ConnectionPool.from_url(redis_url, connection_class=_OwnSend)
    client = aredis.Redis(connection_pool=pool)
    settler = AsyncSettler(client, namespace=namespace, shards=4)
    try:
        assert pool.connection_class is _OwnSend
        await settler.get("op:none")
        conn = await pool.get_connection()
        try:
            assert type(conn) is _OwnSend
        finally:
            await pool.release(conn)
    finally:
        await settler.aclose()
        await client.aclose()
        await pool.aclose()


def _fate(exc: BaseException | None, conn: Connection) -> tuple[object, ...]:
    if exc is None:
        return ("no error", conn.is_connected)
    return (type(exc), str(exc), exc.__suppress_context__, conn.is_connected)


async def _send_to_a_stopped_server(conn: Connection, cancel: bool) -> Any:
    """Write 64 MiB to a server that reads nothing (SIGSTOP): the send blocks until its
    socket_timeout, or until the task is cancelled."""
    big = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$67108864\r\n" + b"x" * (64 << 20) + b"\r\n"
    send = asyncio.create_task(conn.send_packed_command(big, check_health=False))
    if cancel:
        await asyncio.sleep(0.1)
        send.cancel()
    try:
        await send
    except BaseException as exc:
        return _fate(exc, conn)
    return _fate(None, conn)


@pytest.mark.parametrize("cancel", [False, True], ids=["send timeout", "cancelled mid-write"])
async def test_a_send_that_times_out_or_is_cancelled_ends_as_redis_pys_own(
    async_settler: AsyncSettler, cancel: bool
) -> None:
    await async_settler.get("op:none")
    ours = async_settler._runner.client.connection_pool.connection_class
    with EmbeddedRedis() as server:
        assert server.process is not None
        conns = [
            cls(host="127.0.0.1", port=server.port, socket_timeout=0.5)
            for cls in (ours, Connection)
        ]
        for conn in conns:
            await conn.connect()
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            got, theirs = [await _send_to_a_stopped_server(conn, cancel) for conn in conns]
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
            for conn in conns:
                await conn.disconnect()
    assert got == theirs
    if cancel:
        assert got == (asyncio.CancelledError, "", False, False)
    else:
        assert got == (rx.TimeoutError, "Timeout writing to socket", True, False)
