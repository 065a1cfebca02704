"""Real servers the durability and fault tests of every part share (the core, ``settle.cursor``,
``settle.progress``): a replica of a primary, waiting until the primary's replicas acknowledge,
a replica frozen with SIGSTOP, a connection-cutting proxy whose server's script cache already
holds a part's scripts, and redis-py clients whose own retries are off.

The ``primary`` and ``replica`` fixtures are used by importing them into a test module."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from settle._runtime import ScriptSet
from settle.attempt import Attempt
from settle.embedded import EmbeddedRedis
from tests.faults.tcp_proxy import FaultyProxy

__all__ = [
    "REPLICA_TIMEOUT",
    "SLACK",
    "SOCKET_TIMEOUT",
    "STALL_TIMEOUT",
    "UNSTALLED_TIMEOUT",
    "async_client",
    "cut_timeout",
    "frozen",
    "lapse_under",
    "primary",
    "proxy_to",
    "replica",
    "replica_of",
    "script_needle",
    "script_sha",
    "sync_client",
    "until",
    "wait_replicas",
]

#: The client's own socket timeout, so a stalled reply surfaces as a TimeoutError quickly.
SOCKET_TIMEOUT = 0.5
#: The socket timeout of a test that stalls one reply and counts the repeats: the stalled
#: call ends in two seconds, and no other call of a loaded CI worker (four tests on two
#: cores) waits that long for its reply; at 0.5 s one could, and was repeated too.
STALL_TIMEOUT = 2.0
#: The socket timeout of a test whose proxy stalls no reply: no call is meant to time out,
#: and none does however loaded the machine (a cut closes the connection: an error at once).
UNSTALLED_TIMEOUT = 30.0
#: The ``replica_timeout`` of the companions' durability tests.
REPLICA_TIMEOUT = 0.3
#: How far past ``replica_timeout`` a DurabilityError may come: Redis checks WAIT timeouts
#: at ``hz`` (10/s), plus a loaded CI box; four tries would take 4 x 0.3 s and more.
SLACK = 0.8


def replica_of(primary: EmbeddedRedis) -> EmbeddedRedis:
    return EmbeddedRedis(extra_args=["--replicaof", "127.0.0.1", str(primary.port)]).start()


def acks(client: redis.Redis, replicas: int = 1, timeout_ms: int = 200) -> int:
    """How many replicas (up to ``replicas``) have every write the server took so far:
    WAIT's answer. WAIT counts only the writes of its own connection, and Valkey answers a
    connection that wrote nothing at once, whatever its replicas hold (a graceful failover
    made then lost a reservation another connection wrote): this one writes first, a
    PUBLISH, which goes to the replicas in the stream of writes and touches no key. Not on
    a cluster node, where a PUBLISH goes by the cluster bus instead
    (``tests.cluster.cluster_support.node_acks``)."""
    client.publish("settle-tests:wait", b"")
    return int(client.execute_command("WAIT", replicas, timeout_ms))


def wait_replicas(primary: EmbeddedRedis, count: int, timeout: float = 30.0) -> None:
    """Wait until ``primary`` has ``count`` replicas online that acknowledge a write: a set-up
    wait, never a bound a test asserts (a first full sync beside busy CI workers took over
    10 s once, and the test errored before it began)."""
    with redis.Redis.from_url(primary.url) as raw:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = raw.info("replication")
            online = sum(
                1
                for key, value in info.items()
                if key.startswith("slave") and isinstance(value, dict)
                if value.get("state") == "online"
            )
            # "online" is not yet "acknowledging": a replica just out of its first sync
            # can take a while to answer WAIT on a loaded machine. Wait until one write is
            # acknowledged by all of them, so the test's own short WAIT timeout measures
            # the replica, not its start-up.
            if online == count and info["connected_slaves"] == count:
                raw.set("settle-test:replication-probe", "1")
                if count == 0 or int(raw.execute_command("WAIT", count, 1000)) >= count:
                    return
            time.sleep(0.02)
    raise AssertionError(f"the primary never had {count} online replicas")


@pytest.fixture
def primary() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis().start()
    yield server
    server.close()


@pytest.fixture
def replica(primary: EmbeddedRedis) -> Iterator[EmbeddedRedis]:
    """A replica of ``primary`` that already acknowledges writes."""
    server = replica_of(primary)
    wait_replicas(primary, 1)
    yield server
    server.close()


@contextmanager
def frozen(server: EmbeddedRedis) -> Iterator[None]:
    """SIGSTOP ``server`` for the block: its primary still counts it as connected (until
    ``repl-timeout``), so a ``WAIT`` runs to its full timeout, as with a hung replica."""
    assert server.process is not None
    pid = server.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def lapse_under(server: EmbeddedRedis, attempt: Attempt, logs: list[dict[str, Any]]) -> None:
    """Hold ``server`` (frozen) past the 0.6 s lease of the running ``attempt``, renewed by the
    sync heartbeat threads (a slow Redis: the renewal waits; a GC pause holds it the same
    way), then wait for the heartbeat's answer: the lease lapsed with nobody taking the key
    over (``settle.operation.lease_lapsed`` in the captured ``logs``), or the attempt lost."""
    with frozen(server):
        time.sleep(1.2)
    lapsed = "settle.operation.lease_lapsed"
    assert until(lambda: attempt.lost or any(e["event"] == lapsed for e in logs))


def until(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    """Whether ``condition()`` came true within ``seconds`` (polled every 10 ms)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def script_sha(scripts: ScriptSet, name: str) -> str:
    """The SHA a runner sends in ``EVALSHA`` for ``name`` (a proxy cut's needle)."""
    return hashlib.sha1(scripts.source(name).encode()).hexdigest()


def script_needle(scripts: ScriptSet, name: str) -> tuple[str, str]:
    """What a runner sends to call ``name``: the SHA in ``EVALSHA`` (Redis 6.2) or the
    function's name in ``FCALL`` (Redis 7+, Valkey) as one RESP argument (the library's text
    in ``FUNCTION LOAD`` holds the name too, inside a line); a proxy cut matches either."""
    return script_sha(scripts, name), f"\r\n{scripts.function(name)}\r\n"


def proxy_to(server_url: str, *sets: ScriptSet) -> FaultyProxy:
    """A started proxy to the server of ``server_url``, whose script cache holds every script
    of ``sets`` (the steady state: a cut then strikes the script itself, not a NOSCRIPT
    reply). Close it with ``proxy.close()``."""
    with redis.Redis.from_url(server_url) as raw:
        port = int(raw.connection_pool.connection_kwargs["port"])
        for scripts in sets:
            for name in scripts:
                raw.script_load(scripts.source(name))
    return FaultyProxy(port).start()


def sync_client(port: int, socket_timeout: float = SOCKET_TIMEOUT) -> redis.Redis:
    """A client with redis-py's own retries off, so every repeat of a call is settle's."""
    return redis.Redis(port=port, retry=Retry(NoBackoff(), 0), socket_timeout=socket_timeout)


def async_client(port: int, socket_timeout: float = SOCKET_TIMEOUT) -> aioredis.Redis:
    """The asyncio twin of :func:`sync_client`."""
    return aioredis.Redis(
        port=port, retry=AsyncRetry(NoBackoff(), 0), socket_timeout=socket_timeout
    )


def cut_timeout(at: str) -> float:
    """The socket timeout of a test that cuts one call ``at`` and counts the repeats: short
    only for a stall, which the timeout ends (:data:`STALL_TIMEOUT`)."""
    return STALL_TIMEOUT if at == "stall" else UNSTALLED_TIMEOUT
