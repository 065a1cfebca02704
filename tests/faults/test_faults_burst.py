"""A burst of calls on a settler (or a cursor or progress store) that has not run its
start-up checks yet: a fresh one, one whose server was flushed (FLUSHALL) or restarted
without persistence. Every call used to run the checks itself (``INFO``, the namespace
check, the shard claims), each on a connection of redis-py's pool of 100, which raises
instead of waiting: most calls of the burst failed with ``BackendError ...
MaxConnectionsError``. The calls share one run of each check now: every call succeeds, and
the server sees each check once, as many times as for one call alone (counted with
MONITOR)."""

from __future__ import annotations

import asyncio
import collections
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

from settle import AsyncSettler, ConfigurationError, Reserved, Settler
from settle._core.scripts import SCRIPTS
from settle._runtime.scripts import ScriptSet
from settle.cursor import AsyncCursorStore
from settle.cursor._scripts import SCRIPTS as CURSOR_SCRIPTS
from settle.embedded import EmbeddedRedis
from settle.progress import AsyncProgressStore
from tests.faults.servers import script_sha

pytestmark = [pytest.mark.faults]

REQ = {"amount": 1000}
WHO = "tenant:acme"
#: Concurrent tasks of an asyncio burst: well over the pool's 100 connections.
TASKS = 400
#: Threads of a sync burst: under the pool's 100 (each thread holds one connection while its
#: call is on the wire, so more threads than connections fail warm too).
THREADS = 90


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as s:  # persistence off: a restart comes back empty
        yield s


class Seen:
    """The commands the server received while a block ran (MONITOR), but the scripts' own."""

    def __init__(self) -> None:
        self.commands: list[str] = []

    def count(self, prefix: str) -> int:
        return sum(1 for c in self.commands if c.upper().startswith(prefix.upper()))

    def script(self, scripts: ScriptSet, name: str) -> int:
        """How many times ``name`` ran: by EVALSHA (Redis 6.2) or FCALL (7+, Valkey)."""
        return self.count(f"EVALSHA {script_sha(scripts, name)}") + self.count(
            f"FCALL {scripts.function(name)} "
        )

    def checks(self, scripts: ScriptSet = SCRIPTS) -> dict[str, int]:
        """The check commands: INFO (every section), the namespace check, the shard claims."""
        found = {"INFO": self.count("INFO ")}
        if scripts is SCRIPTS:
            found["namespace"] = self.script(SCRIPTS, "namespace")
            found["claim"] = self.script(SCRIPTS, "claim")
        return found


@contextmanager
def monitored(server: EmbeddedRedis) -> Iterator[Seen]:
    seen = Seen()
    marker = f"end-{uuid.uuid4().hex}"
    raw = redis.Redis.from_url(server.url)
    ready = threading.Event()

    def watch() -> None:
        with raw.monitor() as monitor:
            ready.set()
            while True:
                entry = monitor.next_command()
                if entry["client_type"] == "lua":  # a script's own commands
                    continue
                command = str(entry["command"])
                if marker in command:
                    return
                seen.commands.append(command)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    assert ready.wait(5)
    try:
        yield seen
    finally:
        with redis.Redis.from_url(server.url) as other:
            other.echo(marker)
        thread.join(10)
        raw.close()
        assert not thread.is_alive()


async def _burst(call: Callable[[int], Awaitable[Any]], n: int = TASKS) -> collections.Counter[str]:
    async def one(i: int) -> str:
        try:
            return type(await call(i)).__name__
        except Exception as exc:
            return f"{type(exc).__name__}: {str(exc)[:90]}"

    return collections.Counter(await asyncio.gather(*(one(i) for i in range(n))))


def _threads(call: Callable[[int], Any], n: int = THREADS) -> collections.Counter[str]:
    out: collections.Counter[str] = collections.Counter()
    lock, go = threading.Lock(), threading.Event()

    def one(i: int) -> None:
        go.wait()
        try:
            found = type(call(i)).__name__
        except Exception as exc:
            found = f"{type(exc).__name__}: {str(exc)[:90]}"
        with lock:
            out[found] += 1

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    go.set()
    for thread in threads:
        thread.join(60)
    return out


async def _alone_async(server: EmbeddedRedis, namespace: str) -> dict[str, int]:
    """The checks one call alone makes on a cold settler (what a burst must not exceed)."""
    with monitored(server) as seen:
        async with AsyncSettler.from_url(server.url, namespace=namespace, shards=16) as alone:
            await alone.reserve("alone", REQ, principal=WHO, lease=30)
    return seen.checks()


@pytest.mark.asyncio
async def test_a_burst_on_a_fresh_async_settler_runs_the_checks_once(
    server: EmbeddedRedis,
) -> None:
    alone = await _alone_async(server, "alone")
    settler = AsyncSettler.from_url(server.url, namespace="burst", shards=16)
    try:
        with monitored(server) as seen:
            results = await _burst(
                lambda i: settler.reserve(f"op-{i}", REQ, principal=WHO, lease=30)
            )
        assert results == {"Reserved": TASKS}
        assert seen.checks() == alone  # INFO, the namespace check, the claims: once
    finally:
        await settler.aclose()


@pytest.mark.asyncio
async def test_a_burst_right_after_flushall_runs_the_checks_again_once(
    server: EmbeddedRedis,
) -> None:
    settler = AsyncSettler.from_url(server.url, namespace="burst", shards=16)
    single = AsyncSettler.from_url(server.url, namespace="single", shards=16)
    try:
        await settler.reserve("warm", REQ, principal=WHO, lease=30)
        await single.reserve("warm", REQ, principal=WHO, lease=30)
        with redis.Redis.from_url(server.url) as raw:
            raw.flushall()
        with monitored(server) as seen:  # what one call after the loss checks
            await single.reserve("one", REQ, principal=WHO, lease=30)
        alone = seen.checks()
        with redis.Redis.from_url(server.url) as raw:
            raw.flushall()
        with capture_logs() as logs, monitored(server) as seen:
            results = await _burst(
                lambda i: settler.reserve(f"op-{i}", REQ, principal=WHO, lease=30)
            )
        assert results == {"Reserved": TASKS}
        assert seen.checks() == alone
        assert alone["INFO"] > 0  # the loss was checked: the server
        assert alone["claim"] > 0  # and the shards
        lost = [e for e in logs if e["event"] == "settle.namespace.state_lost"]
        assert len(lost) == 1  # an operator still hears of it, once
    finally:
        await settler.aclose()
        await single.aclose()


@pytest.mark.asyncio
async def test_a_burst_right_after_a_restart_without_persistence_succeeds(
    server: EmbeddedRedis,
) -> None:
    settler = AsyncSettler.from_url(server.url, namespace="burst", shards=16)
    try:
        first = await _burst(lambda i: settler.reserve(f"a-{i}", REQ, principal=WHO, lease=30))
        assert first == {"Reserved": TASKS}  # connections kept, scripts loaded
        server.stop(kill=True)
        server.start()  # the same port, empty: no scripts, no namespace, no shard state
        with monitored(server) as seen:
            results = await _burst(
                lambda i: settler.reserve(f"b-{i}", REQ, principal=WHO, lease=30)
            )
        assert results == {"Reserved": TASKS}
        checks = seen.checks()
        # Once the loss was found: the full check (INFO server, replication, memory) and
        # policy re-reads (INFO memory) for the dropped connections, one per evidence count
        # (a connection found closed after a re-read began gets its own: rev-fix-start's
        # rule), so a few, however many calls (each of the 400 ran its own on the code
        # before); one namespace check (the metadata found missing, then created) and the
        # claims of one start-up's (the surviving states checked, then claimed).
        assert seen.count("INFO server") == 1
        assert checks["INFO"] <= 8
        assert checks["namespace"] == 2
        assert checks["claim"] == 2 * 16
    finally:
        await settler.aclose()


def test_threads_on_a_cold_sync_settler_share_the_checks(server: EmbeddedRedis) -> None:
    with monitored(server) as seen, Settler.from_url(server.url, namespace="one") as alone:
        alone.reserve("alone", REQ, principal=WHO, lease=30)
    single = seen.checks()
    settler = Settler.from_url(server.url, namespace="burst")
    try:
        with monitored(server) as seen:
            results = _threads(lambda i: settler.reserve(f"t-{i}", REQ, principal=WHO, lease=30))
        assert results == {"Reserved": THREADS}
        assert seen.checks() == single
        with redis.Redis.from_url(server.url) as raw:
            raw.flushall()
        with monitored(server) as seen:
            results = _threads(lambda i: settler.reserve(f"u-{i}", REQ, principal=WHO, lease=30))
        assert results == {"Reserved": THREADS}
        assert seen.checks()["INFO"] == single["INFO"]
        assert seen.checks()["claim"] == single["claim"]
    finally:
        settler.close()


@pytest.mark.asyncio
async def test_a_burst_on_a_cold_cursor_store_checks_the_server_once(
    server: EmbeddedRedis,
) -> None:
    with monitored(server) as seen:
        async with AsyncCursorStore.from_url(server.url, namespace="one") as alone:
            await alone.start("alone", b"c")
    single = seen.checks(CURSOR_SCRIPTS)
    store = AsyncCursorStore.from_url(server.url, namespace="cs")
    try:
        with monitored(server) as seen:
            results = await _burst(lambda i: store.start(f"s-{i}", b"c"))
        assert results == {"Checkpoint": TASKS}
        assert seen.checks(CURSOR_SCRIPTS) == single
    finally:
        await store.aclose()


@pytest.mark.asyncio
async def test_a_burst_on_a_cold_progress_store_checks_the_server_once(
    server: EmbeddedRedis,
) -> None:
    store = AsyncProgressStore.from_url(server.url, consumer="c", namespace="ps")
    try:
        with monitored(server) as seen:
            results = await _burst(lambda i: store.scopes())
        assert set(results) == {"list"}, results
        assert seen.checks(CURSOR_SCRIPTS) == {"INFO": 3}  # server, replication, memory
    finally:
        await store.aclose()


@pytest.mark.asyncio
async def test_a_refused_check_reaches_every_call_of_the_burst_and_the_next_call_checks_again(
    server: EmbeddedRedis,
) -> None:
    with redis.Redis.from_url(server.url) as raw:
        raw.config_set("maxmemory-policy", "allkeys-lru")
    settler = AsyncSettler.from_url(server.url, namespace="refused")
    try:
        errors: list[BaseException] = []

        async def one(i: int) -> None:
            try:
                await settler.reserve(f"op-{i}", REQ, principal=WHO, lease=30)
            except ConfigurationError as exc:
                errors.append(exc)

        with monitored(server) as seen:
            await asyncio.gather(*(one(i) for i in range(TASKS)))
        assert len(errors) == TASKS
        assert all("allkeys-lru" in str(e) for e in errors)
        # Each call's error is its own, naming its own operation.
        assert sorted(e.operation_id or "" for e in errors) == sorted(
            f"op-{i}" for i in range(TASKS)
        )
        assert seen.count("INFO memory") == 1  # one check, its refusal shared
        with redis.Redis.from_url(server.url) as raw:
            raw.config_set("maxmemory-policy", "noeviction")
        again = await settler.reserve("after", REQ, principal=WHO, lease=30)
        assert isinstance(again, Reserved)  # the next call checked again
    finally:
        await settler.aclose()


@pytest.mark.asyncio
async def test_a_burst_when_the_policy_recheck_falls_due_reads_the_policy_once(
    server: EmbeddedRedis,
) -> None:
    """The periodic re-read of the eviction policy (every ``recheck_interval``) falls due
    for every call of the burst at once: one ``INFO memory`` for all of them, not one each
    on a connection of the pool."""
    settler = AsyncSettler.from_url(server.url, namespace="recheck", shards=16)
    try:
        await settler.reserve("warm", REQ, principal=WHO, lease=30)
        settler._runner.recheck_interval = 2.0  # longer than the burst takes
        await asyncio.sleep(2.1)
        with monitored(server) as seen:
            results = await _burst(
                lambda i: settler.reserve(f"op-{i}", REQ, principal=WHO, lease=30)
            )
        assert results == {"Reserved": TASKS}
        assert seen.count("INFO memory") == 1
        assert seen.count("INFO server") == 0  # the policy alone: no full check
    finally:
        await settler.aclose()
