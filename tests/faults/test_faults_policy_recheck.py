"""The eviction check is not made once per process (review of durability, item 1): a part
started on ``noeviction`` refuses to write once the policy became an evicting one, checked
again at most every ``recheck_interval`` seconds on the call path, and at once on evidence
that the server lost its data or restarted (a shard's ``unclaimed`` reply, NOSCRIPT or a
missing FUNCTION library). Each test starts its own real server and changes its policy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

from settle import AsyncSettler, BackendError, ConfigurationError, Reserved, Settler
from settle._core.keys import Keys
from settle._core.scripts import SCRIPTS
from settle.cursor import AsyncCursorStore, CursorStore
from settle.embedded import EmbeddedRedis
from settle.progress import (
    AsyncProgressStore,
    DeliveryId,
    EmissionId,
    ProgressStore,
    ProviderScope,
)
from tests.acl import app_user
from tests.faults.servers import proxy_to, script_needle

pytestmark = [pytest.mark.faults]

SCOPE = ProviderScope("orders", "billing", "i1")


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    running = EmbeddedRedis(extra_args=["--maxmemory-policy", "noeviction"]).start()
    yield running
    running.close()


def _raw(server: EmbeddedRedis) -> redis.Redis:
    return redis.Redis.from_url(server.url)


def _evicting(server: EmbeddedRedis) -> None:
    with _raw(server) as raw:
        raw.config_set("maxmemory-policy", "allkeys-lru")


def _keys(server: EmbeddedRedis) -> int:
    with _raw(server) as raw:
        return int(raw.dbsize())


async def _nothing(ctx: object) -> None:
    return None


class _Part:
    """One part (core, cursor, progress) in one flavour: ``write(i)`` is a call that writes
    a new key; ``runner`` the part's runner."""

    def __init__(self, flavour: str, part: str, url: str) -> None:
        self.flavour = flavour
        self.loop = asyncio.new_event_loop() if flavour == "async" else None
        sync = flavour == "sync"
        if part == "settler":
            self.store: Any = (Settler if sync else AsyncSettler).from_url(
                url, namespace="recheck", shards=2
            )
            self._write = lambda i: self.store.reserve(f"op-{i}", {"n": i}, principal="p")
        elif part == "cursor":
            self.store = (CursorStore if sync else AsyncCursorStore).from_url(
                url, namespace="recheck"
            )
            self._write = lambda i: self.store.start(f"stream-{i}", b"c0")
        else:
            self.store = (ProgressStore if sync else AsyncProgressStore).from_url(
                url, consumer="billing", namespace="recheck"
            )
            effect = (lambda ctx: None) if sync else _nothing
            self._write = lambda i: self.store.apply(
                SCOPE, DeliveryId(f"{i + 1}-1"), EmissionId(f"e{i}"), effect
            )

    @property
    def runner(self) -> Any:
        return self.store._runner

    def _do(self, value: Any) -> Any:
        return self.loop.run_until_complete(value) if self.loop is not None else value

    def write(self, i: int) -> Any:
        return self._do(self._write(i))

    def close(self) -> None:
        self._do(self.store.close() if self.loop is None else self.store.aclose())
        if self.loop is not None:
            self.loop.close()


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("part", ["settler", "cursor", "progress"])
def test_a_policy_changed_at_run_time_is_refused_once_the_interval_passed(
    server: EmbeddedRedis, flavour: str, part: str
) -> None:
    p = _Part(flavour, part, server.url)
    try:
        p.runner.recheck_interval = 3600.0
        p.write(0)
        _evicting(server)
        p.write(1)  # within the interval: not read again (docs/operations.md says so)
        written = _keys(server)
        p.runner.recheck_interval = 0.0  # the interval has passed
        with pytest.raises(ConfigurationError, match="allkeys-lru"):
            p.write(2)
        assert _keys(server) == written  # nothing was written
        with pytest.raises(ConfigurationError, match="allkeys-lru"):
            p.write(3)  # and again on the next call, not once
        with _raw(server) as raw:
            raw.config_set("maxmemory-policy", "noeviction")
        p.write(4)  # set right again: the part writes again
    finally:
        p.close()


def _lose_shard_state(server: EmbeddedRedis, operation_id: str) -> str:
    keys = Keys("recheck", 2)
    state = keys.generation(keys.of(operation_id)[0])
    with _raw(server) as raw:
        assert raw.delete(state) == 1
    return state


def test_an_unclaimed_reply_checks_the_server_again_at_once(
    server: EmbeddedRedis, flavour: str
) -> None:
    # The default interval (30 s) has not passed: the 'unclaimed' reply alone (a shard whose
    # state is gone) makes the next call check the policy, before the shard is claimed.
    p = _Part(flavour, "settler", server.url)
    try:
        first = p.write(0)
        assert isinstance(first, Reserved)
        p._do(p.store.complete(first.reservation, {"ok": True}))
        state = _lose_shard_state(server, "op-0")
        _evicting(server)
        written = _keys(server)
        with pytest.raises(ConfigurationError, match="allkeys-lru"):
            p._do(p.store.reserve("op-0", {"n": 0}, principal="p"))
        assert _keys(server) == written
        with _raw(server) as raw:
            assert not raw.exists(state)  # the shard was not claimed
    finally:
        p.close()


@pytest.mark.parametrize("part", ["settler", "cursor", "progress"])
def test_scripts_lost_by_the_server_check_it_again_at_once(
    server: EmbeddedRedis, flavour: str, part: str
) -> None:
    # NOSCRIPT (Redis 6.2) or "Function not found" (Redis 7, Valkey) means a restart without
    # persistence or a flush: what else the server changed is unknown, so it is checked.
    p = _Part(flavour, part, server.url)
    try:
        p.write(0)
        with _raw(server) as raw:
            raw.config_set("maxmemory-policy", "allkeys-lru")
            raw.script_flush()
            if int(raw.info("server")["redis_version"].split(".")[0]) >= 7:
                raw.function_flush()
        written = _keys(server)
        with pytest.raises(ConfigurationError, match="allkeys-lru"):
            p.write(1)
        assert _keys(server) == written
    finally:
        p.close()


@pytest.mark.parametrize("part", ["settler", "cursor", "progress"])
def test_a_dropped_connection_checks_the_server_before_the_next_call(
    server: EmbeddedRedis, flavour: str, part: str
) -> None:
    # A kept connection found closed by the server (as a restart closes it): the call that
    # finds it checks the server before it sends anything on a new connection.
    p = _Part(flavour, part, server.url)
    try:
        p.write(0)
        _evicting(server)
        with _raw(server) as raw:
            raw.client_kill_filter(_type="normal", skipme=True)
        time.sleep(0.1)  # the server's FIN reaches the kept connection
        before = _keys(server)
        with pytest.raises(ConfigurationError, match="allkeys-lru"):
            p.write(1)
        assert _keys(server) == before  # nothing was written
    finally:
        p.close()


def test_evidence_during_a_check_leaves_the_checks_due(server: EmbeddedRedis) -> None:
    """A check that was running when evidence came (a dropped connection, a lost script)
    read the server as it was before: it must not mark the server checked."""
    settler = AsyncSettler.from_url(server.url, namespace="recheck", shards=2)

    async def scenario() -> None:
        runner = settler._runner
        for evidence in (runner.suspect, runner.dropped):
            checking = asyncio.create_task(runner.prepare())
            await asyncio.sleep(0)  # the check is on the wire (INFO server)
            assert not checking.done()
            evidence()
            await checking
            assert runner._due()
            await runner.prepare()  # a check with no evidence during it
            assert not runner._due()
        await settler.aclose()

    asyncio.run(scenario())


def _info_calls(server: EmbeddedRedis) -> int:
    with _raw(server) as raw:
        stats = raw.info("commandstats")
    return int(stats.get("cmdstat_info", {}).get("calls", 0))


def test_every_repeat_after_a_dropped_connection_checks_first(
    server: EmbeddedRedis, flavour: str
) -> None:
    """Two tries of a call cut in a row: the second repeat is checked too (only the first
    ConnectionError made the checks due, and the check before the first repeat marked the
    server checked, so the third try went out unchecked), and the retry events count the
    call's tries, 1 and 2 of 4."""
    proxy = proxy_to(server.url, SCRIPTS)
    p = _Part(flavour, "settler", proxy.url)
    try:
        p.write(0)
        proxy.cut(script_needle(SCRIPTS, "reserve"), "before_request", times=2)
        with _raw(server) as raw:
            raw.config_resetstat()
        with capture_logs() as logs:
            assert isinstance(p.write(1), Reserved)
        assert proxy.fired == ["before_request", "before_request"]
        retries = [e for e in logs if e["event"] == "settle.backend.retrying"]
        assert [(e["script"], e["attempt"]) for e in retries] == [("reserve", 1), ("reserve", 2)]
        assert _info_calls(server) >= 2  # a policy read before each of the two repeats
    finally:
        p.close()
        proxy.close()


def test_a_server_gone_after_a_drop_fails_the_call_after_its_own_tries(
    server: EmbeddedRedis, flavour: str
) -> None:
    """The check before a repeat is one of the call's tries: a server that stays gone fails
    the call after four tries in all, each retry event naming the call's script."""
    proxy = proxy_to(server.url, SCRIPTS)
    p = _Part(flavour, "settler", proxy.url)
    try:
        p.write(0)
        proxy.close()  # refused from now on, the kept connections dropped
        with capture_logs() as logs, pytest.raises(BackendError, match="after 4 tries") as info:
            p.write(1)
        retries = [e for e in logs if e["event"] == "settle.backend.retrying"]
        assert [(e["script"], e["attempt"]) for e in retries] == [
            ("reserve", 1),
            ("reserve", 2),
            ("reserve", 3),
        ]
        assert info.value.operation_id == "op-1"
    finally:
        p.close()


def test_a_command_that_is_not_repeated_still_has_its_check_repeated(
    server: EmbeddedRedis,
) -> None:
    """progress reads its deliveries with XREADGROUP, never repeated (a repeat would claim
    other deliveries): the check before it is repeatable, and a failure of the read itself
    says it was sent once."""
    proxy = proxy_to(server.url)
    store = ProgressStore.from_url(proxy.url, consumer="billing", namespace="recheck")
    try:
        runner = store._runner
        sent: list[int] = []

        def send(_client: object) -> int:
            sent.append(1)
            return 7

        runner.recheck_interval = 0.0  # a check is due before every command
        proxy.cut("INFO", "before_request")  # the check's first try is cut
        with capture_logs() as logs:
            assert runner.command("XREADGROUP", send, repeatable=False) == 7
        assert sent == [1]
        assert [e["attempt"] for e in logs if e["event"] == "settle.backend.retrying"] == [1]

        def failing(_client: object) -> int:
            raise redis.ConnectionError("cut")

        runner.recheck_interval = 3600.0
        with pytest.raises(BackendError) as info:
            runner.command("XREADGROUP", failing, repeatable=False)
        assert "tries" not in str(info.value)
    finally:
        store.close()
        proxy.close()


# The checks reach every way a call is sent: calls queued on the pipelined lane behind a
# dropped connection, pipelined reads meeting a lost script, a server found without FUNCTION.


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
    url = app_user(server, "+@all")
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
