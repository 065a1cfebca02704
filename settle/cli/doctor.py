"""``settle doctor``: is this Redis (or Valkey) deployment safe for settle?

Reads each node's ``INFO``, ``CONFIG GET save`` and ``appendfsync`` (where allowed),
``CLUSTER SLOTS`` / ``INFO`` on a cluster, ``TIME``, the namespace's metadata and its shard
states' counts, and loads every settle script (the console's sessions' too) with ``SCRIPT
LOAD`` and, on Redis 7+ and Valkey, every library with ``FUNCTION LOAD`` (which run nothing
and write no key; an admin's run leaves them for a user that may not load them). The rules are
:mod:`settle._runtime.health`'s; this module gathers and renders. Exit 1 on any ``fail``
(with ``--strict`` on any ``warn`` too), 3 when Redis cannot be reached (docs/cli.md).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import click
import redis
from redis import exceptions as rx
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError, ResponseError
from redis.retry import Retry
from rich.table import Table
from rich.text import Text

from settle._core.keys import Keys
from settle._core.scripts import SCRIPTS
from settle._input import is_decimal
from settle._runtime import health, topology
from settle._runtime.health import Finding, Status
from settle._runtime.scripts import ScriptSet
from settle._runtime.urls import redacted
from settle._sessions import SCRIPTS as CONSOLE_SCRIPTS
from settle._text import as_text
from settle.cli._context import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    REDIS_TIMEOUT,
    Connection,
    EnvOption,
    bounded,
    checked_namespace,
    checked_url,
    connection_options,
    errors_as_exit_codes,
    fail,
    json_option,
    stored_shards,
)
from settle.cli._quarantine_health import graded, quarantine_findings
from settle.cli._render import console, print_json, visible_message
from settle.config import SettleConfig
from settle.cursor._scripts import SCRIPTS as CURSOR_SCRIPTS
from settle.errors import ConfigurationError
from settle.progress._scripts import PROGRESS, STREAM

__all__ = ["diagnose", "doctor"]

#: Every script set settle runs: the core's, the cursor's, progress's and its stream's, and
#: the console's sessions' (settle._sessions: importable without the ``web`` extra).
_SCRIPT_SETS: tuple[ScriptSet, ...] = (SCRIPTS, CURSOR_SCRIPTS, PROGRESS, STREAM, CONSOLE_SCRIPTS)


@dataclass
class _Deployment:
    """Plain clients of every node: the primaries and their replicas (a failover makes a
    replica the primary); ``unread``: replicas that could not be asked."""

    seed: redis.Redis
    primaries: dict[str, redis.Redis] = field(default_factory=dict)
    replicas: dict[str, redis.Redis] = field(default_factory=dict)
    unread: list[str] = field(default_factory=list)
    cluster: bool = False
    #: Cluster primaries that serve slots and are flagged failing (``fail``, ``fail?``) or
    #: do not answer: not asked.
    down: list[str] = field(default_factory=list)

    def add_replica(self, host: str, port: int, settings: dict[str, Any], replid: Any) -> None:
        """Keep a client of the replica at ``host:port`` when it answers in one try (redis-py's
        default retries would make one out of reach cost ~60 s) and, given the primary's
        ``replid``, replicates that primary (a listed address may reach another server);
        else note it unread."""
        name = f"{host}:{port}"
        one_try = {"host": host, "port": port, "retry": Retry(NoBackoff(), 0)}
        client = redis.Redis(**{**settings, **one_try})
        try:
            replication = client.info("replication")
            if replid is None or health.replicates(replication, replid):
                self.replicas[name] = client
                return
        except (RedisError, OSError):
            pass
        client.close()
        self.unread.append(name)

    @property
    def nodes(self) -> dict[str, redis.Redis]:
        return {**self.primaries, **self.replicas}

    def close(self) -> None:
        for client in {id(c): c for c in [self.seed, *self.nodes.values()]}.values():
            client.close()


def _connect(url: str, timeout: float) -> _Deployment:
    # --redis-timeout for each reply, one try (redis-py's default retries made a paused
    # server cost several times the bound); a timeout in the URL wins, as everywhere
    seed = bounded(redis.Redis.from_url(url), url, timeout)
    info = seed.info("server")
    kwargs = seed.connection_pool.connection_kwargs
    settings = topology.passed_on(kwargs, seed.connection_pool.connection_class)
    if not topology.is_cluster_mode(info):
        name = f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
        found = _Deployment(seed, primaries={name: seed})
        replication = _info(seed, "replication")
        if replication is None:
            found.unread.append("its replicas (INFO replication denied)")
            return found
        for address in health.replica_addresses(replication):
            found.add_replica(*address, settings, replication.get("master_replid"))
        return found
    found = _Deployment(seed, cluster=True)
    nodes: dict[str, dict[str, Any]] = seed.cluster("NODES")  # redis-py: {"host:port": {...}}
    for name, node in nodes.items():
        flags = str(node.get("flags", "")).split(",")
        host, _, port = name.split("@", 1)[0].rpartition(":")
        # A primary that holds slots (one that failed, whose replica took over, holds none)
        serving = "master" in flags and bool(node.get("slots"))
        if "fail" in flags or "fail?" in flags:
            if serving:
                found.down.append(f"{host or '127.0.0.1'}:{port}")
            continue
        if "noaddr" in flags or not port.isdigit() or port == "0":
            continue
        if "master" in flags:
            where = {"host": host or "127.0.0.1", "port": int(port)}
            # One try (as a replica's): a primary that does not answer is down, also before
            # the cluster flags it (its cluster-node-timeout).
            with redis.Redis(**{**settings, **where, "retry": Retry(NoBackoff(), 0)}) as probe:
                try:
                    probe.ping()
                except (RedisError, OSError):
                    if serving:
                        found.down.append(f"{host or '127.0.0.1'}:{port}")
                    continue
            found.primaries[f"{host}:{port}"] = redis.Redis(**{**settings, **where})
        else:
            found.add_replica(host or "127.0.0.1", int(port), settings, None)
    return found


def _info(client: redis.Redis, section: str) -> dict[str, Any] | None:
    try:
        reply: dict[str, Any] = client.info(section)
    except ResponseError:  # INFO denied for this user
        return None
    return reply


def _config(client: redis.Redis, name: str) -> str | None:
    try:
        reply = client.config_get(name)
    except ResponseError:  # CONFIG is often blocked on managed Redis
        return None
    value = reply.get(name) if isinstance(reply, dict) else None
    return None if value is None else as_text(value, "replace")


def _failed_scripts(primaries: dict[str, redis.Redis]) -> dict[str, str]:
    failures: dict[str, str] = {}
    for name, client in primaries.items():
        for scripts in _SCRIPT_SETS:
            for script in scripts.names:
                try:
                    client.script_load(scripts.source(script))
                except ResponseError as exc:
                    failures[f"{script}@{name}"] = str(exc).split("\n", 1)[0]
    return failures


def _failed_libraries(
    primaries: dict[str, redis.Redis], servers: dict[str, dict[str, Any]]
) -> dict[str, str] | None:
    """FUNCTION LOAD of every settle library on each Redis 7+ / Valkey primary ("already
    exists": the same library is there). None when no primary runs FUNCTION libraries."""
    failures: dict[str, str] = {}
    checked = False
    for name, client in primaries.items():
        if not topology.has_functions(servers.get(name) or {}):
            continue
        checked = True
        for scripts in _SCRIPT_SETS:
            try:
                client.function_load(scripts.library)
            except ResponseError as exc:
                if "already exists" not in str(exc):
                    failures[f"{scripts.library_name}@{name}"] = str(exc).split("\n", 1)[0]
    return failures if checked else None


def _clocks(nodes: dict[str, redis.Redis]) -> tuple[dict[str, int], int, int]:
    """Each node's clock as its offset from the local clock read around its own ``TIME``
    reply, put on one local instant: ``(node -> ms, local ms, slowest round trip ms)``."""
    offsets: dict[str, int] = {}
    slowest = 0
    for name, client in nodes.items():
        before = time.time()
        try:
            seconds, micros = client.time()
        except ResponseError:  # TIME denied for this user
            continue
        after = time.time()
        slowest = max(slowest, round((after - before) * 1000))
        offsets[name] = seconds * 1000 + micros // 1000 - round((before + after) * 500)
    now = round(time.time() * 1000)
    return {name: now + offset for name, offset in offsets.items()}, now, slowest


def diagnose(
    url: str,
    namespace: str,
    min_replicas: int,
    shards: int | None = None,
    *,
    timeout: float = REDIS_TIMEOUT,
    quarantine_maxlen: int | None = None,
) -> list[Finding]:
    """Every check against the deployment at ``url`` (raises ``RedisError`` when a node
    cannot be reached), waiting at most ``timeout`` seconds for each reply."""
    deployment = _connect(url, timeout)
    try:
        servers = {n: _info(c, "server") or {} for n, c in deployment.nodes.items()}
        findings = [health.version_finding(servers)]
        memory = {n: _info(c, "memory") for n, c in deployment.nodes.items()}
        policies = {n: None if m is None else health.eviction_policy(m) for n, m in memory.items()}
        evictions = health.eviction_finding({**policies, **dict.fromkeys(deployment.unread)})
        findings.append(_not_read(evictions, deployment.down))
        findings.append(_not_read(_memory(memory), deployment.down))
        # Replicas too: a failover makes one the primary, with the persistence it has.
        persistence = {n: _info(c, "persistence") or {} for n, c in deployment.nodes.items()}
        saves = {n: _config(c, "save") for n, c in deployment.nodes.items()}
        fsync = {n: _config(c, "appendfsync") for n, c in deployment.nodes.items()}
        kept = health.persistence_finding(
            persistence, saves, fsync, deployment.replicas, deployment.unread
        )
        findings.append(_not_read(kept, deployment.down))
        replication = {n: _info(c, "replication") for n, c in deployment.primaries.items()}
        findings.append(health.replicas_finding(replication, min_replicas))
        findings.append(_slots(deployment))
        findings.append(_namespace(deployment, namespace, shards, timeout))
        findings.extend(quarantine_findings(url, namespace, timeout, quarantine_maxlen))
        findings.append(
            health.scripts_finding(
                _failed_scripts(deployment.primaries),
                _failed_libraries(deployment.primaries, servers),
            )
        )
        findings.append(health.clock_finding(*_clocks(deployment.nodes)))
        return findings
    finally:
        deployment.close()


#: A node's used memory against its ``maxmemory`` that is a ``warn``, and a ``fail``: with
#: ``noeviction`` a full node refuses every write, so every settler call on its shards fails.
MEMORY_WARN = 0.8
MEMORY_FAIL = 0.95


def _memory(per_node: dict[str, dict[str, Any] | None]) -> Finding:
    """``used_memory`` against ``maxmemory`` on every node (``INFO memory``; 0: no limit)."""
    fullest: tuple[float, str, int, int] | None = None
    for name, info in per_node.items():
        if not info:
            continue
        try:
            used, limit = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
        except (TypeError, ValueError):
            continue
        if limit > 0 and (fullest is None or used / limit > fullest[0]):
            fullest = (used / limit, name, used, limit)
    if fullest is None:
        return Finding("memory", Status.OK, "no maxmemory limit (or INFO memory denied)")
    share, name, used, limit = fullest
    seen = f"{name} uses {used // 1024**2} MiB of maxmemory {limit // 1024**2} MiB ({share:.0%})"
    fix = (
        "raise maxmemory, or free memory (trim resolved quarantine entries, shorter "
        "retention): a full node refuses every settle write (OOM)"
    )
    return graded("memory", share, (MEMORY_WARN, MEMORY_FAIL), seen, fix)


def _not_read(finding: Finding, down: list[str]) -> Finding:
    """``finding``, judged on the nodes that answered, naming the cluster primaries that are
    down (not answering, or flagged failing), whose setting could not be read: such a check
    passed as if every node had been read. Their node's setting is unknown: a ``warn`` (the
    ``cluster slots`` check fails them)."""
    if not down:
        return finding
    note = (
        f"not read on {', '.join(sorted(down))} (primary down: not answering, or flagged failing)"
    )
    if finding.status is Status.OK:
        return Finding(
            finding.check,
            Status.WARN,
            f"{note}; the nodes read: {finding.detail}",
            "bring that primary back, or fail over to its replica (see cluster slots), then "
            "run doctor again",
        )
    return Finding(finding.check, finding.status, f"{finding.detail}; {note}", finding.fix)


def _slots(deployment: _Deployment) -> Finding:
    if not deployment.cluster:
        return health.slots_finding(None, {})
    served = {}
    states = {}
    for name, client in deployment.nodes.items():
        raw = client.execute_command("CLUSTER SLOTS")  # type: ignore[no-untyped-call,unused-ignore]
        served[name] = (
            list(raw)  # redis-py parses it into {(low, high): nodes}
            if isinstance(raw, dict)
            else [(int(entry[0]), int(entry[1])) for entry in raw]
        )
        state = client.cluster("INFO").get("cluster_state", "")
        states[name] = as_text(state)
    return health.slots_finding(served, states, deployment.down)


def _namespace(
    deployment: _Deployment, namespace: str, shards: int | None, timeout: float
) -> Finding:
    if not deployment.cluster:
        return _namespace_of(deployment.seed, namespace, shards)
    try:
        with redis.RedisCluster.from_url(
            _node_url(deployment), socket_timeout=timeout, socket_connect_timeout=timeout
        ) as cluster:
            return _namespace_of(cluster, namespace, shards)
    except (rx.ConnectionError, rx.TimeoutError, rx.ClusterError, RedisClusterException) as exc:
        # a primary down, the cluster down: the slots check says which
        return Finding(
            "namespace",
            Status.WARN,
            f"{namespace!r} could not be read ({type(exc).__name__}: {exc})",
            "bring every slot back (see cluster slots), then run doctor again",
        )


def _namespace_of(client: Any, namespace: str, shards: int | None) -> Finding:
    """The metadata's count against the shard states' (each shard's ``shards`` field, for the
    shards the metadata, ``--shards`` or the default count name) and ``--shards``."""
    try:
        stored = stored_shards(client, namespace)
    except ConfigurationError as exc:  # corrupt metadata: a verdict, not a traceback
        return Finding(
            "namespace", Status.FAIL, str(exc), "inspect the key; settle writes nothing there"
        )
    keys = Keys(namespace, 1)
    states: dict[int, str] = {}
    for shard in range(max(stored or 0, shards or 0) or SettleConfig().shards):
        key = keys.generation(shard)
        try:
            count = client.hget(key, "shards")
        except ResponseError:  # WRONGTYPE: not what settle writes; every settler refuses it
            return Finding(
                "namespace",
                Status.FAIL,
                f"{namespace!r}: the state of shard {shard}, key {key!r}, is not a hash: every "
                "settler call on that shard is refused (CorruptRecord)",
                "inspect the key: settle writes a hash there (gen, shards); restore it or "
                "delete it (its next write claims the shard again)",
            )
        if count is not None:
            states[shard] = as_text(count, "replace")
    return health.namespace_finding(namespace, stored, shards, states, _meta_age(client, namespace))


def _meta_age(client: Any, namespace: str) -> int | None:
    """How old the namespace's metadata is (ms, the server clock of the node that holds it),
    from its ``created``; None when it has none, or when ``TIME`` is denied (the clocks check
    warns of that; a denial here made doctor end as "cannot reach Redis")."""
    meta = Keys(namespace, 1).meta
    created = client.hget(meta, "created")
    if created is None or not is_decimal(as_text(created, "replace")):
        return None
    try:
        if isinstance(client, redis.RedisCluster):
            node = client.get_node_from_key(meta)  # type: ignore[no-untyped-call,unused-ignore]
            seconds, micros = client.time(target_nodes=node)
        else:
            seconds, micros = client.time()
    except ResponseError:  # TIME denied for this user
        return None
    return int(seconds) * 1000 + int(micros) // 1000 - int(as_text(created, "replace"))


def _node_url(deployment: _Deployment) -> str:
    kwargs = deployment.seed.connection_pool.connection_kwargs
    user, password = kwargs.get("username"), kwargs.get("password")
    # percent-encoded, as the user's URL had them: a password holding '@', '/' or '#' put
    # back as it is named another host (a part of the password), another database
    creds = f"{quote(user or '', safe='')}:{quote(password, safe='')}@" if password else ""
    scheme = (
        "rediss" if "SSL" in deployment.seed.connection_pool.connection_class.__name__ else "redis"
    )
    return f"{scheme}://{creds}{kwargs['host']}:{kwargs['port']}/0"


_STYLE = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "bold red"}


@click.command("doctor")
@connection_options
@click.option(
    "--min-replicas",
    envvar="SETTLE_MIN_REPLICAS",
    cls=EnvOption,
    type=click.IntRange(0, None),
    default=0,
    show_default=True,
    help="The min_replicas your settlers use (env SETTLE_MIN_REPLICAS).",
)
@click.option(
    "--quarantine-maxlen",
    envvar="SETTLE_QUARANTINE_MAXLEN",
    cls=EnvOption,
    type=click.IntRange(1, 2**53),
    default=None,
    help="The quarantine_maxlen your settlers use (env SETTLE_QUARANTINE_MAXLEN): how full "
    "each shard's quarantine stream is is checked against it.",
)
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too.")
@json_option
def doctor(
    conn: Connection,
    min_replicas: int,
    quarantine_maxlen: int | None,
    strict: bool,
    as_json: bool,
) -> None:
    """Check a Redis or Valkey deployment for settle: version, eviction policy, persistence,
    replicas, cluster slots, the namespace, its quarantine, scripts and clocks. Exit 1 on a
    failed check (--strict: on a warning too)."""
    with errors_as_exit_codes():  # a malformed URL or namespace: one line, exit 2
        checked_url(conn.url)
        checked_namespace(conn.namespace)
    try:
        findings = diagnose(
            conn.url,
            conn.namespace,
            min_replicas,
            conn.shards,
            timeout=conn.redis_timeout,
            quarantine_maxlen=quarantine_maxlen,
        )
    except (rx.AuthenticationError, rx.AuthorizationError) as exc:  # reached, and refused
        fail(
            f"Redis at {redacted(conn.url)} refused settle's credentials "
            f"({type(exc).__name__}: {exc}). Check the user name and password in the URL "
            "(or the ACL rules of that user)",
            EXIT_UNAVAILABLE,
        )
    except (RedisError, RedisClusterException, OSError) as exc:
        fail(
            f"cannot reach Redis at {redacted(conn.url)} ({type(exc).__name__}: {exc})",
            EXIT_UNAVAILABLE,
        )
    failed = any(f.status is Status.FAIL for f in findings)
    warned = any(f.status is Status.WARN for f in findings)
    if as_json:
        print_json(
            {
                "url": redacted(conn.url),
                "namespace": conn.namespace,
                "ok": not failed and not (strict and warned),
                "checks": [f.as_dict() for f in findings],
            }
        )
    else:
        table = Table(title=f"settle doctor: {redacted(conn.url)}", title_justify="left")
        for column in ("check", "status", "seen", "what to change"):
            table.add_column(column, overflow="fold")
        for f in findings:
            status = Text(f.status.value, style=_STYLE[f.status])
            table.add_row(f.check, status, visible_message(f.detail), f.fix)
        console().print(table)
    sys.exit(EXIT_FAILED if failed or (strict and warned) else EXIT_OK)
