"""The sync lane's shortcuts around redis-py (docs/benchmarks.md, the sixteenth round) answer
what redis-py's own calls answer: the check of a kept connection (``packing.can_read``) and
the first try made outside the connection's retry policy (``packing.tried``)."""

from __future__ import annotations

import asyncio
import select
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.exceptions as rx
from redis._parsers import _RESP2Parser, _RESP3Parser
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from settle import AsyncSettler, Reserved, Settler
from settle._runtime.packing import can_read, retries_as_redis_py, tried
from settle.embedded import EmbeddedRedis
from settle.errors import BackendError
from tests.faults.sentinel_support import SERVICE, LocalSentinel


def _outcome(check: Callable[[], Any]) -> Any:
    try:
        return check()
    except Exception as exc:
        return type(exc)


def _connection(url: str) -> Any:
    client = redis.Redis.from_url(url)
    conn = client.connection_pool.get_connection()
    conn.connect()
    return client, conn


def _wait_readable(conn_or_sock: Any) -> None:
    sock = getattr(conn_or_sock, "_sock", conn_or_sock)
    deadline = time.monotonic() + 5
    while not select.select([sock], [], [], 0.05)[0]:
        assert time.monotonic() < deadline, "nothing arrived"


def _wait_buffered(conn: Any, size: int) -> None:
    deadline = time.monotonic() + 5
    while len(conn._sock.recv(size, socket.MSG_PEEK)) < size:
        assert time.monotonic() < deadline, "the replies did not arrive"
        time.sleep(0.001)


def test_an_idle_connection_reads_nothing_either_way(redis_url: str) -> None:
    client, conn = _connection(redis_url)
    try:
        assert can_read(conn) is False
        assert conn.can_read() is False
        conn.send_command("PING")
        conn.read_response()
        assert can_read(conn) is False
    finally:
        conn.disconnect()
        client.close()


def test_a_reply_nobody_read_is_seen_either_way(redis_url: str) -> None:
    client, conn = _connection(redis_url)
    try:
        conn.send_command("PING")
        _wait_readable(conn)  # the reply is on its way
        assert can_read(conn) is True
        assert conn.can_read() is True
        conn.read_response()
        # and it is the hiredis reader's own buffer next time: both replies are in the
        # socket before the first is read (one read takes both), so the second is held by
        # the parser, where no poll of the socket sees it. Waiting for both bytes first
        # keeps the two checks from racing the second reply (it arrived between them once).
        conn.send_packed_command(conn.pack_commands([("PING",), ("PING",)]))
        _wait_buffered(conn, len(b"+PONG\r\n") * 2)
        assert conn.read_response() == b"PONG"
        assert not select.select([conn._sock], [], [], 0)[0]  # the socket holds nothing
        assert can_read(conn) is True
        assert conn.can_read() is True
        assert conn.read_response() == b"PONG"
        assert can_read(conn) is False
    finally:
        conn.disconnect()
        client.close()


def test_a_connection_the_server_closed_is_refused_either_way(redis_url: str) -> None:
    client, conn = _connection(redis_url)
    killer = redis.Redis.from_url(redis_url)
    try:
        conn.send_command("CLIENT", "ID")
        killer.client_kill_filter(_id=conn.read_response())
        _wait_readable(conn._sock)  # the close reaches the socket
        # redis-py raises ConnectionError for a closed socket: so does the shortcut
        assert _outcome(lambda: can_read(conn)) == rx.ConnectionError
        assert _outcome(conn.can_read) == rx.ConnectionError
    finally:
        conn.disconnect()
        killer.close()
        client.close()


def test_a_connection_without_a_socket_is_asked_itself(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    conn = client.connection_pool.get_connection()
    try:
        conn.disconnect()
        assert can_read(conn) is False  # redis-py connects it, as its own check does
        assert conn._sock is not None
    finally:
        conn.disconnect()
        client.close()


class _Flagged(redis.Connection):
    """An application's connection class (``client_options={"connection_class": ...}``)
    whose own check says more than the socket: it is the one asked."""

    def can_read(self, timeout: float = 0) -> bool:
        return True


@pytest.mark.parametrize(
    "options",
    [
        {"connection_class": _Flagged},
        {"parser_class": _RESP2Parser},
        {"parser_class": _RESP3Parser, "protocol": 3},
    ],
    ids=["own-connection-class", "resp2-python-parser", "resp3-python-parser"],
)
def test_another_connection_or_parser_is_asked_itself(
    redis_url: str, options: dict[str, Any]
) -> None:
    client = redis.Redis.from_url(redis_url, **options)
    conn = client.connection_pool.get_connection()
    try:
        assert _outcome(lambda: can_read(conn)) == _outcome(conn.can_read)
        conn.send_command("PING")
        _wait_readable(conn)
        assert _outcome(lambda: can_read(conn)) == _outcome(conn.can_read) == True  # noqa: E712
    finally:
        conn.disconnect()
        client.close()


def _plain(first: list[BaseException], then: Callable[[], Any]) -> Callable[[], Any]:
    """What the lane handed redis-py before: a try that raises ``first``'s errors in turn."""

    def call() -> Any:
        if first:
            raise first.pop(0)
        return then()

    return call


@pytest.mark.parametrize("retries", [0, 1, 3])
@pytest.mark.parametrize(
    "errors",
    [
        [rx.ConnectionError("dropped")],
        [rx.ConnectionError("dropped"), rx.TimeoutError("late")],
        [rx.ResponseError("NOSCRIPT")],
        [ValueError("not redis")],
    ],
)
def test_the_first_try_outside_the_policy_ends_as_the_policy_alone(
    retries: int, errors: list[Exception]
) -> None:
    def run(make: Callable[[list[BaseException], Callable[[], Any]], Callable[[], Any]]) -> Any:
        pending: list[BaseException] = list(errors)
        failed: list[BaseException] = []
        tries: list[int] = []

        def send() -> str:
            tries.append(1)
            if pending:
                raise pending.pop(0)
            return "reply"

        policy = Retry(NoBackoff(), retries)
        try:
            first: Exception | None = None
            try:
                result: Any = send()
            except Exception as exc:
                first = exc
            if first is not None:
                result = policy.call_with_retry(make(first, send), failed.append)
        except Exception as exc:
            result = exc
        return result, failed, len(tries)

    def before(first: Exception, send: Callable[[], Any]) -> Callable[[], Any]:
        return _plain([first], send)

    new = run(tried)
    old = run(before)
    assert new[0] is old[0] or new[0] == old[0]  # the same reply, or the same error object
    assert new[1] == old[1]
    assert new[2] == old[2]


def test_the_async_lane_hands_its_first_error_to_the_policy_too() -> None:
    async def main() -> tuple[Any, list[BaseException]]:
        error = rx.ConnectionError("dropped")
        failed: list[BaseException] = []

        async def send() -> str:
            return "reply"

        async def fail(exc: BaseException) -> None:
            failed.append(exc)

        got = await AsyncRetry(NoBackoff(), 1).call_with_retry(tried(error, send), fail)
        return got, failed

    got, failed = asyncio.run(main())
    assert got == "reply"
    assert [type(e) for e in failed] == [rx.ConnectionError]


class _Breaker(Retry):
    """An application's retry policy with a ``call_with_retry`` of its own (redis-py keeps
    one: a circuit breaker, here) that refuses every send while open."""

    opened = False  # on the class: each connection holds its own copy of the policy

    def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
        if _Breaker.opened:
            raise rx.ConnectionError("the circuit is open")
        return super().call_with_retry(do, fail, *args, **kwargs)


class _AsyncBreaker(AsyncRetry):
    async def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
        if _Breaker.opened:
            raise rx.ConnectionError("the circuit is open")
        return await super().call_with_retry(do, fail, *args, **kwargs)


@pytest.fixture
def sentinel_port() -> Iterator[int]:
    """A Sentinel naming a primary of its own (``from_sentinel``: a client settle makes,
    whose connections the lane keeps between calls)."""
    primary = EmbeddedRedis().start()
    try:
        sentinel = LocalSentinel(primary.port).start()
        try:
            yield sentinel.port
        finally:
            sentinel.close()
    finally:
        primary.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_applications_own_retry_policy_is_asked_before_every_send(
    sentinel_port: int, namespace: str, kind: str
) -> None:
    """The first try outside the policy is for redis-py's own ``Retry`` alone: a policy
    that overrides ``call_with_retry`` (a breaker, a rate limit, a count of sends), given in
    ``client_options``, is asked first on a kept connection too, as it was and as redis-py's
    ``execute_command`` asks it: nothing is sent while it refuses."""
    breaker = _Breaker(NoBackoff(), 0) if kind == "sync" else _AsyncBreaker(NoBackoff(), 0)
    options: dict[str, Any] = {
        "service_name": SERVICE,
        "client_options": {"retry": breaker},
        "namespace": namespace,
        "shards": 4,
    }
    sentinels = [("127.0.0.1", sentinel_port)]

    async def main() -> None:
        async with AsyncSettler.from_sentinel(sentinels, **options) as asettler:
            await refused_then_reserved(lambda: asettler.reserve("op-1", principal="p"))

    async def refused_then_reserved(reserve: Callable[[], Any]) -> None:
        _Breaker.opened = True
        with pytest.raises(BackendError, match="the circuit is open"):
            await _awaited(reserve())
        _Breaker.opened = False
        # nothing was recorded while it refused
        assert isinstance(await _awaited(reserve()), Reserved)

    try:
        if kind == "async":
            asyncio.run(main())
            return
        with Settler.from_sentinel(sentinels, **options) as settler:
            asyncio.run(refused_then_reserved(lambda: settler.reserve("op-1", principal="p")))
    finally:
        _Breaker.opened = False


async def _awaited(value: Any) -> Any:
    return await value if asyncio.iscoroutine(value) else value


def test_only_redis_pys_own_call_with_retry_lets_the_lane_try_first() -> None:
    class Tuned(Retry):  # another backoff, errors, checker: redis-py's tries all the same
        pass

    assert retries_as_redis_py(Retry(NoBackoff(), 3))
    assert retries_as_redis_py(AsyncRetry(NoBackoff(), 0))
    assert retries_as_redis_py(Tuned(NoBackoff(), 1, is_retryable=lambda _: True))
    assert not retries_as_redis_py(_Breaker(NoBackoff(), 0))
    assert not retries_as_redis_py(_AsyncBreaker(NoBackoff(), 0))


def _policies() -> list[Retry]:
    return [
        Retry(NoBackoff(), 0),
        Retry(NoBackoff(), 2),
        Retry(NoBackoff(), -1),  # forever
        Retry(NoBackoff(), 2, supported_errors=(rx.ConnectionError,)),  # timeouts not repeated
        Retry(NoBackoff(), 2, supported_errors=(rx.ResponseError,)),  # an odd one
        Retry(NoBackoff(), 2, is_retryable=lambda e: "again" in str(e)),
    ]


@pytest.mark.parametrize("policy", _policies(), ids=lambda p: repr(p._supported_errors))
@pytest.mark.parametrize(
    "errors",
    [
        [],
        [rx.ConnectionError("dropped")],
        [rx.ConnectionError("again"), rx.ConnectionError("again")],
        [rx.TimeoutError("late"), rx.ConnectionError("again")],
        [rx.ConnectionError("again")] * 4,
        [rx.ResponseError("NOSCRIPT"), rx.ConnectionError("again")],
        [ValueError("not redis")],
    ],
)
def test_a_first_try_handed_to_the_policy_ends_as_the_policy_alone(
    policy: Retry, errors: list[Exception]
) -> None:
    """Against redis-py's ``call_with_retry`` making every try itself (the lane before):
    the same reply or error object, the same failures handed to the failure handler, the
    same number of sends, whatever the policy's errors, retries and checker."""

    def run(first_outside: bool) -> tuple[Any, list[BaseException], int]:
        pending = list(errors)
        failed: list[BaseException] = []
        sends = 0

        def send() -> str:
            nonlocal sends
            sends += 1
            if pending:
                raise pending.pop(0)
            return "reply"

        try:
            if not first_outside:
                return policy.call_with_retry(send, failed.append), failed, sends
            try:
                reply = send()
            except Exception as exc:
                reply = policy.call_with_retry(tried(exc, send), failed.append)
            return reply, failed, sends
        except Exception as exc:
            return exc, failed, sends

    new, old = run(True), run(False)
    assert new[0] is old[0] or new[0] == old[0] == "reply"
    assert new[1:] == old[1:]
