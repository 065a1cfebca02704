"""The sync lane's shortcuts around redis-py (docs/benchmarks.md, the sixteenth round) answer
what redis-py's own calls answer: the check of a kept connection (``packing.can_read``) and
the first try made outside the connection's retry policy (``packing.tried``)."""

from __future__ import annotations

import asyncio
import select
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.exceptions as rx
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from settle._runtime.packing import can_read, tried


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
        conn.read_response()  # and it is the hiredis reader's own buffer next time
        conn.send_command("PING")
        conn.send_command("PING")
        assert conn.read_response() == b"PONG"
        assert _outcome(lambda: can_read(conn)) == _outcome(conn.can_read)
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
