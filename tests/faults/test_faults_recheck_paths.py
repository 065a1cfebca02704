"""The server checks reach every way a call is sent (the review of the checks on the call
path): a call that another call's discovery of a dropped connection made due waits for the
check, even if it was queued on the pipelined lane before; pipelined reads take a lost
script as the evidence it is; a server found without FUNCTION after a check goes back to
EVALSHA. Each test starts its own real server and changes its policy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis

from settle import AsyncSettler, ConfigurationError, Reserved, Settler
from settle.embedded import EmbeddedRedis

pytestmark = [pytest.mark.faults]


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    running = EmbeddedRedis(extra_args=["--maxmemory-policy", "noeviction"]).start()
    yield running
    running.close()


def _raw(server: EmbeddedRedis) -> redis.Redis:
    return redis.Redis.from_url(server.url)


def _records(server: EmbeddedRedis) -> list[bytes]:
    with _raw(server) as raw:
        return sorted(k for k in raw.keys("*") if b":op:" in k)


def test_calls_queued_when_a_drop_is_found_wait_for_the_check(server: EmbeddedRedis) -> None:
    """Calls queued on the pipelined lane behind one on the wire had looked at the checks
    before a dropped connection was found (here reported as the lane reports it): they go
    out on a new connection of the pool, so that is where the check must come first. Every
    one is refused, nothing is written, and each refusal names its own operation."""

    async def scenario() -> tuple[object, list[BaseException | object]]:
        settler = AsyncSettler.from_url(server.url, namespace="lanes", shards=2)
        try:
            assert isinstance(await settler.reserve("op-0", {"n": 0}, principal="p"), Reserved)
            on_the_wire = asyncio.create_task(settler.reserve("op-1", {"n": 1}, principal="p"))
            await asyncio.sleep(0)  # op-1 is sent on the kept connection
            queued = [
                asyncio.create_task(settler.reserve(f"op-{i}", {"n": i}, principal="p"))
                for i in range(2, 10)
            ]
            await asyncio.sleep(0)  # each looked at the checks (none due) and is queued
            with _raw(server) as raw:
                raw.config_set("maxmemory-policy", "allkeys-lru")
            settler._runner.dropped()  # what the lane reports on a connection found closed
            first = await on_the_wire
            return first, await asyncio.gather(*queued, return_exceptions=True)
        finally:
            await settler.aclose()

    first, results = asyncio.run(scenario())
    assert isinstance(first, Reserved)  # sent before the drop was found
    assert all(isinstance(r, ConfigurationError) for r in results), results
    assert {r.operation_id for r in results if isinstance(r, ConfigurationError)} == {
        f"op-{i}" for i in range(2, 10)
    }
    assert {key.rsplit(b":op:", 1)[1] for key in _records(server)} == {b"op-0", b"op-1"}


def test_pipelined_reads_take_a_lost_script_as_evidence(server: EmbeddedRedis) -> None:
    """The quarantine's reads go pipelined: a script the server lost (a restart without
    persistence, SCRIPT FLUSH) checks the server as on any other call, instead of being
    loaded again quietly."""
    with Settler.from_url(server.url, namespace="lanes", shards=2) as settler:
        settler.quarantine.list()
        with _raw(server) as raw:
            raw.config_set("maxmemory-policy", "allkeys-lru")
            raw.script_flush()
            if int(raw.info("server")["redis_version"].split(".")[0]) >= 7:
                raw.function_flush()
        with pytest.raises(ConfigurationError, match="allkeys-lru"):
            settler.quarantine.list()


def test_a_server_that_refuses_function_after_a_loss_is_called_with_evalsha(
    server: EmbeddedRedis,
) -> None:
    """Redis 7+: the library is lost and the user may no longer load one (an ACL change, a
    managed service's rollback): the check decides EVALSHA, and the call goes that way (it
    tried to load the library regardless, and failed blaming the credentials)."""
    with _raw(server) as raw:
        if int(raw.info("server")["redis_version"].split(".")[0]) < 7:
            pytest.skip("FUNCTION libraries exist on Redis 7+ and Valkey only")
        raw.acl_setuser(
            "app",
            enabled=True,
            passwords=["+pw"],
            keys=["*"],
            channels=["*"],
            commands=["+@all"],
        )
    url = f"redis://app:pw@127.0.0.1:{server.port}/0"
    with Settler.from_url(url, namespace="lanes", shards=2) as settler:
        assert isinstance(settler.reserve("op-0", {"n": 0}, principal="p"), Reserved)
        assert settler._runner._fcall
        with _raw(server) as raw:
            raw.acl_setuser("app", commands=["-function"])
            raw.function_flush()
        time.sleep(0)
        assert isinstance(settler.reserve("op-1", {"n": 1}, principal="p"), Reserved)
        assert not settler._runner._fcall
        settler.quarantine.list()  # the pipelined reads too
