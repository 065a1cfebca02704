"""The rules of a safe deployment, with no I/O: what the runner refuses at start-up (an
evicting ``maxmemory-policy``) and what ``settle doctor`` reports (version, eviction,
persistence, replicas, slot coverage, namespace, scripts, clocks). The runner and the CLI
gather the servers' ``INFO`` replies; these functions judge them.

Each doctor check is a :class:`Finding`: ``ok``, ``warn`` or ``fail``, what was seen, and what
to change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from settle._runtime.topology import (
    MIN_SERVER_VERSION,
    missing_slot_ranges,
    parse_server_version,
)
from settle._text import as_text
from settle.config import CLAIM_GRACE_MS
from settle.errors import ConfigurationError

__all__ = [
    "CLOCK_SKEW_FAIL_MS",
    "CLOCK_SKEW_WARN_MS",
    "EvictionWarnings",
    "Finding",
    "Status",
    "check_eviction",
    "check_primary",
    "clock_finding",
    "eviction_finding",
    "eviction_policy",
    "is_evicting",
    "namespace_finding",
    "persistence_finding",
    "replica_addresses",
    "replica_of",
    "replicas_finding",
    "replicates",
    "scripts_finding",
    "slots_finding",
    "version_finding",
]

#: Server clocks further apart than this make leases end early or late on some nodes.
CLOCK_SKEW_WARN_MS = 500
CLOCK_SKEW_FAIL_MS = 5_000
_EVICTING = ("allkeys-", "volatile-")


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class Finding:
    """One doctor check: its ``status``, what was seen (``detail``) and what to change (``fix``,
    empty when nothing needs changing)."""

    check: str
    status: Status
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return {
            "check": self.check,
            "status": self.status.value,
            "detail": self.detail,
            "fix": self.fix,
        }


# -- eviction ------------------------------------------------------------------------------


def eviction_policy(info_memory: Mapping[str, Any]) -> str | None:
    """The ``maxmemory_policy`` of one node's ``INFO memory`` (None when it is not there)."""
    policy = info_memory.get("maxmemory_policy")
    return None if policy is None else as_text(policy)


def replica_addresses(info_replication: Mapping[str, Any]) -> list[tuple[str, int]]:
    """``(host, port)`` of each replica a primary's ``INFO replication`` lists (redis-py
    parses ``slaveN:ip=...,port=...`` into a mapping). A replica is checked like a primary:
    a failover makes it one, with the policy it has."""
    found = []
    for name, value in info_replication.items():
        if str(name).startswith("slave") and isinstance(value, Mapping):
            host, port = value.get("ip"), value.get("port")
            if host and str(port).isdigit():
                found.append((as_text(host), int(str(port))))
    return sorted(found)


def replicates(info_replication: Mapping[str, Any], replid: Any) -> bool:
    """The node whose ``INFO replication`` this is replicates the primary whose
    ``master_replid`` is ``replid``: it carries that id, or it is a replica whose link is not
    up yet (in its first full sync it keeps its own id until the primary's data is loaded;
    judging it is the safe side: an evicting one is refused)."""
    if as_text(info_replication.get("role", "")) not in ("slave", "replica"):
        return False
    if as_text(info_replication.get("master_replid", "")) == as_text(replid):
        return True
    return as_text(info_replication.get("master_link_status", "")) != "up"


def replica_of(info_replication: Mapping[str, Any]) -> str | None:
    """``host:port`` of the primary that the node whose ``INFO replication`` this is
    replicates, or None when the node is a primary."""
    if as_text(info_replication.get("role", "")) not in ("slave", "replica"):
        return None
    host = as_text(info_replication.get("master_host", "?"))
    return f"{host}:{as_text(info_replication.get('master_port', '?'))}"


def check_primary(info_replication: Mapping[str, Any]) -> None:
    """Refuse a server that is a replica (its ``INFO replication``): a read-only one refuses
    every settle write, a writable one (``replica-read-only no``) loses them at its next sync
    with its primary. A URL of a replica (a provider's reader endpoint), or a primary that a
    failover demoted."""
    primary = replica_of(info_replication)
    if primary is not None:
        raise ConfigurationError(
            f"the server is a replica of {primary}, not a primary: a replica refuses settle's "
            "writes (read-only), or loses them at its next sync with its primary. Connect to "
            "the primary (or use from_sentinel, which follows failovers); nothing was written."
        )


def is_evicting(policy: str) -> bool:
    """Every ``allkeys-*`` policy may evict any key; every ``volatile-*`` one any key with a
    TTL, and every settle key has one (its retention). Only ``noeviction`` keeps them."""
    return policy.startswith(_EVICTING)


@dataclass(frozen=True, slots=True)
class EvictionWarnings:
    """What the runner logs after :func:`check_eviction` let a server through: the evicting
    policies it was allowed to accept, and the nodes whose policy could not be read."""

    allowed: tuple[str, ...] = ()
    unread: tuple[str, ...] = ()


def check_eviction(policies: Mapping[str, str | None], *, allow: bool) -> EvictionWarnings:
    """Judge each node's policy, primaries' and replicas' (``None``: it could not be read;
    node ``""``: a single server or a standalone primary). Raise
    :class:`ConfigurationError` for an evicting one unless ``allow``; return what to warn
    about."""
    evicting = {node: p for node, p in policies.items() if p is not None and is_evicting(p)}
    if evicting and not allow:
        shown = ", ".join(f"{p} on {node}" if node else p for node, p in sorted(evicting.items()))
        raise ConfigurationError(
            f"the server's maxmemory-policy is {shown}: Redis may evict settle's records when "
            "memory runs short, and an evicted completed record runs its operation again. "
            "Set maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction, or your "
            "provider's parameter group), or pass allow_eviction=True to accept the risk."
        )
    return EvictionWarnings(
        allowed=tuple(sorted(set(evicting.values()))),
        unread=tuple(sorted(node for node, p in policies.items() if p is None)),
    )


def eviction_finding(policies: Mapping[str, str | None]) -> Finding:
    """``policies``: node -> policy, replicas included (a failover promotes them)."""
    evicting = sorted(f"{p} on {node}" for node, p in policies.items() if p and is_evicting(p))
    if evicting:
        return Finding(
            "eviction",
            Status.FAIL,
            f"maxmemory-policy {', '.join(evicting)}: completed records can be evicted",
            "set maxmemory-policy noeviction",
        )
    if any(p is None for p in policies.values()):
        return Finding(
            "eviction",
            Status.WARN,
            "maxmemory-policy could not be read on "
            + ", ".join(sorted(node for node, p in policies.items() if p is None))
            + " (INFO memory denied, or a replica out of reach?)",
            "allow INFO for settle's user, or check the policy is noeviction",
        )
    shown = ", ".join(sorted({p for p in policies.values() if p is not None}))
    return Finding("eviction", Status.OK, f"maxmemory-policy {shown}")


# -- doctor checks -------------------------------------------------------------------------


def version_finding(per_node: Mapping[str, Mapping[str, Any]]) -> Finding:
    """The oldest node's version (``INFO server``), Redis or Valkey."""
    if not per_node:
        return Finding("version", Status.FAIL, "no node answered", "check the URL")
    name, info = min(per_node.items(), key=lambda item: parse_server_version(item[1]))
    version = ".".join(map(str, parse_server_version(info)))
    server = (
        "Valkey" if info.get("valkey_version") or info.get("server_name") == "valkey" else "Redis"
    )
    if parse_server_version(info) < MIN_SERVER_VERSION:
        return Finding(
            "version",
            Status.FAIL,
            f"{server} {version} on {name}",
            "upgrade to Redis 6.2 or newer, or Valkey",
        )
    shown = f"{server} {version}" + (
        f" (oldest of {len(per_node)} nodes)" if len(per_node) > 1 else ""
    )
    return Finding("version", Status.OK, shown)


def persistence_finding(
    per_node: Mapping[str, Mapping[str, Any]],
    config: Mapping[str, str | None],
    fsync: Mapping[str, str | None] | None = None,
    replicas: Iterable[str] = (),
    unread: Iterable[str] = (),
) -> Finding:
    """AOF or RDB on every node, from ``INFO persistence`` (``aof_enabled``) and the
    ``save`` setting when CONFIG could be read (``config``: node to its ``save`` or None);
    ``fsync``: node to its ``appendfsync`` (None: CONFIG denied), ``no`` is warned about.
    ``replicas``: the nodes of ``per_node`` that are replicas, judged by the same rules once
    the primaries pass: a failover makes a replica the primary with the persistence it has,
    so a replica without AOF is a restart away from losing every record. ``unread``: replicas
    that could not be asked (not in ``per_node``), named once every node read passes, never
    said to have AOF."""
    standby = set(replicas)
    primaries = {n: i for n, i in per_node.items() if n not in standby}
    found = _persistence(primaries, config, fsync or {}, "", "")
    if found is None:
        others = {n: i for n, i in per_node.items() if n in standby}
        found = _persistence(others, config, fsync or {}, "replica ", _AFTER_FAILOVER)
    if found is None and (missing := sorted(unread)):
        return Finding(
            "persistence",
            Status.WARN,
            f"persistence could not be read on {', '.join(missing)}; AOF on every other node",
            "check that replica (see eviction), then run doctor again",
        )
    return found or Finding("persistence", Status.OK, "AOF on every primary and replica")


#: What a replica's missing persistence costs: nothing until it is promoted.
_AFTER_FAILOVER = " once a failover makes it the primary"


def _persistence(
    per_node: Mapping[str, Mapping[str, Any]],
    config: Mapping[str, str | None],
    fsync: Mapping[str, str | None],
    role: str,
    when: str,
) -> Finding | None:
    """The first persistence problem of ``per_node`` (``role`` and ``when`` name replicas and
    when their problem costs), or None."""
    bare, rdb_only, unknown, lazy = [], [], [], []
    for node, info in sorted(per_node.items()):
        if as_text(info.get("aof_enabled", "0")) == "1":
            if fsync.get(node) == "no":
                lazy.append(node)
            continue
        save = config.get(node)
        if save is None:
            unknown.append(node)
        elif save.strip():
            rdb_only.append(node)
        else:
            bare.append(node)
    if bare:
        return Finding(
            "persistence",
            Status.WARN,
            f"no AOF, no RDB save rule on {role}{', '.join(bare)}: a restart loses every "
            f"record{when}",
            "appendonly yes (appendfsync always or everysec)",
        )
    if rdb_only:
        return Finding(
            "persistence",
            Status.WARN,
            f"RDB snapshots only on {role}{', '.join(rdb_only)}: a crash loses the writes since "
            f"the last snapshot{when}",
            "appendonly yes",
        )
    if lazy:
        return Finding(
            "persistence",
            Status.WARN,
            f"AOF with appendfsync no on {role}{', '.join(lazy)}: a crash of the host loses the "
            "writes the OS had not flushed to disk yet (up to ~30 s on Linux), completions "
            f"included{when}",
            "appendfsync everysec (loses at most ~1 s) or always",
        )
    if unknown:
        return Finding(
            "persistence",
            Status.WARN,
            f"no AOF on {role}{', '.join(unknown)}; its RDB save rule could not be read (CONFIG "
            "denied)",
            "appendonly yes, or check the provider's snapshot settings and use min_replicas",
        )
    return None


def replicas_finding(
    per_primary: Mapping[str, Mapping[str, Any] | None], min_replicas: int
) -> Finding:
    """Connected replicas of each primary (``INFO replication``; None: denied) against
    ``min_replicas``. A "primary" that is a replica (the URL names one) fails: settle's
    writes are refused there (or lost, on a writable replica)."""
    demoted = {
        node: primary
        for node, info in per_primary.items()
        if info is not None and (primary := replica_of(info)) is not None
    }
    if demoted:
        shown = ", ".join(f"{node} is a replica of {primary}" for node, primary in demoted.items())
        return Finding(
            "replicas",
            Status.FAIL,
            f"{shown}, not a primary: every settle write is refused (read-only) or lost at "
            "its next sync with the primary",
            "point --redis-url at the primary, or pass redis+sentinel://SENTINEL_HOST:PORT/"
            "SERVICE, which asks the Sentinels for it (the settlers: from_sentinel)",
        )
    unread = sorted(node for node, info in per_primary.items() if info is None)
    counts = {
        node: int(as_text(info.get("connected_slaves", 0)))
        for node, info in per_primary.items()
        if info is not None
    }
    fewest = min(counts.values(), default=0)
    shown = ", ".join(f"{n} on {node}" for node, n in sorted(counts.items()))
    if fewest < min_replicas and (counts or not unread):
        return Finding(
            "replicas",
            Status.FAIL,
            f"connected replicas {shown}; min_replicas is {min_replicas}",
            "add replicas, or lower min_replicas: every write now raises DurabilityError",
        )
    if unread:  # no FAIL among the primaries that answered; these could not be counted
        return Finding(
            "replicas",
            Status.WARN,
            f"INFO replication could not be read on {', '.join(unread)}",
            "allow INFO for settle's user, or check the replicas yourself",
        )
    if fewest == 0:
        return Finding(
            "replicas",
            Status.WARN,
            f"connected replicas {shown}",
            "add a replica per primary and set min_replicas=1",
        )
    if min_replicas == 0:
        return Finding(
            "replicas",
            Status.WARN,
            f"connected replicas {shown}; min_replicas is 0",
            "set min_replicas=1: a failover then keeps every acknowledged completion",
        )
    return Finding(
        "replicas", Status.OK, f"connected replicas {shown}; min_replicas {min_replicas}"
    )


def slots_finding(
    served: Mapping[str, Iterable[tuple[int, int]]] | None,
    states: Mapping[str, str],
    down: Iterable[str] = (),
) -> Finding:
    """Hash-slot coverage as each node sees it (``CLUSTER SLOTS`` of each node; ``None``
    when the server is not a cluster), each node's ``cluster_state``, and the primaries
    that hold slots and do not answer or are flagged failing (``down``: ``fail`` or
    ``fail?`` in ``CLUSTER NODES``), whose slots no node serves until a replica takes over."""
    if served is None:
        return Finding("cluster slots", Status.OK, "not a cluster")
    missing = sorted({r for ranges in served.values() for r in missing_slot_ranges(ranges)})
    failing = sorted(node for node, state in states.items() if state != "ok")
    gone = sorted(down)
    if missing or failing or gone:
        parts = []
        if gone:
            parts.append(f"primary down (not answering, or flagged failing): {', '.join(gone)}")
        if missing:
            shown = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in missing[:4])
            parts.append(f"unserved slots {shown}")
        if failing:
            parts.append(f"cluster_state not ok on {', '.join(failing)}")
        return Finding(
            "cluster slots",
            Status.FAIL,
            "; ".join(parts),
            ("bring the failing primary back, or fail over to its replica; " if gone else "")
            + "assign every slot (redis-cli --cluster fix) and wait for cluster_state:ok",
        )
    return Finding("cluster slots", Status.OK, f"16384 slots served, {len(states)} nodes")


def namespace_finding(
    namespace: str,
    stored_shards: int | None,
    shards: int | None = None,
    states: Mapping[int, str] | None = None,
    meta_age_ms: int | None = None,
) -> Finding:
    """The namespace's metadata (its stored shard count, None when it has none yet) against
    the shard states' counts (``states``: shard to the count its state was claimed for, for
    the states that exist) and the shard count the settlers are configured with (``shards``,
    None: not given). The shard states decide: they placed the records. ``meta_age_ms``:
    how old the metadata is on the server clock (None: unknown); a shard of the namespace
    without state under metadata older than :data:`CLAIM_GRACE_MS` was lost (its creator claimed
    every shard right after making it), its records with it."""
    counts = sorted(set((states or {}).values()))
    if stored_shards is None:
        if len(counts) > 1:
            return Finding(
                "namespace",
                Status.FAIL,
                f"{namespace!r} has no metadata, and its shard states disagree: "
                f"{_state_counts(states or {})}",
                "inspect the shard states (settle:{<ns>:<shard>}:gen); settle never mixes counts",
            )
        if counts:
            return Finding(
                "namespace",
                Status.WARN,
                f"{namespace!r} has no metadata; its shard states say {counts[0]} shards",
                f"the next settler configured with shards={counts[0]} re-creates it; any other "
                "count is refused",
            )
        return Finding(
            "namespace",
            Status.WARN,
            f"{namespace!r} has no metadata yet",
            "check --namespace (the first Settler stores its shard count)",
        )
    disagreeing = {s: c for s, c in (states or {}).items() if c != str(stored_shards)}
    if disagreeing:
        return Finding(
            "namespace",
            Status.FAIL,
            f"{namespace!r}: the metadata says {stored_shards} shards, shard states say "
            f"{_state_counts(disagreeing)}: every settler is refused by one or the other",
            "set the metadata to the shard states' count (HSET settle:{<ns>}:meta shards <n>): "
            "they placed the records",
        )
    if shards is not None and shards != stored_shards:
        return Finding(
            "namespace",
            Status.FAIL,
            f"{namespace!r} has {stored_shards} shards, --shards is {shards}",
            f"configure shards={stored_shards}: a settler with another count is refused",
        )
    lost = [s for s in range(stored_shards) if s not in (states or {})]
    if lost and meta_age_ms is not None and meta_age_ms >= CLAIM_GRACE_MS:
        shown = ", ".join(map(str, lost[:8])) + (", ..." if len(lost) > 8 else "")
        many = len(lost) > 1
        return Finding(
            "namespace",
            Status.WARN,
            f"{namespace!r}: {stored_shards} shards, {len(lost)} without state (shard"
            f"{'s' if many else ''} {shown}): Redis lost {'them' if many else 'it'} and "
            f"{'their' if many else 'its'} records (a node restarted without persistence, a "
            "FLUSHALL of one node, a DEL): an operation completed there runs again on its retry",
            "find what lost the data (the node's log, its persistence); the next settler "
            "claims the shards again and logs settle.namespace.state_lost",
        )
    return Finding("namespace", Status.OK, f"{namespace!r}: {stored_shards} shards")


def _state_counts(states: Mapping[int, str]) -> str:
    by_count: dict[str, list[int]] = {}
    for shard, count in sorted(states.items()):
        by_count.setdefault(count, []).append(shard)
    return "; ".join(
        f"{count[:20]} (shard{'s' if len(found) > 1 else ''} "
        f"{', '.join(map(str, found[:8]))}{', ...' if len(found) > 8 else ''})"
        for count, found in sorted(by_count.items())
    )


def scripts_finding(
    failures: Mapping[str, str], function_failures: Mapping[str, str] | None = None
) -> Finding:
    """``failures``: script name to the error SCRIPT LOAD answered (empty: all loaded);
    ``function_failures``: library to the error FUNCTION LOAD answered on a Redis 7+ or
    Valkey node (None: no such node). A refused FUNCTION LOAD only warns: the runner then
    keeps EVALSHA (``settle.backend.functions_refused``), which costs more per call."""
    if failures:
        shown = "; ".join(f"{name}: {error}" for name, error in sorted(failures.items()))
        return Finding(
            "scripts",
            Status.FAIL,
            f"SCRIPT LOAD refused: {shown}",
            "allow EVALSHA, SCRIPT LOAD and EVAL for settle's user (ACL +@scripting)",
        )
    if function_failures:
        shown = "; ".join(f"{n}: {e}" for n, e in sorted(function_failures.items()))
        return Finding(
            "scripts",
            Status.WARN,
            f"every settle script loads, but FUNCTION LOAD was refused ({shown}): settle "
            "runs its scripts with EVALSHA, which costs more server time per call",
            "allow FUNCTION LOAD and FCALL for settle's user (ACL +function|load +fcall +fcall_ro)",
        )
    if function_failures is not None:
        return Finding("scripts", Status.OK, "every settle script and FUNCTION library loads")
    return Finding("scripts", Status.OK, "every settle script loads")


def clock_finding(server_ms: Mapping[str, int], local_ms: int, round_trip_ms: int) -> Finding:
    """Server clocks (``TIME``) of the nodes against each other and the local clock.
    Leases are judged on the server's clock; nodes that disagree end leases early or late
    after a failover. ``round_trip_ms``: the slowest reply, the reading's uncertainty."""
    if not server_ms:
        return Finding(
            "clocks", Status.WARN, "no node answered TIME", "allow TIME for settle's user"
        )
    between = max(server_ms.values()) - min(server_ms.values())
    against = max(abs(ms - local_ms) for ms in server_ms.values())
    skew = max(between - round_trip_ms, 0)
    local = max(against - round_trip_ms, 0)
    detail = (
        f"skew between nodes {between} ms, against this host {against} ms "
        f"(round trip {round_trip_ms} ms)"
    )
    if skew >= CLOCK_SKEW_FAIL_MS:
        return Finding("clocks", Status.FAIL, detail, "run NTP (chrony) on every Redis host")
    if skew >= CLOCK_SKEW_WARN_MS or local >= CLOCK_SKEW_FAIL_MS:
        return Finding(
            "clocks", Status.WARN, detail, "run NTP (chrony) on every Redis host and this one"
        )
    return Finding("clocks", Status.OK, detail)
