"""The runner's own connections to a standalone server (``_Lane`` in settle/_runtime): script
calls skip redis-py's per-command machinery and keep the connections they used. What that
must not cost a user, on a real server:

- a kept connection the server closed is replaced before the call is sent (sync; on
  asyncio the first try fails and is repeated, as with redis-py's own pool);
- a reply never read whole (a cancelled task) never reaches the next call;
- a forked process never shares its parent's sockets;
- an application's client, a ``BlockingConnectionPool`` included, keeps all its connections;
- closing the settler gives every connection back.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import uuid
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from structlog.testing import capture_logs

from settle import AsyncSettler, Reserved, Settler, State

pytestmark = [pytest.mark.faults]

REQUEST = {"amount": 1250}


def _kill_normal_clients(url: str) -> None:
    admin = redis.Redis.from_url(url)
    try:
        admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    finally:
        admin.close()


@pytest.mark.parametrize("closed_by", ["server", "application"])
def test_a_kept_connection_closed_meanwhile_is_replaced_without_a_retry(
    redis_url: str, namespace: str, closed_by: str
) -> None:
    settler = Settler.from_url(redis_url, namespace=namespace)
    try:
        first = settler.reserve("op-1", REQUEST, principal="p")
        assert isinstance(first, Reserved)
        if closed_by == "server":
            _kill_normal_clients(redis_url)
        else:
            settler.client.connection_pool.disconnect()
        with capture_logs() as logs:
            settled = settler.complete(first.reservation, {"ok": True})
        assert settled.record.state is State.COMPLETED
        assert [e for e in logs if e["event"] == "settle.backend.retrying"] == []
    finally:
        settler.close()


@pytest.mark.asyncio
async def test_async_kept_connection_the_server_closed_is_replaced(
    redis_url: str, namespace: str
) -> None:
    """On asyncio a socket's end is seen only once the event loop has read it, which it has
    not when the next call comes at once: that call's first try fails and is repeated (as
    redis-py's own pool does), and the call settles."""
    settler = AsyncSettler.from_url(redis_url, namespace=namespace)
    try:
        first = await settler.reserve("op-1", REQUEST, principal="p")
        assert isinstance(first, Reserved)
        _kill_normal_clients(redis_url)
        settled = await settler.complete(first.reservation, {"ok": True})
        assert settled.record.state is State.COMPLETED
        assert settled.verdict.value in {"accepted", "absorbed"}
        record = await settler.get("op-1")
        assert record is not None
        assert record.version == 2
    finally:
        await settler.aclose()


@pytest.mark.asyncio
async def test_a_cancelled_call_leaves_no_reply_for_the_next_one(
    redis_url: str, namespace: str
) -> None:
    settler = AsyncSettler.from_url(redis_url, namespace=namespace)
    admin = redis.Redis.from_url(redis_url)
    try:
        await settler.reserve("warm-up", REQUEST, principal="p")  # one kept connection
        admin.execute_command("CLIENT", "PAUSE", 5000, "WRITE")  # the script's reply waits
        task = asyncio.create_task(settler.reserve("op-a", REQUEST, principal="p"))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        admin.execute_command("CLIENT", "UNPAUSE")
        got = await settler.reserve("op-b", REQUEST, principal="p")
        assert isinstance(got, Reserved)
        assert got.reservation.operation_id == "op-b"
        record = await settler.get("op-b")
        assert record is not None
        assert record.attempt_id == got.reservation.attempt_id
        assert record.generation == got.reservation.generation
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
        admin.close()
        await settler.aclose()


def _child(ids: list[str], out: Any) -> None:
    settler = _SHARED["settler"]
    try:
        for op in ids:
            got = settler.reserve(op, REQUEST, principal="child")
            assert isinstance(got, Reserved)
            assert got.reservation.operation_id == op
        out.put("ok")
    except BaseException as exc:
        out.put(repr(exc))


_SHARED: dict[str, Settler] = {}


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork")
def test_a_forked_child_never_uses_its_parents_connections(redis_url: str, namespace: str) -> None:
    settler = Settler.from_url(redis_url, namespace=namespace)
    _SHARED["settler"] = settler
    try:
        assert isinstance(settler.reserve("before-fork", REQUEST, principal="p"), Reserved)
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        child_ids = [f"child-{i}" for i in range(200)]
        child = ctx.Process(target=_child, args=(child_ids, out))
        child.start()
        for i in range(200):  # the parent keeps calling on its own connection meanwhile
            op = f"parent-{i}"
            got = settler.reserve(op, REQUEST, principal="p")
            assert isinstance(got, Reserved)
            assert got.reservation.operation_id == op
        child.join(60)
        assert out.get(timeout=5) == "ok"
        assert child.exitcode == 0
        for op in ("parent-199", "child-199"):
            record = settler.get(op)
            assert record is not None
            assert record.state is State.PENDING
    finally:
        _SHARED.clear()
        settler.close()


def test_a_blocking_pool_is_not_drained_by_settle(redis_url: str, namespace: str) -> None:
    pool = redis.BlockingConnectionPool.from_url(redis_url, max_connections=2, timeout=1)
    client = redis.Redis(connection_pool=pool)
    settler = Settler(client, namespace=namespace)
    try:
        for i in range(5):
            assert isinstance(settler.reserve(f"op-{i}", REQUEST, principal="p"), Reserved)
        # The application holds one connection and needs the other: it would wait 1 s and
        # fail if settle had kept one.
        held = pool.get_connection()
        try:
            assert client.ping()
        finally:
            pool.release(held)
    finally:
        settler.close()
        pool.disconnect()  # a pool the application made is the application's to close


@pytest.mark.asyncio
async def test_async_blocking_pool_is_not_drained_by_settle(redis_url: str, namespace: str) -> None:
    pool = aioredis.BlockingConnectionPool.from_url(redis_url, max_connections=2, timeout=1)
    client = aioredis.Redis(connection_pool=pool)
    settler = AsyncSettler(client, namespace=namespace)
    try:
        for i in range(5):
            assert isinstance(await settler.reserve(f"op-{i}", REQUEST, principal="p"), Reserved)
        held = await pool.get_connection()
        try:
            assert await client.ping()
        finally:
            await pool.release(held)
    finally:
        await settler.aclose()
        await pool.disconnect()  # a pool the application made is the application's to close


def _settle_clients(url: str, name: str) -> int:
    admin = redis.Redis.from_url(url, decode_responses=True)
    try:
        return sum(1 for c in admin.client_list() if c.get("name") == name)
    finally:
        admin.close()


@pytest.mark.asyncio
async def test_closing_gives_every_connection_back(redis_url: str, namespace: str) -> None:
    name = f"settle-{uuid.uuid4().hex[:8]}"
    sync_settler = Settler(redis.Redis.from_url(redis_url, client_name=name), namespace=namespace)
    async_settler = AsyncSettler(
        aioredis.Redis.from_url(redis_url, client_name=name), namespace=namespace
    )
    await asyncio.gather(
        *(async_settler.reserve(f"a-{i}", REQUEST, principal="p") for i in range(16))
    )
    for i in range(4):
        sync_settler.reserve(f"s-{i}", REQUEST, principal="p")
    assert _settle_clients(redis_url, name) >= 2
    sync_settler.close()
    await async_settler.aclose()
    for _ in range(50):  # the server notices closed sockets a moment later
        if _settle_clients(redis_url, name) == 0:
            break
        await asyncio.sleep(0.02)
    assert _settle_clients(redis_url, name) == 0


@pytest.mark.asyncio
async def test_async_pool_the_application_disconnected_is_reconnected_without_a_retry(
    redis_url: str, namespace: str
) -> None:
    settler = AsyncSettler.from_url(redis_url, namespace=namespace)
    try:
        first = await settler.reserve("op-1", REQUEST, principal="p")
        assert isinstance(first, Reserved)
        await settler.client.connection_pool.disconnect()
        with capture_logs() as logs:
            settled = await settler.complete(first.reservation, {"ok": True})
        assert settled.record.state is State.COMPLETED
        assert [e for e in logs if e["event"] == "settle.backend.retrying"] == []
    finally:
        await settler.aclose()


def test_settlers_sharing_an_applications_client_keep_none_of_its_connections(
    redis_url: str, namespace: str
) -> None:
    """An application's client may carry many settlers, some never closed: none of them
    may hold on to a connection of its pool between calls."""
    client = redis.Redis.from_url(redis_url, max_connections=4)
    try:
        for i in range(40):  # ten times the pool: each would keep one
            settler = Settler(client, namespace=f"{namespace}-{i}")
            assert isinstance(settler.reserve("op", REQUEST, principal="p"), Reserved)
        assert client.ping()
    finally:
        client.close()


def test_a_settlers_own_pool_keeps_half_for_everything_else(redis_url: str, namespace: str) -> None:
    settler = Settler.from_url(f"{redis_url}?max_connections=4", namespace=namespace)
    try:
        settler.reserve("warm-up", REQUEST, principal="p")  # start-up checks, once
        together = threading.Barrier(4)

        def burst() -> None:  # four threads' calls at once take the whole pool
            for _ in range(20):
                together.wait(5)
                got = settler.reserve(f"op-{uuid.uuid4().hex}", REQUEST, principal="p")
                assert isinstance(got, Reserved)

        threads = [threading.Thread(target=burst) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        # What settle keeps between calls leaves room for the application's own commands
        # (redis-py's pool refuses a fifth connection at once).
        pool = settler.client.connection_pool
        held = [pool.get_connection(), pool.get_connection()]
        for conn in held:
            pool.release(conn)
    finally:
        settler.close()


def test_a_kept_connection_a_maintenance_notification_flagged_is_reconnected(
    redis_url: str, namespace: str
) -> None:
    """redis-py flags the pool's in-use connections when the server announces it is moving
    (a MOVING notification on Redis Enterprise and managed services): a kept connection is
    in use for the pool, and must not go on talking to the old endpoint."""
    settler = Settler.from_url(redis_url, namespace=namespace)
    try:
        assert isinstance(settler.reserve("op-1", REQUEST, principal="p"), Reserved)
        (kept,) = settler._runner._lane._idle  # white box: the connection the lane kept
        before = kept._sock.getsockname()
        settler.client.connection_pool.update_active_connections_for_reconnect()
        assert kept.should_reconnect()
        assert isinstance(settler.reserve("op-2", REQUEST, principal="p"), Reserved)
        assert not kept.should_reconnect()
        assert kept._sock is None or kept._sock.getsockname() != before
    finally:
        settler.close()


@pytest.mark.asyncio
async def test_a_call_cancelled_while_its_kept_connection_reconnects_loses_no_connection(
    redis_url: str, namespace: str
) -> None:
    """A kept connection is checked (and, flagged by a maintenance notification, closed)
    before a call sends on it: a caller cancelled during that check leaves the connection
    kept, not lost to the pool (a pool of few connections would run dry)."""
    settler = AsyncSettler.from_url(redis_url, namespace=namespace)
    try:
        assert isinstance(await settler.reserve("op-1", REQUEST, principal="p"), Reserved)
        pool = settler.client.connection_pool
        (kept,) = settler._runner._lane._idle  # white box: the connection the lane kept
        await pool.update_active_connections_for_reconnect()
        assert kept.should_reconnect()
        in_use = len(pool._in_use_connections)
        call = asyncio.create_task(settler.get("op-1"))
        await asyncio.sleep(0)  # the call is closing the flagged connection
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert settler._runner._lane._idle == [kept]
        assert len(pool._in_use_connections) == in_use
        assert (await settler.get("op-1")).state is State.PENDING
    finally:
        await settler.aclose()
