"""The sync lane's own send and read (``packing.exchange``, docs/benchmarks.md, the
seventeenth round) answer what redis-py's ``send_packed_command`` / ``read_response``
answer, on a real redis-server over real sockets: each failure (a server killed mid-call, a
connection the server closed while idle, a reply withheld past ``socket_timeout``, a reset,
a partial reply then a close) the same exception class and text, the connection closed the
same, a retry policy repeating the same; each error reply the same ``ResponseError``
subclass with the connection left open (or closed, for a ``ConnectionError`` reply); a
reply larger than the parser's buffer the same value."""

from __future__ import annotations

import asyncio
import math
import select
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
import redis.asyncio.sentinel
import redis.exceptions as rx
import redis.sentinel
from redis._parsers import _AsyncRESP2Parser, _RESP2Parser
from redis._parsers.hiredis import _AsyncHiredisParser
from redis.backoff import NoBackoff
from redis.cache import CacheConfig, CacheFactory
from redis.connection import CacheProxyConnection
from redis.retry import Retry

from settle import AsyncSettler
from settle._runtime import cancel_safe, copied
from settle._runtime.packing import _LEAN_CLASSES, _lean, exchange, pack_command
from settle.embedded import EmbeddedRedis
from tests.faults.tcp_proxy import FaultyProxy, Point

Way = Callable[[Any, Any], Any]


def _redis_py(conn: Any, packed: Any) -> Any:
    """What the lane did before: redis-py's own two calls."""
    conn.send_packed_command(packed)
    return conn.read_response()


WAYS: dict[str, Way] = {"redis-py": _redis_py, "lane": exchange}


def _comparable(value: Any) -> Any:
    """A reply with the error replies inside it as their class and text."""
    if isinstance(value, Exception):
        return (type(value), str(value))
    if isinstance(value, list):
        return [_comparable(item) for item in value]
    return value


def _outcome(conn: Any, call: Callable[[], Any]) -> tuple[Any, ...]:
    """A call's result or error (class and text), and whether it left the connection open."""
    try:
        got: Any = ("reply", _comparable(call()))
    except Exception as exc:
        got = (type(exc), str(exc), type(exc.__cause__), type(exc.__context__))
    return (*got, conn._sock is not None)


def _script(client: redis.Redis, body: str) -> str:
    return str(client.script_load(body))


def _run(url: str, prepare: Callable[[Any, Any], Any], way: Way, **options: Any) -> tuple[Any, ...]:
    """Make a connection of a client of ``url``, let ``prepare(client, conn)`` set the scene
    and give the command, and send it ``way``."""
    client = redis.Redis.from_url(url, **options)
    conn = client.connection_pool.get_connection()
    try:
        command = prepare(client, conn)
        packed = pack_command(conn, command)
        return _outcome(conn, lambda: way(conn, packed))
    finally:
        conn.disconnect()
        client.close()


def _both(url: str, prepare: Callable[[Any, Any], Any], **options: Any) -> tuple[Any, Any]:
    return tuple(_run(url, prepare, way, **options) for way in WAYS.values())  # type: ignore[return-value]


def test_the_lane_takes_its_own_way_on_redis_pys_connection(redis_url: str) -> None:
    """Else every comparison below would hold trivially: on redis-py's own connection
    (plain socket, hiredis) neither of its two methods is called."""
    client = redis.Redis.from_url(redis_url)
    conn = client.connection_pool.get_connection()
    calls: list[str] = []
    try:
        assert _lean(type(conn))
        conn.send_packed_command = lambda *a, **k: calls.append("send")  # type: ignore[method-assign]
        conn.read_response = lambda *a, **k: calls.append("read")  # type: ignore[method-assign]
        assert exchange(conn, pack_command(conn, ("PING",))) in (b"PONG", "PONG", True)
        assert calls == []
    finally:
        conn.disconnect()
        client.close()


class _OwnRead(redis.Connection):
    reads = 0

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        _OwnRead.reads += 1
        return super().read_response(*args, **kwargs)


def test_a_connection_class_of_the_applications_keeps_its_own_read(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, connection_class=_OwnRead)
    conn = client.connection_pool.get_connection()
    try:
        assert not _lean(type(conn))
        before = _OwnRead.reads
        exchange(conn, pack_command(conn, ("PING",)))
        assert _OwnRead.reads == before + 1
    finally:
        conn.disconnect()
        client.close()


# -- error replies: read whole, the connection open (a ConnectionError reply closes it) ----

REPLIES = {
    "script error": "return error('boom')",
    "redis.call error": "return redis.call('INCR', 'not-a-number-key', 'extra')",
    "MOVED": "return redis.error_reply('MOVED 3999 127.0.0.1:6381')",
    "ASK": "return redis.error_reply('ASK 3999 127.0.0.1:6381')",
    "READONLY": "return redis.error_reply('READONLY You can not write against a read only.')",
    "OOM": "return redis.error_reply(\"OOM command not allowed when used memory > 'maxmemory'.\")",
    "BUSY": "return redis.error_reply('BUSY Redis is busy running a script.')",
    "LOADING": "return redis.error_reply('LOADING Redis is loading the dataset in memory')",
    "NOPERM": "return redis.error_reply('NOPERM this user has no permissions')",
    "an error inside an array": "return {1, redis.error_reply('ERR inner'), 'x'}",
    "a ConnectionError reply first in an array": (
        "return {redis.error_reply('LOADING Redis is loading the dataset in memory'), 'x'}"
    ),
    "a large reply": "return string.rep('x', 200000)",
    "a large array": "local t = {} for i = 1, 20000 do t[i] = 'item-' .. i end return t",
    "nil": "return nil",
    "integer": "return 42",
}


@pytest.mark.parametrize("body", REPLIES.values(), ids=REPLIES.keys())
@pytest.mark.parametrize("protocol", [2, 3])
def test_each_reply_is_redis_pys(redis_url: str, body: str, protocol: int) -> None:
    def prepare(client: redis.Redis, conn: Any) -> tuple[Any, ...]:
        return ("EVALSHA", _script(client, body), 0)

    lane, own = _both(redis_url, prepare, protocol=protocol)
    assert lane == own
    if body.startswith("return string.rep"):
        assert lane[0] == "reply"
        assert len(lane[1]) == 200000


def test_noscript_is_redis_pys(redis_url: str) -> None:
    def prepare(client: redis.Redis, conn: Any) -> tuple[Any, ...]:
        return ("EVALSHA", "0" * 40, 0)

    lane, own = _both(redis_url, prepare)
    assert lane == own
    assert lane[0] is rx.NoScriptError
    assert lane[-1] is True


def _until_readable(sock: Any, seconds: float = 30.0) -> None:
    """Wait until ``sock`` has something to read: a push, or the server's close (an end of
    file); a fixed 0.1 s was a guess of how long that takes."""
    deadline = time.monotonic() + seconds
    while not select.select([sock], [], [], 0.01)[0]:
        assert time.monotonic() < deadline, "nothing reached the socket"


def _until_reset(sock: Any, seconds: float = 30.0) -> None:
    """Wait until ``sock`` was reset by its peer (poll says an error or a hang-up, which a
    mere close, an end of file, does not)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    deadline = time.monotonic() + seconds
    while not any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(10)):
        assert time.monotonic() < deadline, "the reset never reached the socket"


def _killed_spin(client: redis.Redis, sha: str) -> None:
    """Run the spinning script ``sha`` until SCRIPT KILL ends it (its error is expected)."""
    with pytest.raises(rx.ResponseError, match="Script killed"):
        client.evalsha(sha, 0)


def _until_busy(admin: redis.Redis, seconds: float = 30.0) -> None:
    """Wait until the server answers BUSY: a script runs past ``lua-time-limit``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            admin.ping()
        except rx.ResponseError as exc:  # BUSY is a plain one (BusyLoadingError: LOADING)
            if "BUSY" in str(exc):
                return
            raise
        assert time.monotonic() < deadline, "the server never got busy with the spinning script"
        time.sleep(0.01)


def _until_held(url: str, command: str, seconds: float = 30.0) -> None:
    """Wait until the server holds back a call of ``command`` (a client blocked by a
    ``CLIENT PAUSE``): the call was sent and has not been answered."""
    with redis.Redis.from_url(url) as admin:
        deadline = time.monotonic() + seconds
        while not any(
            "b" in c["flags"] and c["cmd"] == command.lower() for c in admin.client_list()
        ):
            assert time.monotonic() < deadline, f"the server never held back a {command}"
            time.sleep(0.01)


def _kill_once_held(server: EmbeddedRedis, command: str) -> None:
    """Kill ``server`` once it holds back a call of ``command`` (in a thread): the kill
    comes while the call waits for its reply, however late a loaded machine sends it."""

    def kill() -> None:
        try:
            _until_held(server.url, command)
        finally:
            server.stop(kill=True)

    threading.Thread(target=kill, daemon=True).start()


def test_a_real_busy_server_is_redis_pys() -> None:
    """A script past ``lua-time-limit`` on another connection: BUSY for this one."""
    with EmbeddedRedis() as server:
        admin = redis.Redis.from_url(server.url)
        admin.config_set("lua-time-limit", 10)
        # Spins until SCRIPT KILL ends it, after the call: a spin of its own length could end
        # before a loaded machine sends the call (which would then be answered NOSCRIPT).
        spin = _script(admin, "while true do end")
        outcomes = []
        for way in WAYS.values():
            spinning = redis.Redis.from_url(server.url)
            busy = threading.Thread(target=_killed_spin, args=(spinning, spin))
            busy.start()
            _until_busy(admin)

            def prepare(client: redis.Redis, conn: Any) -> tuple[Any, ...]:
                return ("EVALSHA", "0" * 40, 0)

            outcomes.append(_run(server.url, prepare, way))
            admin.script_kill()
            busy.join()
            spinning.close()
        admin.close()
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] is rx.BusyLoadingError or "BUSY" in outcomes[0][1]


# -- failures of the connection: the same error and text, the connection closed ------------


def test_a_connection_the_server_closed_while_idle_is_redis_pys(redis_url: str) -> None:
    def prepare(client: redis.Redis, conn: Any) -> tuple[Any, ...]:
        conn.send_command("CLIENT", "ID")
        client.client_kill_filter(_id=conn.read_response())
        _until_readable(conn._sock)  # the close reaches the socket
        return ("EVALSHA", _script(client, "return 1"), 0)

    lane, own = _both(redis_url, prepare)
    assert lane == own
    assert lane[0] is rx.ConnectionError
    assert lane[-1] is False


def test_a_send_on_a_connection_the_server_reset_is_redis_pys(redis_url: str) -> None:
    """The server closed the connection and answered a write with a reset: the send itself
    fails (a broken pipe), not the read."""

    def prepare(client: redis.Redis, conn: Any) -> tuple[Any, ...]:
        conn.send_command("CLIENT", "ID")
        client.client_kill_filter(_id=conn.read_response())
        _until_readable(conn._sock)  # the close reaches the socket
        conn._sock.sendall(b"*1\r\n$4\r\nPING\r\n")  # answered with a reset
        _until_reset(conn._sock)
        return ("EVALSHA", _script(client, "return 1"), 0)

    lane, own = _both(redis_url, prepare)
    assert lane == own
    assert lane[0] is rx.ConnectionError
    assert "while writing to socket" in lane[1]
    assert lane[-1] is False


def test_a_reply_withheld_past_the_socket_timeout_is_redis_pys() -> None:
    # Paused (writes, which a script is) far longer than the timeout, and unpaused after the
    # call: a pause of 0.5 s let a call a loaded machine sent 0.3 s late be answered.
    def prepare(client: redis.Redis, conn: Any) -> tuple[Any, ...]:
        sha = _script(client, "return 1")
        client.execute_command("CLIENT", "PAUSE", 30000, "WRITE")
        return ("EVALSHA", sha, 0)

    outcomes = []
    with EmbeddedRedis() as server, redis.Redis.from_url(server.url) as admin:
        for way in WAYS.values():
            outcomes.append(_run(server.url, prepare, way, socket_timeout=0.2))
            admin.execute_command("CLIENT", "UNPAUSE")
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] is rx.TimeoutError
    assert outcomes[0][1] == f"Timeout reading from 127.0.0.1:{server.port}"
    assert outcomes[0][-1] is False


def test_a_server_killed_mid_call_is_redis_pys() -> None:
    outcomes = []
    for way in WAYS.values():
        server = EmbeddedRedis().start()
        try:

            def prepare(
                client: redis.Redis, conn: Any, server: EmbeddedRedis = server
            ) -> tuple[Any, ...]:
                sha = _script(client, "return 1")
                client.execute_command("CLIENT", "PAUSE", 30000, "WRITE")
                _kill_once_held(server, "EVALSHA")  # while the call waits for its reply
                return ("EVALSHA", sha, 0)

            outcomes.append(_run(server.url, prepare, way))
        finally:
            server.close()
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] is rx.ConnectionError
    assert outcomes[0][-1] is False


@pytest.fixture
def proxied(redis_url: str) -> Iterator[Callable[[Point], str]]:
    """A proxy in front of the server that resets the connection on a request holding
    ``MARKED`` (``reset``) or forwards half of its reply and closes it (``mid_reply``)."""
    proxies: list[FaultyProxy] = []

    def make(at: Point) -> str:
        proxy = FaultyProxy(int(redis_url.rsplit(":", 1)[1].split("/", maxsplit=1)[0])).start()
        proxy.cut(b"MARKED", at, times=2)  # once for each way
        proxies.append(proxy)
        return proxy.url

    yield make
    for proxy in proxies:
        proxy.close()


@pytest.mark.parametrize("mode", ["reset", "mid_reply"])
def test_a_reset_or_a_partial_reply_then_a_close_is_redis_pys(
    proxied: Callable[[Point], str], mode: Point
) -> None:
    url = proxied(mode)

    def prepare(client: redis.Redis, conn: Any) -> tuple[Any, ...]:
        return ("EVAL", "return string.rep(ARGV[1], 30000)", 0, "MARKED")

    lane, own = _both(url, prepare)
    assert lane == own
    assert lane[-1] is False
    if mode == "reset":
        assert lane[0] is rx.ConnectionError
        assert "reset" in lane[1].lower()
    else:
        assert lane[:2] == (rx.ConnectionError, "Connection closed by server.")


# -- the retry policy's repeats ----------------------------------------------------------


@pytest.mark.parametrize("retries", [0, 2])
def test_a_retry_policy_repeats_as_with_redis_pys(redis_url: str, retries: int) -> None:
    """The lane hands each try to the connection's policy (``_Lane._exchange``): a server
    that closed the connection while idle, then answers the repeat, the same way."""

    def run(way: Way) -> tuple[Any, ...]:
        client = redis.Redis.from_url(redis_url)
        conn = client.connection_pool.get_connection()
        try:
            conn.send_command("CLIENT", "ID")
            client.client_kill_filter(_id=conn.read_response())
            _until_readable(conn._sock)  # the close reaches the socket
            packed = pack_command(conn, ("EVALSHA", _script(client, "return 7"), 0))
            failed: list[str] = []
            tries: list[int] = []

            def once() -> Any:
                tries.append(1)
                return way(conn, packed)

            def fail(error: Exception) -> None:
                failed.append(f"{type(error).__name__}: {error}")
                conn.disconnect()

            outcome = _outcome(
                conn, lambda: Retry(NoBackoff(), retries).call_with_retry(once, fail)
            )
            return (*outcome, failed, len(tries))
        finally:
            conn.disconnect()
            client.close()

    lane, own = run(exchange), run(_redis_py)
    assert lane == own
    assert lane[0] == ("reply" if retries else rx.ConnectionError)


# -- the asyncio lane's read (``cancel_safe.read``; its send was already its own) ---------


async def _async_redis_py(conn: Any) -> Any:
    return await conn.read_response(timeout=math.inf)


ASYNC_WAYS = {"redis-py": _async_redis_py, "lane": cancel_safe.read}


def _async_run(url: str, prepare: Callable[[Any], Any], read: Any, **options: Any) -> Any:
    """As :func:`_run`, on an asyncio connection: ``prepare(client)`` sets the scene (sync)
    and gives the command, sent by redis-py and read ``read``; ``cancel`` cancels the read."""

    async def main() -> tuple[Any, ...]:
        client = aredis.Redis.from_url(url, **options)
        conn = await client.connection_pool.get_connection()
        try:
            command = prepare(conn)
            await conn.send_packed_command(pack_command(conn, command))
            try:
                got: Any = ("reply", _comparable(await read(conn)))
            except Exception as exc:
                got = (type(exc), str(exc), type(exc.__cause__), type(exc.__context__))
            return (*got, conn.is_connected)
        finally:
            await conn.disconnect()
            await client.aclose()

    return asyncio.run(main())


def test_the_async_read_is_its_own_on_redis_pys_connection(redis_url: str) -> None:
    async def main() -> None:
        client = aredis.Redis.from_url(redis_url)
        conn = await client.connection_pool.get_connection()
        try:
            assert cancel_safe._lean(type(conn))
            assert type(conn._parser) is _AsyncHiredisParser
            conn.read_response = None  # never called
            await conn.send_packed_command(pack_command(conn, ("PING",)))
            assert await cancel_safe.read(conn) in (b"PONG", "PONG", True)
        finally:
            del conn.read_response
            await conn.disconnect()
            await client.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("body", REPLIES.values(), ids=REPLIES.keys())
@pytest.mark.parametrize("protocol", [2, 3])
def test_each_reply_is_redis_pys_async(redis_url: str, body: str, protocol: int) -> None:
    sha = _script(redis.Redis.from_url(redis_url), body)
    lane, own = (
        _async_run(redis_url, lambda conn: ("EVALSHA", sha, 0), read, protocol=protocol)
        for read in ASYNC_WAYS.values()
    )
    assert lane == own


def test_a_connection_closed_while_idle_is_redis_pys_async(redis_url: str) -> None:
    killer = redis.Redis.from_url(redis_url)

    def prepare(conn: Any) -> tuple[Any, ...]:
        for client in killer.client_list():
            if client["name"] == "idle-victim":
                killer.client_kill_filter(_id=client["id"])
        _until_readable(conn._writer.transport.get_extra_info("socket"))
        return ("EVALSHA", _script(killer, "return 1"), 0)

    lane, own = (
        _async_run(redis_url, prepare, read, client_name="idle-victim")
        for read in ASYNC_WAYS.values()
    )
    killer.close()
    assert lane == own
    assert lane[0] is rx.ConnectionError
    assert lane[-1] is False


def test_a_server_killed_mid_call_is_redis_pys_async() -> None:
    outcomes = []
    for read in ASYNC_WAYS.values():
        with EmbeddedRedis() as server:
            admin = redis.Redis.from_url(server.url)
            sha = _script(admin, "return 1")

            def prepare(
                conn: Any, admin: Any = admin, server: Any = server, sha: str = sha
            ) -> tuple[Any, ...]:
                admin.execute_command("CLIENT", "PAUSE", 30000, "WRITE")
                _kill_once_held(server, "EVALSHA")  # while the read waits for the reply
                return ("EVALSHA", sha, 0)

            outcomes.append(_async_run(server.url, prepare, read))
            admin.close()
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] is rx.ConnectionError
    assert outcomes[0][-1] is False


@pytest.mark.parametrize("mode", ["reset", "mid_reply"])
def test_a_reset_or_a_partial_reply_is_redis_pys_async(
    proxied: Callable[[Point], str], mode: Point
) -> None:
    url = proxied(mode)
    command = ("EVAL", "return string.rep(ARGV[1], 30000)", 0, "MARKED")
    lane, own = (_async_run(url, lambda conn: command, read) for read in ASYNC_WAYS.values())
    assert lane == own
    assert lane[0] is rx.ConnectionError
    assert lane[-1] is False


def test_a_cancelled_read_closes_the_connection_as_redis_pys(redis_url: str) -> None:
    """The asyncio lane's deadline cancels the read: the connection is closed either way."""

    async def cancelled(read: Any) -> tuple[Any, ...]:
        admin = aredis.Redis.from_url(redis_url)
        client = aredis.Redis.from_url(redis_url)
        conn = await client.connection_pool.get_connection()
        try:
            # Paused until the read is cancelled, however late that comes (a pause of 0.4 s
            # could end first on a loaded machine, and the read then had its reply).
            await admin.execute_command("CLIENT", "PAUSE", 30000, "WRITE")
            await conn.send_packed_command(pack_command(conn, ("EVAL", "return 1", 0)))
            task = asyncio.ensure_future(read(conn))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return (conn.is_connected,)
        finally:
            await admin.execute_command("CLIENT", "UNPAUSE")
            await conn.disconnect()
            await client.aclose()
            await admin.aclose()

    lane, own = (asyncio.run(cancelled(read)) for read in ASYNC_WAYS.values())
    assert lane == own == (False,)


# -- the health check, push notifications: redis-py's, on the lane's own path --------------


def test_a_due_health_check_reconnects_as_redis_pys(redis_url: str) -> None:
    """A connection the server closed while idle, its health check due: redis-py's check
    (its PING repeated once by the policy) connects again and the call is answered on the
    new socket; the next check is put off
    by the interval after the reply, as redis-py does."""

    def prepare(client: redis.Redis, conn: Any) -> tuple[Any, ...]:
        conn.send_command("CLIENT", "ID")
        client.client_kill_filter(_id=conn.read_response())
        _until_readable(conn._sock)  # the close reaches the socket
        conn.next_health_check = 0  # due
        return ("EVALSHA", _script(client, "return 5"), 0)

    lane, own = _both(redis_url, prepare, health_check_interval=30, retry=Retry(NoBackoff(), 1))
    assert lane == own == ("reply", 5, True)

    client = redis.Redis.from_url(redis_url, health_check_interval=30)
    conn = client.connection_pool.get_connection()
    try:
        before = time.monotonic()
        conn.next_health_check = before + 5  # not due: no PING of the check's puts it off
        exchange(conn, pack_command(conn, ("EVALSHA", _script(client, "return 5"), 0)))
        assert conn.next_health_check >= before + 30
    finally:
        conn.disconnect()
        client.close()


def _tracked(client: redis.Redis, conn: Any, key: str) -> None:
    """``conn`` tracks ``key`` (RESP3 client-side caching), and another client changes it:
    an invalidation push waits on ``conn`` ahead of its next reply."""
    conn.send_command("CLIENT", "TRACKING", "ON")
    conn.read_response()
    conn.send_command("GET", key)
    conn.read_response()
    client.set(key, "changed")
    _until_readable(conn._sock)  # the push reaches the socket


def test_a_push_notification_before_the_reply_is_redis_pys(redis_url: str) -> None:
    """A push (a client-side caching invalidation) read ahead of the reply goes to the
    parser's handler, and the reply after it is the call's."""

    def run(way: Way) -> tuple[Any, ...]:
        client = redis.Redis.from_url(redis_url, protocol=3)
        conn = client.connection_pool.get_connection()
        seen: list[Any] = []
        try:
            conn._parser.set_invalidation_push_handler(seen.append)
            _tracked(client, conn, f"tracked-{id(seen)}")
            packed = pack_command(conn, ("EVALSHA", _script(client, "return 9"), 0))
            return (*_outcome(conn, lambda: way(conn, packed)), len(seen))
        finally:
            conn.disconnect()
            client.close()

    lane, own = run(exchange), run(_redis_py)
    assert lane == own == ("reply", 9, True, 1)


def test_a_push_notification_before_the_reply_is_redis_pys_async(redis_url: str) -> None:
    async def run(read: Any) -> tuple[Any, ...]:
        sync = redis.Redis.from_url(redis_url)
        client = aredis.Redis.from_url(redis_url, protocol=3)
        conn = await client.connection_pool.get_connection()
        seen: list[Any] = []

        async def handler(response: Any) -> None:
            seen.append(response)

        try:
            conn._parser.set_invalidation_push_handler(handler)
            await conn.send_command("CLIENT", "TRACKING", "ON")
            await conn.read_response()
            key = f"tracked-{id(seen)}"
            await conn.send_command("GET", key)
            await conn.read_response()
            sync.set(key, "changed")
            await asyncio.sleep(0.1)
            sha = _script(sync, "return 9")
            await conn.send_packed_command(pack_command(conn, ("EVALSHA", sha, 0)))
            return (_comparable(await read(conn)), conn.is_connected, len(seen))
        finally:
            await conn.disconnect()
            await client.aclose()
            sync.close()

    lane, own = (asyncio.run(run(read)) for read in ASYNC_WAYS.values())
    assert lane == own == (9, True, 1)


# -- a redis-py whose copied code changed: its own methods, and this file says so -----------


def test_the_copied_redis_py_code_is_the_installed_ones() -> None:
    """Fails when the installed redis-py's send, health check or read is not the code
    ``packing.exchange`` / ``cancel_safe.read`` / ``cancel_safe.write`` were copied from:
    read the new code, bring the copies to it, and write its digest in
    settle/_runtime/copied.py."""
    for copy in (copied.SYNC, copied.ASYNC, copied.ASYNC_SEND):
        assert copy.current(), (
            f"redis-py {redis.__version__} changed the code settle's {copy.name} lane copies "
            f"(digest {copy.installed()}): see settle/_runtime/copied.py"
        )


@pytest.fixture
def redis_py_changed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As on a redis-py whose copied methods are not those the copies were made from."""
    monkeypatch.setattr(copied, "DIGESTS", {name: frozenset() for name in copied.DIGESTS})
    _forget_what_was_asked()
    yield
    monkeypatch.undo()
    _forget_what_was_asked()


def _forget_what_was_asked() -> None:
    """Each cache of a copy's currency, asked again on the next call."""
    copied._current.cache_clear()
    _LEAN_CLASSES.clear()
    cancel_safe._LEAN.clear()
    cancel_safe._WATCHABLE.clear()


@pytest.mark.usefixtures("redis_py_changed")
def test_a_changed_redis_py_sends_and_reads_its_own_way(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    conn = client.connection_pool.get_connection()
    calls: list[str] = []
    try:
        assert not _lean(type(conn))
        own_send, own_read = conn.send_packed_command, conn.read_response
        conn.send_packed_command = lambda *a, **k: (calls.append("send"), own_send(*a, **k))  # type: ignore[method-assign]
        conn.read_response = lambda *a, **k: (calls.append("read"), own_read(*a, **k))[1]  # type: ignore[method-assign]
        assert exchange(conn, pack_command(conn, ("PING",))) in (b"PONG", "PONG", True)
        assert calls == ["send", "read"]
    finally:
        conn.disconnect()
        client.close()


@pytest.mark.usefixtures("redis_py_changed")
def test_a_changed_redis_py_reads_its_own_way_async(redis_url: str) -> None:
    async def main() -> list[str]:
        client = aredis.Redis.from_url(redis_url)
        conn = await client.connection_pool.get_connection()
        calls: list[str] = []
        own_read = conn.read_response

        async def read_response(*args: Any, **kwargs: Any) -> Any:
            calls.append("read")
            return await own_read(*args, **kwargs)

        try:
            assert not cancel_safe._lean(type(conn))
            conn.read_response = read_response
            await conn.send_packed_command(pack_command(conn, ("PING",)))
            assert await cancel_safe.read(conn) in (b"PONG", "PONG", True)
            return calls
        finally:
            del conn.read_response
            await conn.disconnect()
            await client.aclose()

    assert asyncio.run(main()) == ["read"]


def _writes_async(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """``bounded`` of each ``cancel_safe.write`` an ``AsyncSettler``'s calls made: False is
    the lane's own send (it bounds the write itself), True Python 3.11's
    ``keep_cancellations`` send (bounded by ``socket_timeout``, as redis-py's)."""
    bounds: list[bool] = []
    own = cancel_safe.write

    async def write(conn: Any, command: Any, *, bounded: bool) -> None:
        bounds.append(bounded)
        await own(conn, command, bounded=bounded)

    monkeypatch.setattr(cancel_safe, "write", write)

    async def main() -> None:
        settler = AsyncSettler.from_url(redis_url, namespace=f"send-{uuid.uuid4().hex[:8]}")
        try:
            assert await settler.get("charge") is None
        finally:
            await settler.aclose()

    asyncio.run(main())
    return bounds


def test_the_asyncio_lane_sends_its_own_way_on_the_redis_py_it_copied(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert False in _writes_async(redis_url, monkeypatch)


@pytest.mark.usefixtures("redis_py_changed")
def test_a_changed_redis_py_sends_its_own_way_async(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The asyncio lane's send (``cancel_safe.ready`` / ``write``, bounded by the lane) is
    taken only on the redis-py it was copied from: on another, each script call goes
    through the connection's own ``send_packed_command`` (on Python 3.11,
    ``keep_cancellations``' send: bounded as redis-py's, kept there on any redis-py)."""
    bounds = _writes_async(redis_url, monkeypatch)
    assert False not in bounds
    assert bounds == ([True] * len(bounds) if cancel_safe.NEEDED else [])
    if cancel_safe.NEEDED:
        assert bounds


def test_a_reply_puts_the_next_health_check_off_async(redis_url: str) -> None:
    async def main() -> tuple[float, float]:
        client = aredis.Redis.from_url(redis_url, health_check_interval=30)
        conn = await client.connection_pool.get_connection()
        try:
            await conn.send_packed_command(pack_command(conn, ("PING",)))
            before = asyncio.get_running_loop().time()
            conn.next_health_check = before + 5
            await cancel_safe.read(conn)
            return before, conn.next_health_check
        finally:
            await conn.disconnect()
            await client.aclose()

    before, after = asyncio.run(main())
    assert after >= before + 30


# -- which connections take the lane's own path: none that does a step its own way ---------


class _OwnSend(redis.Connection):
    def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        super().send_packed_command(*args, **kwargs)


class _OwnCheck(redis.Connection):
    def check_health(self) -> None:
        super().check_health()


@pytest.mark.parametrize(
    "cls",
    [_OwnRead, _OwnSend, _OwnCheck, redis.sentinel.SentinelManagedConnection],
    ids=lambda c: c.__name__,
)
def test_a_connection_class_with_a_step_of_its_own_keeps_redis_pys_methods(cls: type) -> None:
    """A Sentinel-managed connection among them: its read is its own."""
    assert _lean(redis.Connection)
    assert not _lean(cls)


def test_another_parser_keeps_redis_pys_methods(redis_url: str) -> None:
    """redis-py's Python parser: the connection's own send and read answer."""
    client = redis.Redis.from_url(redis_url, parser_class=_RESP2Parser)
    conn = client.connection_pool.get_connection()
    try:
        assert exchange(conn, pack_command(conn, ("EVAL", "return 3", 0))) == 3
    finally:
        conn.disconnect()
        client.close()


class _OwnParse(aredis.Connection):
    async def _read_response_from_parser(self, *args: Any, **kwargs: Any) -> Any:
        return await super()._read_response_from_parser(*args, **kwargs)


def test_an_async_connection_class_with_its_own_read_keeps_redis_pys() -> None:
    assert cancel_safe._lean(aredis.Connection)
    assert not cancel_safe._lean(_OwnParse)
    assert not cancel_safe._lean(aredis.sentinel.SentinelManagedConnection)


def test_another_parser_keeps_redis_pys_read_async(redis_url: str) -> None:
    async def main() -> Any:
        client = aredis.Redis.from_url(redis_url, parser_class=_AsyncRESP2Parser)
        conn = await client.connection_pool.get_connection()
        try:
            await conn.send_packed_command(pack_command(conn, ("EVAL", "return 3", 0)))
            return await cancel_safe.read(conn)
        finally:
            await conn.disconnect()
            await client.aclose()

    assert asyncio.run(main()) == 3


def test_a_client_side_caching_connection_keeps_redis_pys_methods(redis_url: str) -> None:
    """redis-py's client-side caching (``cache_config``) hands out a proxy around the
    connection, with no socket of its own: its own send and read answer."""
    client = redis.Redis.from_url(redis_url, protocol=3)
    conn = client.connection_pool.get_connection()
    proxy = CacheProxyConnection(conn, CacheFactory(CacheConfig()).get_cache(), threading.RLock())
    try:
        assert not _lean(type(proxy))
        assert exchange(proxy, pack_command(proxy, ("EVAL", "return 3", 0))) == 3
    finally:
        proxy.disconnect()
        client.close()
