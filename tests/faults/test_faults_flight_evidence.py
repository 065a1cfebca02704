"""A call shares a check under way (``SingleFlight``) only when that check began after the
evidence the call saw: one that began before a connection was found dropped (a restart, a
failover) read the server as it was, and a call let through on it writes unchecked on the
server that came back. Here the check under way has read the primary's policy and waits on
its replica (paused) when the primary turns evicting and a drop is found: the next call is
refused, as it is when no check is under way
(``test_a_dropped_connection_checks_the_server_before_the_next_call``). With
``min_replicas`` (the durable path, a pipeline of its own) and on a cluster nothing else
looks at the checks before the call is sent (the pipelined lane of a single server does)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from settle import AsyncSettler, ConfigurationError, Reserved, Settler
from settle.embedded import EmbeddedRedis
from tests.faults.servers import replica_of, wait_replicas

pytestmark = [pytest.mark.faults]

REQ = {"amount": 1000}


@pytest.fixture
def primary() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(extra_args=["--maxmemory-policy", "noeviction"]).start()
    yield server
    server.close()


@pytest.fixture
def replica(primary: EmbeddedRedis) -> Iterator[EmbeddedRedis]:
    server = replica_of(primary)
    wait_replicas(primary, 1)
    yield server
    server.close()


class _InfoCount:
    """The primary's INFO commands so far, but the ones this counter sent itself."""

    def __init__(self, server: EmbeddedRedis) -> None:
        self._raw = redis.Redis.from_url(server.url)
        self._own = 0

    def __call__(self) -> int:
        self._own += 1
        stats = self._raw.info("commandstats")
        return int(stats.get("cmdstat_info", {}).get("calls", 0)) - self._own

    def read_primary(self, before: int) -> bool:
        """Whether the check under way read the primary: INFO server, replication, memory."""
        return self() >= before + 3

    def close(self) -> None:
        self._raw.close()


def _options() -> dict[str, object]:
    return {"namespace": "flight", "shards": 2, "min_replicas": 1, "replica_timeout": 3.0}


def _pause(replica: EmbeddedRedis) -> None:
    with redis.Redis.from_url(replica.url) as raw:
        raw.client_pause(1500, all=True)  # the check's probe of the replica waits


def _evicting(primary: EmbeddedRedis) -> None:
    with redis.Redis.from_url(primary.url) as raw:
        raw.config_set("maxmemory-policy", "allkeys-lru")


def _written(primary: EmbeddedRedis, operation_id: str) -> bool:
    with redis.Redis.from_url(primary.url) as raw:
        return any(k.endswith(f":op:{operation_id}".encode()) for k in raw.keys("*"))


def _refused(second: object, primary: EmbeddedRedis) -> None:
    assert isinstance(second, ConfigurationError), second  # not let through on that check
    assert "allkeys-lru" in str(second)
    assert not _written(primary, "op-2")


def test_a_drop_found_while_a_check_runs_is_checked_before_the_next_call_async(
    primary: EmbeddedRedis, replica: EmbeddedRedis
) -> None:
    async def scenario() -> tuple[object, object]:
        settler = AsyncSettler.from_url(primary.url, **_options())
        infos = _InfoCount(primary)
        try:
            assert isinstance(await settler.reserve("op-0", REQ, principal="p"), Reserved)
            settler._runner.suspect()  # evidence of a loss (as NOSCRIPT): the check is due
            before = infos()
            _pause(replica)
            leader = asyncio.create_task(settler.reserve("op-1", REQ, principal="p"))
            deadline = time.monotonic() + 5
            while not infos.read_primary(before):
                assert time.monotonic() < deadline, "the check never read the primary"
                await asyncio.sleep(0.01)
            assert not leader.done()  # its check waits on the replica
            _evicting(primary)
            settler._runner.dropped()  # what the lane reports on a connection found closed
            after = await asyncio.gather(
                settler.reserve("op-2", REQ, principal="p"), return_exceptions=True
            )
            return await leader, after[0]
        finally:
            infos.close()
            await settler.aclose()

    first, second = asyncio.run(scenario())
    assert isinstance(first, Reserved)  # its check began before the drop, and passed
    _refused(second, primary)


def test_a_drop_found_while_a_check_runs_is_checked_before_the_next_call_sync(
    primary: EmbeddedRedis, replica: EmbeddedRedis
) -> None:
    settler = Settler.from_url(primary.url, **_options())
    infos = _InfoCount(primary)
    try:
        assert isinstance(settler.reserve("op-0", REQ, principal="p"), Reserved)
        settler._runner.suspect()
        before = infos()
        _pause(replica)
        found: list[object] = []
        leader = threading.Thread(
            target=lambda: found.append(settler.reserve("op-1", REQ, principal="p"))
        )
        leader.start()
        deadline = time.monotonic() + 5
        while not infos.read_primary(before):
            assert time.monotonic() < deadline, "the check never read the primary"
            time.sleep(0.01)
        assert leader.is_alive()
        _evicting(primary)
        settler._runner.dropped()
        try:
            second: object = settler.reserve("op-2", REQ, principal="p")
        except ConfigurationError as exc:
            second = exc
        leader.join(10)
        assert isinstance(found[0], Reserved)
        _refused(second, primary)
    finally:
        infos.close()
        settler.close()
