"""The deployment rows of ``python -m benchmarks.anomalies``: faults of the Redis deployment
rather than of the caller. Each scenario starts the servers it needs (an evicting server, a
server without persistence, a cluster with replicas, a primary with a replica behind a
Sentinel; the cluster, Sentinel and link-cutting proxy are the test suite's) and runs one
operation against it; the downstream ledger stays on the run's own server, so every effect
is counted whatever happens to the store.

Each scenario is ``(library, env, scope) -> Observation``: it builds its own contender on its
own deployment.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis
from redis.crc import key_slot
from redis.sentinel import Sentinel

from benchmarks._contenders import Peer, Settle, order
from benchmarks._outcomes import outcome
from settle import Settler
from settle._core.keys import Keys
from settle.embedded import EmbeddedRedis
from tests.cluster.cluster_support import SLOTS, LocalCluster
from tests.faults.sentinel_support import (
    SERVICE,
    LocalSentinel,
    acknowledges,
    sentinel_deployment,
)

if TYPE_CHECKING:
    from benchmarks.anomalies import Env, Observation

__all__ = ["DEPLOYMENT_SCENARIOS"]

Contender = Settle | Peer
#: A filler value: writes of these push an evicting server over its maxmemory.
_FILLER = b"x" * (64 << 10)


def _stored(contender: Contender, oid: str) -> dict[str, Any] | None:
    try:
        return contender.stored(oid)
    except Exception:  # a refused or failing-over store holds nothing we can read
        return None


def _observe(obs: Observation, who: str, seen: str, contender: Contender, oid: str) -> None:
    obs.calls.append((who, seen))
    obs.snapshots.append(_stored(contender, oid))


def _fill(server: EmbeddedRedis, until_gone: Callable[[], bool], limit: int = 400) -> None:
    """Write filler keys until the operation's record is evicted (or ``limit`` writes)."""
    with redis.Redis.from_url(server.url) as raw:
        for i in range(limit):
            if until_gone():
                return
            raw.set(f"filler:{i}", _FILLER)


def evicting_policy(lib: str, env: Env, scope: str) -> Observation:
    """The store runs with ``maxmemory-policy allkeys-lru``; after the charge, other keys
    fill the memory; the caller retries."""
    from benchmarks.anomalies import Observation, charger  # noqa: PLC0415 - import cycle

    oid = f"evict-{env.run}"
    obs = Observation(f"effects:{scope}")
    extra = ["--maxmemory-policy", "allkeys-lru", "--maxmemory", "4mb"]
    with EmbeddedRedis(extra_args=extra) as server:
        contender = _build(lib, server.url, scope)
        try:
            fn = contender.function(charger(env, obs.effects_key, "A"), lease=env.lease, wait=0)
            _observe(obs, "first", outcome(lambda: fn(order=order(oid))), contender, oid)
            _fill(server, lambda: _stored(contender, oid) is None)
            _observe(obs, "retry", outcome(lambda: fn(order=order(oid))), contender, oid)
        finally:
            contender.close()
    return obs


def restart_without_persistence(lib: str, env: Env, scope: str) -> Observation:
    """The store's server restarts with no AOF and no RDB; the caller retries."""
    from benchmarks.anomalies import Observation, charger  # noqa: PLC0415 - import cycle

    oid = f"restart-{env.run}"
    obs = Observation(f"effects:{scope}")
    with EmbeddedRedis() as server:
        contender = _build(lib, server.url, scope)
        try:
            fn = contender.function(charger(env, obs.effects_key, "A"), lease=env.lease, wait=0)
            _observe(obs, "first", outcome(lambda: fn(order=order(oid))), contender, oid)
            server.stop()
            server.start()
            _observe(obs, "retry", outcome(lambda: fn(order=order(oid))), contender, oid)
        finally:
            contender.close()
    return obs


def sentinel_failover(lib: str, env: Env, scope: str) -> Observation:
    """A primary, a replica that has fallen behind (its link cut) and a Sentinel; settle runs
    with ``min_replicas=1``. The caller charges; the primary is killed and the replica
    promoted; the caller retries; the old primary comes back as a replica; one more retry."""
    from benchmarks.anomalies import Observation, charger  # noqa: PLC0415 - import cycle

    oid = f"sentinel-{env.run}"
    obs = Observation(f"effects:{scope}")
    with sentinel_deployment() as deployed:
        primary, replica, sentinel = deployed.primary, deployed.replica, deployed.sentinel
        contender = _on_sentinel(lib, sentinel, scope)
        try:
            fn = contender.function(charger(env, obs.effects_key, "A"), lease=env.lease, wait=0)
            deployed.link.close()  # the replica stops receiving writes
            _observe(obs, "first", outcome(lambda: fn(order=order(oid))), contender, oid)
            primary.stop(kill=True)
            _until(lambda: _names(sentinel, replica), 30)
            _observe(obs, "after failover", _settled(lambda: fn(order=order(oid))), contender, oid)
            primary.start()
            # Sentinel makes it the promoted node's replica, after its own delays (several
            # seconds on a loaded machine): say it at once, as Sentinel will.
            _replica_of(primary, replica)
            _until(lambda: acknowledges(replica), 60)
            _observe(obs, "replica back", outcome(lambda: fn(order=order(oid))), contender, oid)
        finally:
            contender.close()
    return obs


def cluster_failover(lib: str, env: Env, scope: str) -> Observation:
    """A cluster of 3 primaries with a replica each; settle runs with ``min_replicas=1``. The
    caller charges; the primary holding the operation's record is killed and its replica
    promoted; the caller retries; the killed node comes back as a replica; one more retry."""
    from benchmarks.anomalies import Observation, charger  # noqa: PLC0415 - import cycle

    oid = f"cluster-{env.run}"
    obs = Observation(f"effects:{scope}")
    cluster = LocalCluster(primaries=3, replicas=1).start()
    try:
        contender = _on_cluster(lib, cluster, scope)
        try:
            fn = contender.function(charger(env, obs.effects_key, "A"), lease=env.lease, wait=0)
            _observe(obs, "first", outcome(lambda: fn(order=order(oid))), contender, oid)
            victim = _owner(cluster, _record_key(contender, oid))
            promoted = cluster.nodes[cluster.replica_of(victim)]
            cluster.nodes[victim].stop(kill=True)
            _until(lambda: _promoted(promoted), 30)
            _observe(obs, "after failover", _settled(lambda: fn(order=order(oid))), contender, oid)
            cluster.nodes[victim].start()  # rejoins as the promoted node's replica
            _until(lambda: acknowledges(promoted), 30)
            _observe(obs, "replica back", outcome(lambda: fn(order=order(oid))), contender, oid)
        finally:
            contender.close()
    finally:
        cluster.close()
    return obs


def _on_cluster(lib: str, cluster: LocalCluster, scope: str) -> Contender:
    if lib == "settle":
        settler = Settler.from_cluster(
            cluster.url, namespace=scope, min_replicas=1, replica_timeout=0.3
        )
        return Settle("", scope, settler=settler)
    client = redis.RedisCluster(
        host="127.0.0.1", port=cluster.nodes[0].port, decode_responses=True, socket_timeout=2
    )
    return Peer("", scope, client=client)


def _record_key(contender: Contender, oid: str) -> str:
    if isinstance(contender, Settle):
        return Keys(contender.namespace, contender.settler.config.shards).record(oid)
    with redis.RedisCluster(
        host="127.0.0.1", port=_port(contender), decode_responses=True
    ) as client:
        for key in client.scan_iter(match=f"{contender.prefix}#*"):
            if not key.endswith(":lock"):
                return str(key)
    raise RuntimeError("the peer stored no record")


def _port(contender: Peer) -> int:
    return int(contender._client.get_default_node().port)


def _owner(cluster: LocalCluster, key: str) -> int:
    """Index of the primary that serves ``key``."""
    slot = key_slot(key.encode())
    per = SLOTS // cluster.primaries
    return min(slot // per, cluster.primaries - 1)


def _promoted(node: EmbeddedRedis) -> bool:
    with redis.Redis(port=node.port, socket_timeout=1) as c:
        info = c.info("replication")
        return bool(info["role"] == "master" and c.cluster("INFO")["cluster_state"] == "ok")


def _settled(call: Callable[[], object], bound: float = 15.0) -> str:
    """The call's outcome once the store answers again (a connection error while the
    clients find the promoted node is repeated)."""
    deadline = time.monotonic() + bound
    while True:
        seen = outcome(call)
        if seen not in ("BackendError", "ConnectionError", "MasterNotFoundError"):
            return seen
        if time.monotonic() > deadline:
            return seen
        time.sleep(0.2)


def _until(ready: Callable[[], bool], bound: float) -> None:
    deadline = time.monotonic() + bound
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError("the deployment did not settle in time")
        time.sleep(0.05)


def _replica_of(node: EmbeddedRedis, primary: EmbeddedRedis) -> None:
    with redis.Redis(port=node.port, socket_timeout=2) as c:
        c.execute_command("REPLICAOF", "127.0.0.1", str(primary.port))


def _names(sentinel: LocalSentinel, replica: EmbeddedRedis) -> bool:
    if not sentinel.switched_to(replica.port):
        return False
    with redis.Redis(port=replica.port) as c:
        return bool(c.info("replication")["role"] == "master")


def _build(lib: str, url: str, scope: str) -> Contender:
    return Settle(url, scope) if lib == "settle" else Peer(url, scope)


def _on_sentinel(lib: str, sentinel: LocalSentinel, scope: str) -> Contender:
    seeds = [f"127.0.0.1:{sentinel.port}"]
    if lib == "settle":
        settler = Settler.from_sentinel(
            seeds, service_name=SERVICE, namespace=scope, min_replicas=1, replica_timeout=0.3
        )
        return Settle("", scope, settler=settler)
    manager = Sentinel([("127.0.0.1", sentinel.port)], socket_timeout=2)
    client = manager.master_for(SERVICE, decode_responses=True, socket_timeout=2)
    return Peer("", scope, client=client)


DEPLOYMENT_SCENARIOS: list[tuple[str, str, Callable[[str, Env, str], Observation]]] = [
    ("evicting_policy", "evicting maxmemory-policy (allkeys-lru), memory full", evicting_policy),
    ("restart_no_persistence", "server restart without persistence", restart_without_persistence),
    (
        "cluster_failover",
        "Redis Cluster failover (settle: min_replicas=1)",
        cluster_failover,
    ),
    (
        "sentinel_failover",
        "Sentinel failover, replica behind (settle: min_replicas=1)",
        sentinel_failover,
    ),
]
