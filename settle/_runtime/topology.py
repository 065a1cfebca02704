"""What the runner needs to know about the server's shape, with no I/O: seed nodes of a
cluster, the server version, the oldest node's INFO, and whether every hash slot is served
(SPEC 4, 11)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from redis.exceptions import ReadOnlyError, ResponseError

from settle._input import is_decimal
from settle._runtime.urls import redacted, url_problem
from settle._text import as_text
from settle.errors import ConfigurationError, InvalidInput

__all__ = [
    "HASH_SLOTS",
    "MIN_SERVER_VERSION",
    "check_cluster",
    "check_server",
    "check_service_name",
    "demoted",
    "has_functions",
    "hash_tag",
    "is_cluster_mode",
    "lists_library",
    "missing_function",
    "missing_slot_ranges",
    "oldest_node_info",
    "parse_seed_nodes",
    "parse_server_version",
    "passed_on",
]

#: Connection settings a client of one node passes on to a client of another node of the same
#: deployment (the cluster client a node's client becomes, a replica's probe, doctor's nodes).
NODE_SETTINGS = frozenset(
    {
        "host",
        "port",
        "username",
        "password",
        "credential_provider",
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "socket_keepalive_options",
        "client_name",
        "health_check_interval",
        "protocol",
        "retry",
    }
)

HASH_SLOTS = 16384
MIN_SERVER_VERSION = (6, 2, 0)
#: FUNCTION libraries: Redis 7.0 and every Valkey (which reports ``redis_version`` 7.2.4).
FUNCTIONS_SINCE = (7, 0, 0)


def parse_server_version(info: Mapping[str, Any]) -> tuple[int, ...]:
    """``(major, minor, patch)`` of a Redis or Valkey server from its ``INFO server``."""
    raw = info.get("valkey_version") or info.get("redis_version") or "0"
    text = as_text(raw)
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def check_server(info: Mapping[str, Any]) -> None:
    """Refuse a server older than Redis 6.2 (the scripts need its commands)."""
    version = parse_server_version(info)
    if version < MIN_SERVER_VERSION:
        raise ConfigurationError(
            f"settle needs Redis 6.2 or newer (or Valkey); the server reports "
            f"{'.'.join(map(str, version))}. Upgrade the server."
        )


def has_functions(info: Mapping[str, Any]) -> bool:
    """Whether the server (the oldest node of a cluster) runs FUNCTION libraries (SPEC 4:
    Redis 7+ and Valkey do; 6.2 keeps EVALSHA)."""
    return parse_server_version(info) >= FUNCTIONS_SINCE


def lists_library(reply: object, name: str) -> bool:
    """Whether a ``FUNCTION LIST`` reply names the library ``name`` (each library a map, or
    a flat list of fields and values as RESP2 sends it)."""
    for entry in reply if isinstance(reply, list) else ():
        if isinstance(entry, Mapping):
            fields = dict(entry)
        elif isinstance(entry, list):
            fields = dict(zip(entry[::2], entry[1::2], strict=False))
        else:
            continue
        found = fields.get(b"library_name", fields.get("library_name"))
        if found is not None and as_text(found) == name:
            return True
    return False


def missing_function(reply: object) -> str | None:
    """What an FCALL's error reply says is missing (redis-py raises a bare ResponseError for
    either): ``'library'`` when the server does not hold settle's library (restarted
    without persistence, FUNCTION FLUSH, a cluster node that never had it), ``'fcall'``
    when it knows no FCALL at all (renamed or disabled by ``rename-command``, a rollback or
    a failover to Redis 6.2); None for any other reply."""
    if not isinstance(reply, ResponseError):
        return None
    text = str(reply)
    if text.startswith("Function not found"):
        return "library"
    # "unknown command 'FCALL', with args beginning with: ..." (Redis 7, Valkey), with
    # backquotes on 6.2: the command's own name, not a word of its arguments.
    if text.lower().startswith(("unknown command 'fcall'", "unknown command `fcall`")):
        return "fcall"
    return None


def demoted(reply: object) -> bool:
    """Whether an error reply says the server is a read-only replica: ``READONLY`` (redis-py
    raises ReadOnlyError), or Redis 6.2's script error that carries it ("Error running script
    ...: -READONLY You can't write against a read only replica."), which redis-py raises as a
    bare ResponseError, so its Sentinel connections do not drop it as they drop the former.
    A script refused so wrote nothing (a replica refuses every write)."""
    if isinstance(reply, ReadOnlyError):
        return True
    return isinstance(reply, ResponseError) and "-READONLY You can't write" in str(reply)


def demoted_behind(error: BaseException) -> bool:
    """Whether a connection error was caused by a demotion (:func:`demoted`): redis-py's
    Sentinel connection raises its own ConnectionError from the READONLY it met, and the
    pipelined lane hands each call of a batch a copy of the batch's error (``__cause__``)."""
    seen: set[int] = set()
    todo = [error.__cause__, error.__context__]
    while todo:
        found = todo.pop()
        if found is None or id(found) in seen:
            continue
        seen.add(id(found))
        if demoted(found):
            return True
        todo += [found.__cause__, found.__context__]
    return False


#: RedisCluster options that send reads to replicas (redis-py's deprecated flag and its
#: successor): refused in the options of a cluster client settle builds.
REPLICA_READS = ("read_from_replicas", "load_balancing_strategy")


def primary_reads(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` without those that would send reads to replicas, refused if they do.
    settle's scripts run on primaries whatever they say, but its plain reads would not: a
    replica behind its primary answers an older state (the namespace's first start would not
    see the shards a lost metadata's namespace still holds, and re-create it with fewer).
    Turned off (``read_from_replicas=False``, ``load_balancing_strategy=None``), they are the
    default and left out: redis-py warns ``read_from_replicas`` deprecated, even False."""
    given = [name for name in REPLICA_READS if options.get(name) not in (None, False)]
    if given:
        raise ConfigurationError(
            f"client_options {', '.join(given)}: settle reads on primaries only (a replica "
            "may answer an older state); leave them out"
        )
    return {name: value for name, value in options.items() if name not in REPLICA_READS}


def check_service_name(name: object) -> str:
    """``name`` as the Sentinels' name of a primary (``sentinel monitor <name> ...``). An
    empty name, one with a space or a control character, or no string at all was taken,
    and every call then failed as ``BackendError`` ("No master found") after its retries."""
    if not isinstance(name, str) or not name or not name.isprintable() or " " in name:
        raise InvalidInput(
            f"service_name must be the name the Sentinels monitor the primary under "
            f"(SENTINEL MASTERS lists them), without spaces or control characters; "
            f"got {name!r}"
        )
    return name


def parse_seed_nodes(
    nodes: str | Sequence[str | tuple[str, int]],
) -> tuple[str | None, list[tuple[str, int]]]:
    """``(url, [])`` for one node's ``redis://`` / ``rediss://`` URL, else ``(None, seeds)``
    for ``"host:port"`` strings or ``(host, port)`` pairs."""
    if isinstance(nodes, str):
        try:
            scheme = urlsplit(nodes).scheme
        except ValueError as exc:  # its text may quote the netloc, password and all
            raise InvalidInput(
                f"the Redis Cluster URL {redacted(nodes)} is not usable: {url_problem(exc)}"
            ) from None
        if scheme in ("redis", "rediss"):
            return nodes, []
        if scheme:
            raise InvalidInput(
                f"a cluster URL must start with redis:// or rediss://, got {scheme}://"
            )
        nodes = [nodes]
    # Any iterable of nodes (a generator, a set) was read before; None or a number is not.
    if isinstance(nodes, bytes) or not isinstance(nodes, Iterable):
        raise InvalidInput(
            "give the nodes as one URL, or a list of 'host:port' or (host, port), "
            f"not a {type(nodes).__name__}"
        )
    seeds = [_seed(node) for node in nodes]
    if not seeds:
        raise InvalidInput("give at least one cluster node (a URL, 'host:port' or (host, port))")
    return None, seeds


def _seed(node: object) -> tuple[str, int]:
    if isinstance(node, str):
        if "@" in node or "/" in node:  # a URL in a list: perhaps with a password
            raise InvalidInput(
                f"cluster node {redacted(node)} is not 'host:port' (a URL is given alone, "
                "not in a list)"
            )
        host, sep, port_text = node.rpartition(":")
        if not sep or not host or not is_decimal(port_text):
            raise InvalidInput(f"cluster node {node!r} is not 'host:port'")
        node = (host.strip("[]"), int(port_text))
    if (
        not isinstance(node, tuple)
        or len(node) != 2
        or not isinstance(node[0], str)
        or not node[0]
        or isinstance(node[1], bool)
        or not isinstance(node[1], int)
        or not 0 < node[1] < 65536
    ):
        raise InvalidInput(f"cluster node {node!r} is not 'host:port' or (host, port)")
    return node[0], node[1]


def is_cluster_mode(info: Mapping[str, Any]) -> bool:
    """True when one node's ``INFO server`` says it runs in cluster mode."""
    mode = info.get("redis_mode") or info.get("server_mode") or ""
    text = as_text(mode)
    return text == "cluster"


def oldest_node_info(per_node: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The ``INFO server`` of the node with the lowest version: the scripts must run on all."""
    if not per_node:
        raise ConfigurationError("the Redis Cluster reported no nodes")
    name, info = min(per_node.items(), key=lambda item: parse_server_version(item[1]))
    return {**info, "node": name}


def missing_slot_ranges(served: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The inclusive slot ranges no node serves, from the served inclusive ranges."""
    out: list[tuple[int, int]] = []
    next_free = 0
    for low, high in sorted(served):
        if low > next_free:
            out.append((next_free, low - 1))
        next_free = max(next_free, high + 1)
    if next_free < HASH_SLOTS:
        out.append((next_free, HASH_SLOTS - 1))
    return out


def check_cluster(
    states: Mapping[str, Mapping[str, Any]], served: Iterable[tuple[int, int]]
) -> None:
    """Raise ``ConfigurationError`` unless every node reports ``cluster_state:ok`` and every
    hash slot is served: a settle key may hash to any slot, so a gap fails calls at random."""
    missing = missing_slot_ranges(served)
    failing = sorted(
        node for node, info in states.items() if as_text(info.get("cluster_state")) != "ok"
    )
    if not missing and not failing:
        return
    parts = []
    if missing:
        shown = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in missing[:8])
        more = f" and {len(missing) - 8} more ranges" if len(missing) > 8 else ""
        parts.append(f"hash slots {shown}{more} are served by no node")
    if failing:
        parts.append(f"cluster_state is not ok on {', '.join(failing)}")
    raise ConfigurationError(
        "the Redis Cluster cannot serve every settle key: "
        + "; ".join(parts)
        + ". Assign every slot (CLUSTER ADDSLOTS, or redis-cli --cluster fix) and wait for "
        "cluster_state:ok before starting settle."
    )


def passed_on(given: Mapping[str, Any], kind: type | None) -> dict[str, Any]:
    """The settings (credentials, timeouts, TLS) of ``given``, a client's connection kwargs
    with ``kind`` its connection class, that a client of another node passes on."""
    settings = {k: v for k, v in given.items() if k in NODE_SETTINGS or k.startswith("ssl_")}
    if kind is not None and "SSL" in kind.__name__:
        settings["ssl"] = True
    return settings


def hash_tag(key: str) -> str | None:
    """The part of ``key`` Redis Cluster hashes when it has a non-empty ``{...}`` (the text
    between its first ``{`` and the first ``}`` after it), None when the whole key is."""
    start = key.find("{")
    if start < 0:
        return None
    end = key.find("}", start + 1)
    if end <= start + 1:
        return None
    return key[start + 1 : end]
