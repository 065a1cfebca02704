"""A Redis call's client span: its server attributes (the configured ``server.address``
/ ``server.port``, ``db.namespace``, on a cluster the node it goes to in
``network.peer.address`` / ``network.peer.port``) and the name of its failure
(``db.response.status_code`` and ``error.type``: what Redis or redis-py said, never the
settle error that wraps it, never the rest of a reply)."""

from __future__ import annotations

import re
import weakref
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisClusterException, RedisError, ResponseError

from settle._otel.spans import Span

if TYPE_CHECKING:
    from settle._telemetry import Otel

__all__ = ["Client", "redis_error", "server_attributes", "status_code"]


def server_attributes(client: Any, key: str | None) -> dict[str, Any]:
    """The attributes of the server a call goes to, as the Redis semantic conventions ask:
    ``server.address`` / ``server.port``, the address the application configured (a
    standalone client's; a cluster client's first startup node), never derived from the
    node a call goes to; ``db.namespace``; and on a cluster the node that serves ``key``'s
    slot, ``network.peer.address`` / ``network.peer.port``."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:  # standalone: the same for every call, kept with the pool
        known = _POOLS.get(pool)
        if known is None:
            known = _POOLS[pool] = _configured(pool)
        return known
    return _cluster(client, key)


#: The server attributes of each standalone client's connection pool.
_POOLS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def _configured(pool: Any) -> dict[str, Any]:
    given = getattr(pool, "connection_kwargs", None) or {}
    found: dict[str, Any] = {}
    if "path" in given:
        found["server.address"] = str(given["path"])
    elif "host" in given:
        found["server.address"] = str(given["host"])
        found["server.port"] = int(given.get("port", 6379))
    found["db.namespace"] = str(given.get("db", 0))
    return found


def _cluster(client: Any, key: str | None) -> dict[str, Any]:
    found: dict[str, Any] = {}
    startup = getattr(client, "startup_nodes", None)  # as the application gave them
    first = next(iter(startup.values() if isinstance(startup, dict) else startup or ()), None)
    if first is not None:
        found["server.address"] = str(first.host)
        found["server.port"] = int(first.port)
    found["db.namespace"] = "0"
    node = None
    if key is not None and hasattr(client, "get_node_from_key"):
        try:
            node = client.get_node_from_key(key)
        except Exception:  # noqa: BLE001  # no node known yet: report none
            node = None
    if node is not None:
        found["network.peer.address"] = str(node.host)
        found["network.peer.port"] = int(node.port)
    return found


class Client(Span):
    """A Redis call's client span. A failure is named by what Redis or redis-py said, not by
    the settle error that wraps it (the Redis semantic conventions: the original exception
    is preferred to a generic wrapper): a Redis error reply by its error prefix,
    ``db.response.status_code`` and ``error.type`` alike (``OOM``, ``ERR``...), anything
    else by the class of redis-py's exception (``ConnectionError``, ``TimeoutError``).

    A refusal the call hands back to a caller that handles it (:meth:`read_split`) is no
    failure of the span."""

    __slots__ = ("_handed_back",)

    def __init__(self, otel: Otel, span: Any, *, leaf: bool = False) -> None:
        super().__init__(otel, span, leaf=leaf)
        self._handed_back = False

    def read_split(self, refusal: BaseException) -> None:
        """The call's keys were refused together by a slot a Redis Cluster migration splits
        (TRYAGAIN, or redis-py's ClusterError after its own repeats of it) and its caller
        reads them apart, with the same answer. Named on the span, ``settle.cluster.read_split``
        (the refusal: the Redis error prefix, else redis-py's error class) beside the reply's
        ``db.response.status_code``, and not an error: neither ``error.type`` nor the status
        ``ERROR`` (OpenTelemetry's "Recording errors": an error handled so that the
        operation completes is not recorded as one; the call's span, its caller's, is no
        error either)."""
        self._handed_back = True
        original = redis_error(refusal) or refusal
        code = status_code(original)
        if code is not None:
            self.attributes["db.response.status_code"] = code
        self.attributes["settle.cluster.read_split"] = code or type(original).__qualname__

    def __exit__(self, kind: type[BaseException] | None, exc: object, tb: object) -> None:
        super().__exit__(None if self._handed_back else kind, exc, tb)

    def _failed(self, kind: type[BaseException], exc: object) -> None:
        original = redis_error(exc)
        if original is None:
            super()._failed(kind, exc)
            return
        code = status_code(original)
        if code is not None:
            self.attributes["db.response.status_code"] = code
        self.attributes["error.type"] = code or type(original).__qualname__


def redis_error(exc: object) -> BaseException | None:
    """The redis-py exception ``exc`` is or wraps (settle raises its own errors ``from``
    it), None when there is none."""
    seen = 0
    while isinstance(exc, BaseException) and seen < 8:
        if isinstance(exc, (RedisError, RedisClusterException)):
            return exc
        exc, seen = exc.__cause__, seen + 1
    return None


#: A Redis error prefix: an upper-case word (redis-py reads them the same way).
_ERROR_PREFIX = re.compile(r"[A-Z][A-Z0-9_]{0,63}")


def status_code(error: BaseException) -> str | None:
    """The error prefix of a Redis error reply (``OOM``, ``WRONGTYPE``, ``ERR``...): as
    redis-py read it (also on the replies it makes connection errors: ``NOAUTH``,
    ``LOADING``), or the first word of a reply it kept whole; None for an error Redis did
    not answer (a dropped connection, a timeout). Only the prefix: the rest of the reply
    can quote keys or arguments."""
    seen: BaseException | None = error
    for _ in range(8):  # a copy settle made of it (one per call of a batch) names its cause
        if not isinstance(seen, RedisError):
            return None
        code = getattr(seen, "status_code", None)
        if isinstance(code, str) and _ERROR_PREFIX.fullmatch(code):
            return code
        first = (str(seen.args[0]) if seen.args else "").split(" ", 1)[0]
        if isinstance(seen, ResponseError) and _ERROR_PREFIX.fullmatch(first):
            return first
        seen = seen.__cause__
    return None
