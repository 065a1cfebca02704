"""asyncio's script calls are pipelined (``_Pipelined`` in settle/_runtime/_async.py): calls
that tasks make while another is on the wire go together in one write on one connection.
What that must not cost a caller, with real concurrency on a real server: every call gets
its own reply and its own error; a cancelled call leaves the others alone; a connection cut
under a batch fails each of its calls with a transient error that the runner repeats, and
every operation is still reserved exactly once.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import redis
from structlog.testing import capture_logs

from settle import AsyncSettler, Reserved, State
from settle._core.scripts import SCRIPTS
from settle._runtime.calls import Call
from settle.errors import BackendError, ConfigurationError
from tests.faults.servers import async_client, script_needle
from tests.faults.tcp_proxy import FaultyProxy

pytestmark = [pytest.mark.faults]

REQUEST = {"amount": 1250}
TASKS = 64


@pytest_asyncio.fixture
async def settler(redis_url: str, namespace: str) -> AsyncIterator[AsyncSettler]:
    """A settler past its start-up checks, with one kept connection."""
    s = AsyncSettler.from_url(redis_url, namespace=namespace)
    await s.reserve("warm-up", REQUEST, principal="p")
    yield s
    await s.aclose()


def _ops(n: int) -> list[str]:
    run = uuid.uuid4().hex[:8]
    return [f"op-{run}-{i}" for i in range(n)]


async def _check_reserved_once(settler: AsyncSettler, ops: list[str], got: list[Any]) -> None:
    for op, result in zip(ops, got, strict=True):
        assert isinstance(result, Reserved), (op, result)
        assert result.reservation.operation_id == op
        record = await settler.get(op)
        assert record is not None
        assert record.state is State.PENDING
        assert record.attempt_id == result.reservation.attempt_id
        assert record.generation == result.reservation.generation
        assert (record.version, record.reservations) == (1, 1)


class _MonitorConnections:
    """The client connections MONITOR sees send settle's scripts (address and port)."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._stop = f"settle-stop-{uuid.uuid4().hex}"
        self.connections: set[tuple[str, str]] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> _MonitorConnections:
        self._thread.start()
        assert self._ready.wait(5)
        return self

    def _watch(self) -> None:
        client = redis.Redis.from_url(self._url, decode_responses=True)
        try:
            with client.monitor() as monitor:
                self._ready.set()
                for event in monitor.listen():
                    command = str(event.get("command", ""))
                    if self._stop in command:
                        return
                    if command.startswith(("EVALSHA", "FCALL")) and event["client_type"] != "lua":
                        self.connections.add((event["client_address"], event["client_port"]))
        finally:
            client.close()

    def __exit__(self, *exc: object) -> None:
        with redis.Redis.from_url(self._url) as client:
            client.echo(self._stop)
        self._thread.join(5)


@pytest.mark.asyncio
async def test_concurrent_calls_each_get_their_own_reply_over_few_connections(
    settler: AsyncSettler, redis_url: str
) -> None:
    seen: set[tuple[str, str]] = set()
    for _ in range(3):
        ops = _ops(TASKS)
        with _MonitorConnections(redis_url) as watch:
            got = await asyncio.gather(*(settler.reserve(op, REQUEST, principal="p") for op in ops))
        seen |= watch.connections
        await _check_reserved_once(settler, ops, got)
    # 64 calls at once did not take 64 connections: they were sent together.
    assert 0 < len(seen) <= 8, seen


@pytest.mark.asyncio
async def test_a_calls_error_reply_reaches_that_call_only(
    settler: AsyncSettler, redis_client: redis.Redis
) -> None:
    # A settle value at a key without settle's form: the script itself fails on it (it
    # reads the operation id from the key), a Lua error reply for that call alone.
    redis_client.set(
        "not-a-settle-key", redis_client.get(settler._core.keys.record("warm-up")) or b""
    )
    broken = Call("get", ("not-a-settle-key",), (), operation_id="broken")
    ops = _ops(TASKS)
    runs = [settler.reserve(op, REQUEST, principal="p") for op in ops]
    got = await asyncio.gather(
        *runs[: TASKS // 2],
        settler._runner.run(broken),
        *runs[TASKS // 2 :],
        return_exceptions=True,
    )
    error = got.pop(TASKS // 2)
    assert isinstance(error, BackendError)
    assert error.code == "ERR"  # the script's own error, not a connection's
    await _check_reserved_once(settler, ops, got)


@pytest.mark.asyncio
async def test_after_a_script_flush_every_call_of_a_batch_loads_and_runs(
    settler: AsyncSettler, redis_client: redis.Redis
) -> None:
    redis_client.script_flush()
    if int(str(redis_client.info("server")["redis_version"]).split(".")[0]) >= 7:
        redis_client.function_flush()
    ops = _ops(TASKS)
    got = await asyncio.gather(*(settler.reserve(op, REQUEST, principal="p") for op in ops))
    await _check_reserved_once(settler, ops, got)


@pytest.mark.asyncio
async def test_cancelled_calls_leave_the_others_and_the_connection_sound(
    settler: AsyncSettler, redis_client: redis.Redis
) -> None:
    ops = _ops(TASKS)
    # The server holds the scripts (and their replies) until the batch is on the wire and
    # half of its callers are cancelled.
    redis_client.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
    try:
        tasks = [asyncio.create_task(settler.reserve(op, REQUEST, principal="p")) for op in ops]
        await asyncio.sleep(0.3)
        for task in tasks[::2]:
            task.cancel()
    finally:
        redis_client.execute_command("CLIENT", "UNPAUSE")
    got = await asyncio.gather(*tasks, return_exceptions=True)
    await _check_reserved_once(settler, ops[1::2], got[1::2])
    assert all(isinstance(g, asyncio.CancelledError) for g in got[::2])
    # The cancelled calls were on the wire: they ran, and their replies were read and
    # dropped, never handed to another call.
    ran = [await settler.get(op) for op in ops[::2]]
    assert sum(r is not None for r in ran) >= TASKS // 2 - 1
    # The connections the batch used answer the next calls with their own replies.
    again = _ops(TASKS)
    got = await asyncio.gather(*(settler.reserve(op, REQUEST, principal="p") for op in again))
    await _check_reserved_once(settler, again, got)


@pytest.mark.asyncio
async def test_refused_credentials_reach_every_call_of_a_batch_unrepeated(
    redis_url: str, redis_client: redis.Redis, namespace: str
) -> None:
    """A password rotated under a running service: new connections fail AUTH. Each
    batched call gets that error (a ConfigurationError, never repeated), not a stand-in."""
    user, password = f"u{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    redis_client.acl_setuser(
        user, enabled=True, passwords=[f"+{password}"], keys=["*"], commands=["+@all"]
    )
    host, port = redis_url.split("//")[1].split(":")
    url = f"redis://{user}:{password}@{host}:{port}"
    settler = AsyncSettler.from_url(url, namespace=namespace)
    try:
        await settler.reserve("warm-up", REQUEST, principal="p")
        redis_client.acl_setuser(user, enabled=True, reset_passwords=True, passwords=["+rotated"])
        redis_client.execute_command("CLIENT", "KILL", "USER", user)
        with capture_logs() as logs:
            got = await asyncio.gather(
                *(settler.reserve(op, REQUEST, principal="p") for op in _ops(16)),
                return_exceptions=True,
            )
        assert all(isinstance(g, ConfigurationError) for g in got), got
        # Each call's first try met its killed connection (asyncio sees the close only
        # when it reads); the refused credentials after it were not repeated.
        retries = [e for e in logs if e["event"] == "settle.backend.retrying"]
        assert max((e["attempt"] for e in retries), default=1) == 1
    finally:
        await settler.aclose()
        redis_client.acl_deluser(user)


def test_asyncio_run_again_and_again_does_not_exhaust_the_pool(
    redis_url: str, namespace: str
) -> None:
    """Each ``asyncio.run`` is a new event loop: what the settler kept for the last one goes
    back to its pool, which must not run out (redis-py's pool holds 6 here)."""
    settler = AsyncSettler.from_url(f"{redis_url}?max_connections=6", namespace=namespace)

    async def one_call(op: str) -> Any:
        got = await settler.reserve(op, REQUEST, principal="p")
        # This loop's sockets close with it (redis-py's asyncio connections belong to the
        # loop that opened them); the pool keeps its connection objects.
        await settler.client.connection_pool.disconnect()
        return got

    got = [asyncio.run(one_call(op)) for op in _ops(15)]
    assert all(isinstance(g, Reserved) for g in got), got
    asyncio.run(settler.aclose())


@pytest.mark.asyncio
@pytest.mark.parametrize("at", ["after_request", "mid_reply"])
async def test_a_connection_cut_under_a_batch_repeats_each_call_and_reserves_once(
    proxy: FaultyProxy, namespace: str, at: str
) -> None:
    settler = AsyncSettler(async_client(proxy.port), namespace=namespace)
    try:
        await settler.reserve("warm-up", REQUEST, principal="p")
        ops = _ops(TASKS)
        attempts = [f"attempt-{i}" for i in range(TASKS)]
        proxy.cut(script_needle(SCRIPTS, "reserve"), at)  # type: ignore[arg-type]
        got = await asyncio.gather(
            *(
                settler.reserve(op, REQUEST, principal="p", attempt_id=aid)
                for op, aid in zip(ops, attempts, strict=True)
            )
        )
        assert proxy.fired == [at]
        await _check_reserved_once(settler, ops, got)
        assert [g.reservation.attempt_id for g in got] == attempts
    finally:
        await settler.aclose()


@pytest.mark.asyncio
async def test_a_call_that_does_not_encode_fails_alone(
    settler: AsyncSettler, redis_url: str
) -> None:
    ops = _ops(TASKS)
    bad = Call("get", (settler._core.keys.record("op") + "\udc80",), (), operation_id="bad")
    runs = [settler.reserve(op, REQUEST, principal="p") for op in ops]
    got = await asyncio.gather(
        *runs[:8], settler._runner.run(bad), *runs[8:], return_exceptions=True
    )
    assert isinstance(got.pop(8), UnicodeEncodeError)
    await _check_reserved_once(settler, ops, got)
    # Nothing of the pool was lost to it: the settler's own client still has room.
    pool = settler.client.connection_pool
    assert len(pool._in_use_connections) <= pool.max_connections // 2


@pytest.mark.asyncio
async def test_a_cancelled_close_leaves_the_calls_on_the_wire_to_finish(
    settler: AsyncSettler,
) -> None:
    ops = _ops(20)
    calls = [asyncio.create_task(settler.reserve(op, REQUEST, principal="p")) for op in ops]
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # the batch is on its way
    closing = asyncio.create_task(settler.aclose())
    await asyncio.sleep(0)
    closing.cancel()
    got = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)
    assert all(isinstance(g, Reserved) for g in got), got


def test_a_settler_used_from_a_second_event_loop_starts_afresh(
    redis_url: str, namespace: str
) -> None:
    """``asyncio.run`` twice with one settler (a script, a test with function-scoped loops):
    calls left on the first loop when it ended must not hold up the second."""
    settler = AsyncSettler.from_url(redis_url, namespace=namespace)

    async def first() -> None:
        await settler.reserve("warm-up", REQUEST, principal="p")
        # Queued behind each other, never awaited: the loop ends with them pending.
        pending = [
            asyncio.ensure_future(settler.reserve(op, REQUEST, principal="p")) for op in _ops(20)
        ]
        await asyncio.sleep(0)
        assert not all(task.done() for task in pending)
        # The sockets of this loop close with it (redis-py's asyncio connections belong to
        # the loop that opened them; the next loop opens its own).
        await settler.client.connection_pool.disconnect()

    async def second() -> list[Any]:
        ops = _ops(TASKS)
        got = await asyncio.wait_for(
            asyncio.gather(*(settler.reserve(op, REQUEST, principal="p") for op in ops)), 10
        )
        await _check_reserved_once(settler, ops, list(got))
        await settler.aclose()
        return list(got)

    asyncio.run(first())
    assert len(asyncio.run(second())) == TASKS
