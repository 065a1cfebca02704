"""The asyncio runner: carries out planned :class:`Call` objects on a redis-py asyncio
client, standalone or Redis Cluster. Hand-written; ``_sync.py`` is generated from it by
``scripts/unasync.py`` (a test fails when the two drift apart).

Every part (the core, ``settle.cursor``, ``settle.progress``) talks to Redis through one
:class:`AsyncRunner`, so the script calls (FCALL of the part's FUNCTION library on Redis 7+
and Valkey, EVALSHA on 6.2, each reloading what a flushed or restarted server lost), the
retries of transient failures, ``WAIT`` for ``min_replicas``, cluster routing and the
start-up checks exist once.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import os
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from time import monotonic
from typing import Any, Self, TypeVar, cast

from redis import exceptions as rx
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import AskError, NoScriptError, RedisClusterException, RedisError
from tenacity import AsyncRetrying

from settle._log import logger, operation_digest
from settle._runtime import health, topology, urls
from settle._runtime.calls import Call, Unacknowledged, naming
from settle._runtime.checks import ServerChecks
from settle._runtime.options import Durability
from settle._runtime.packing import pack_command, retries_as_redis_py, tried
from settle._runtime.scripts import WAIT_PROBE, ScriptSet, wait_probe_key
from settle._runtime.transient import (
    ATTEMPTS,
    SlotSplit,
    backend_error,
    error_code,
    first_retry_delay,
    handed_back,
    is_transient,
    retry_options,
    slot_split,
    tryagain_pause,
)
from settle._telemetry import telemetry
from settle.errors import (
    BackendError,
    ConfigurationError,
    DurabilityError,
    InvalidInput,
    SettleError,
)

__all__ = [
    "CONNECT_TIMEOUT",
    "RECHECK_INTERVAL",
    "SOCKET_TIMEOUT",
    "AsyncConnectable",
    "AsyncRunner",
    "SingleFlight",
    "client_from_url",
    "cluster_client",
    "sentinel_client",
]

#: A reply that never comes must not hang a payment path forever (standalone and cluster).
SOCKET_TIMEOUT = 30.0
CONNECT_TIMEOUT = 5.0
_CLIENT_DEFAULTS: dict[str, Any] = {
    "decode_responses": False,
    "socket_timeout": SOCKET_TIMEOUT,
    "socket_connect_timeout": CONNECT_TIMEOUT,
}
_CLUSTER_DEFAULTS: dict[str, Any] = {**_CLIENT_DEFAULTS, "require_full_coverage": False}
#: Tries of one durable call on a cluster before it gives up: a node may answer with a
#: redirection or a lost script and run nothing. The longest path that ends: NOSCRIPT on the
#: slot's node, its ASK, NOSCRIPT on the importing node, the call.
_DURABLE_TRIES = 4
#: Seconds between two reads of the primaries' ``maxmemory-policy`` on the call path (one
#: ``INFO memory``, made by the first call after the interval; docs/operations.md, "Eviction
#: is refused"). A runner's ``recheck_interval`` attribute overrides it (tests set it to 0).
RECHECK_INTERVAL = 30.0


def client_from_url(url: str) -> Redis:
    """A binary-safe client for a ``redis://`` / ``rediss://`` / ``unix://`` URL, with
    socket timeouts (a ``redis://`` URL of a cluster node becomes a cluster client on the
    runner's first call)."""
    if not isinstance(url, str):
        raise InvalidInput(f"the Redis URL must be a str, got {type(url).__name__}")
    try:
        urls.check(url)  # a password holding "/": redis-py would take part of it as the port
        client = Redis.from_url(url, **_CLIENT_DEFAULTS)
        # One connection object built, nothing connected: redis-py passes a query parameter
        # it does not know on to the connection (``?socket_timout=1``), a TypeError at the
        # first command otherwise.
        pool = client.connection_pool
        pool.connection_class(**pool.connection_kwargs)
    # ValueError, TypeError: parsing; RedisError: the connection's constructor refused a
    # query value (?protocol=9). redis-py's text may quote the password: it is dropped.
    except (ValueError, TypeError, RedisError) as exc:
        raise InvalidInput(
            f"the Redis URL {urls.redacted(url)} is not usable: {urls.url_problem(exc)}"
        ) from None
    return _owned(client)


def cluster_client(
    nodes: str | Sequence[str | tuple[str, int]], options: Mapping[str, Any] | None = None
) -> RedisCluster:
    """A binary-safe cluster client from one node's URL or seed ``host:port`` nodes."""
    url, seeds = topology.parse_seed_nodes(nodes)
    kwargs = {**_CLUSTER_DEFAULTS, **topology.primary_reads(options or {})}
    try:
        if url is not None:
            return RedisCluster.from_url(url, **kwargs)
        startup = [ClusterNode(h, p) for h, p in seeds]  # type: ignore[no-untyped-call,unused-ignore]
        return RedisCluster(startup_nodes=startup, **kwargs)
    except (RedisError, RedisClusterException) as exc:
        raise backend_error(exc, None) from exc
    except ValueError as exc:  # redis-py's text may quote the password: dropped
        where = "" if url is None else f" {urls.redacted(url)}"
        raise InvalidInput(
            f"the Redis Cluster URL{where} is not usable: {urls.url_problem(exc)}"
        ) from None


def sentinel_client(
    sentinels: Sequence[str | tuple[str, int]],
    service_name: str,
    options: Mapping[str, Any] | None = None,
    sentinel_options: Mapping[str, Any] | None = None,
) -> Redis:
    """A binary-safe client of the primary that the Sentinels name ``service_name``: each new
    connection asks them again, so after a failover it reaches the promoted replica (and a
    demoted primary's READONLY reply drops the connection)."""
    # Any iterable of Sentinels (a set, a generator) was read before; one str is no list.
    if isinstance(sentinels, str | bytes) or not isinstance(sentinels, Iterable):
        raise InvalidInput(
            f"give the Sentinels as a list of 'host:port' or (host, port), not a "
            f"{type(sentinels).__name__}"
        )
    url, seeds = topology.parse_seed_nodes(list(sentinels))
    if url is not None:  # pragma: no cover - a list never parses as one URL
        raise ConfigurationError("give the Sentinels as 'host:port' or (host, port)")
    service_name = topology.check_service_name(service_name)
    timeouts = {k: _CLIENT_DEFAULTS[k] for k in ("socket_timeout", "socket_connect_timeout")}
    manager = Sentinel(seeds, sentinel_kwargs={**timeouts, **(sentinel_options or {})})  # type: ignore[no-untyped-call,unused-ignore]
    client: Redis = manager.master_for(service_name, **{**_CLIENT_DEFAULTS, **(options or {})})  # type: ignore[no-untyped-call,unused-ignore]
    return _owned(client)


#: The clients settle made itself (``from_url``, ``from_sentinel``): their pools serve one
#: facade, which closes them, so its runner may keep connections between calls (``_Lane``).
_OWNED: weakref.WeakSet[Redis] = weakref.WeakSet()


_C = TypeVar("_C", bound=Redis | RedisCluster)


def _cancellable(client: _C) -> _C:
    """A client the runner uses (given, or one it makes: a cluster node's for the durable
    path, a replica probe): on asyncio, its sends keep cancellations on Python 3.11
    (settle/_runtime/cancel_safe.py)."""
    # unasync: async-only
    from settle._runtime.cancel_safe import keep_cancellations  # noqa: PLC0415

    keep_cancellations(client)
    # unasync: end
    return client


def _owned(client: Redis) -> Redis:
    _OWNED.add(client)
    return client


_T = TypeVar("_T")


class _Flight:
    """One run of a check that concurrent callers share (:class:`SingleFlight`)."""

    def __init__(self) -> None:
        #: Set once the run ended, whatever its outcome.
        self.done = asyncio.Event()
        self.result: Any = None
        #: The run's failure, copied as it was raised (before its caller's frames named
        #: their call in it): each waiter raises a copy of its own.
        self.failure: Exception | None = None
        #: The leader was cancelled (or interrupted): no outcome; a waiter runs it anew.
        self.abandoned = False


class SingleFlight:
    """The start-up checks and the re-checks after a loss, run once for every concurrent
    caller that needs them (tasks, or threads of the sync runtime): the first caller runs
    the check, the others wait for its outcome. A failure reaches each waiter as its own
    copy of the typed error the check raised, and the next call tries again; a leader that
    is cancelled leaves no outcome, and one of its waiters runs the check instead. Without
    it a burst on a cold (or flushed, or restarted) server ran one check per call, each on
    a connection of the client's pool, which raises once it has lent them all.

    One flight per ``key`` at a time; a check must not wait for a flight of its own key
    (it would wait for itself)."""

    def __init__(self) -> None:
        #: Guards ``_flights``; never held across the network (the sync runtime's threads).
        self._lock = threading.Lock()
        self._flights: dict[str, _Flight] = {}

    async def run(self, key: str, check: Callable[[], Awaitable[_T]]) -> _T:
        """``check()``'s outcome: of this caller's run, or of the run under way."""
        while True:
            with self._lock:
                flight = self._flights.get(key)
                leading = flight is None
                if flight is None:
                    flight = self._flights[key] = _Flight()
            if leading:
                return await self._lead(key, flight, check)
            await flight.done.wait()
            if flight.failure is not None:
                raise _copied(flight.failure)
            if not flight.abandoned:
                return cast(_T, flight.result)

    async def _lead(self, key: str, flight: _Flight, check: Callable[[], Awaitable[_T]]) -> _T:
        try:
            flight.result = await check()  # before ``done``: a thread may wake at once
        except Exception as exc:
            flight.failure = _copied(exc)
            raise
        except BaseException:  # cancelled, interrupted: a waiter runs the check instead
            flight.abandoned = True
            raise
        finally:
            with self._lock:
                del self._flights[key]
            flight.done.set()
        return cast(_T, flight.result)


def _copied(exc: Exception) -> Exception:
    """A copy of ``exc`` with its attributes, cause and traceback: each caller that raises
    it may name its own call in it (``naming``), and one object raised in many tasks or
    threads would carry each one's frames into the next."""
    try:
        dup = copy.copy(exc)
    except Exception:  # noqa: BLE001 - an exception class that does not copy: shared
        return exc
    dup.__cause__, dup.__suppress_context__ = exc.__cause__, exc.__suppress_context__
    return dup.with_traceback(exc.__traceback__)


class AsyncConnectable:
    """What every facade over a runner shares (``AsyncSettler``, ``AsyncCursorStore``,
    ``AsyncProgressStore``): one way to connect (``from_url``, ``from_cluster``,
    ``from_sentinel``), the client, and closing (``aclose``, ``async with``)."""

    _runner: Any

    def __init__(self, client: Any, *args: Any, **options: Any) -> None:
        raise NotImplementedError  # pragma: no cover - each facade defines its own

    @classmethod
    def from_url(cls, url: str, *args: Any, **options: Any) -> Self:
        """Connect to ``redis://`` / ``rediss://`` / ``unix://`` URLs (binary-safe client,
        socket timeouts); ``options`` are the facade's own (``min_replicas``...)."""
        return cls(client_from_url(url), *args, **options)

    @classmethod
    def from_cluster(
        cls,
        nodes: str | list[str] | list[tuple[str, int]],
        *args: Any,
        client_options: dict[str, Any] | None = None,
        **options: Any,
    ) -> Self:
        """Connect to a Redis Cluster: one node's ``redis://`` URL, or seed nodes as
        ``"host:port"`` / ``(host, port)``. ``client_options`` go to redis-py's
        ``RedisCluster`` (password, timeouts...); ``options`` are the facade's own."""
        return cls(cluster_client(nodes, client_options), *args, **options)

    @classmethod
    def from_sentinel(
        cls,
        sentinels: list[str] | list[tuple[str, int]],
        *args: Any,
        service_name: str,
        client_options: dict[str, Any] | None = None,
        sentinel_options: dict[str, Any] | None = None,
        **options: Any,
    ) -> Self:
        """Connect to the primary that Redis Sentinel names ``service_name``; after a
        failover the next connection goes to the promoted replica. ``sentinels``:
        ``"host:port"`` / ``(host, port)`` of the Sentinels. ``client_options`` go to the
        primary's client (password, timeouts...), ``sentinel_options`` to the clients of the
        Sentinels themselves; ``options`` are the facade's own (use ``min_replicas=1``: a
        failover loses the writes its replica had not received)."""
        client = sentinel_client(sentinels, service_name, client_options, sentinel_options)
        return cls(client, *args, **options)

    @property
    def client(self) -> Any:
        """The redis-py client this runs on (``None`` for ``settle.testing``'s model)."""
        return getattr(self._runner, "client", None)

    async def _command(
        self, what: str, send: Callable[[Any], Awaitable[Any]], *, key: str | None = None
    ) -> Any:
        """One plain, repeatable command that ``send(client)`` issues on the client it is
        given (on a cluster, ``key``'s node's own when ``key`` is named), with the runner's
        retries and error mapping: a Redis failure reaches the caller as settle's
        :class:`~settle.errors.BackendError` (or ``ConfigurationError``), never as
        redis-py's own error. For settle's tools that read beside the scripts (the console:
        the server's clock, its sessions)."""
        return await self._runner.command(what, send, key=key)

    async def _companion(self, scripts: ScriptSet) -> AsyncRunner:
        """A runner of another part's ``scripts`` on this facade's client and durability
        (the console's sessions on its settler; :meth:`AsyncRunner.companion`)."""
        runner: AsyncRunner = await self._runner.companion(scripts)
        return runner

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections (the client is closed with them)."""
        await self._runner.aclose()


class AsyncRunner:
    """Runs the calls of one part's ``scripts``: as FCALL of the set's FUNCTION library when
    :meth:`prepare` finds Redis 7+ or Valkey (the library is loaded there, and again on a
    node that answers "Function not found"), else as EVALSHA of one registered script object
    per script (loaded again on NOSCRIPT).

    Each script call is tried up to ``settle._runtime.transient.ATTEMPTS`` times with the
    same KEYS and ARGV when the connection drops or times out: every settle script is safe to
    repeat. A script's own error is never retried.
    """

    def __init__(
        self,
        client: Redis | RedisCluster,
        scripts: ScriptSet,
        durability: Durability,
        *,
        _owner: AsyncRunner | None = None,
    ) -> None:
        self._set = scripts
        #: The runner whose client this one runs on (:meth:`companion`): that one keeps
        #: connections, holds the cluster nodes' clients and closes them all.
        self._owner = _owner
        self._durability = durability
        #: The server checks' state, shared with the companions (:meth:`companion`): a
        #: check, or evidence, found by any of them is seen by all.
        self._checks: ServerChecks = (
            ServerChecks(RECHECK_INTERVAL) if _owner is None else _owner._checks
        )
        #: The count of :meth:`suspect` calls (``ServerChecks.losses``) after which this runner
        #: last loaded its own scripts (the full check, :meth:`_prepare_once`); another
        #: count, or None: this runner's full check is due, whatever the others did.
        self._loaded: int | None = None
        #: Counts this runner's full checks that passed (each loaded its scripts): a call
        #: that found its script gone loads it itself only if none passed since it was sent.
        self._loads = 0
        #: The checks under way, which concurrent calls share (:class:`SingleFlight`).
        self._flight = SingleFlight()
        #: FCALL of the library (Redis 7+, Valkey) rather than EVALSHA: decided by prepare().
        self._fcall = False
        #: The server answered FCALL with "unknown command" (renamed or disabled, or a
        #: rollback to 6.2): every later check keeps EVALSHA, for the runner's lifetime.
        self._fcall_unknown = False
        #: The last check found FUNCTION libraries but could neither load the library nor
        #: see it listed (an ACL without FUNCTION LOAD): the runner keeps EVALSHA, and an
        #: EVALSHA refused (NOPERM: a user allowed FCALL only) looks for the library again
        #: (:meth:`_listed_since`), which an admin may have loaded since.
        self._load_refused = False
        #: The client of a cluster node's URL, replaced by a cluster client: closed when
        #: replaced and again at :meth:`aclose` (a concurrent first call may still have
        #: been using one of its connections when it was first closed, and returns it later).
        self._retired: list[Redis] = []
        #: The companions made on this runner (:meth:`companion`), one per script set.
        self._companions: dict[str, AsyncRunner] = {}
        _check_wait_fits(client, durability)
        self._use(client)

    def _use(self, client: Redis | RedisCluster) -> None:
        self.client = client
        #: Whether ``client`` is a cluster client, read once: redis-py's ``RedisCluster`` is
        #: a ``Protocol`` class, whose ``isinstance`` runs typing's Python-level check, and
        #: every call asks (:meth:`_node_of`).
        self._cluster = isinstance(client, RedisCluster)
        lane = _Lane
        # unasync: async-only
        lane = _Pipelined
        # unasync: end
        _cancellable(client)
        self._lane = (
            None
            if isinstance(client, RedisCluster)
            else lane(
                client.connection_pool,
                keep=client in _OWNED and self._owner is None,
                dropped=self.idle_dropped,
                due=self._due,
                check=self._check,
            )
        )
        self._nodes: dict[str, Redis] = {} if self._owner is None else self._owner._nodes
        #: A node's connection failed: re-read the cluster's topology before the next call,
        #: so a failover's promoted replica is found (the durable path keeps its own
        #: per-node clients, which redis-py's own refresh does not reach).
        self._stale_topology = False
        self._scripts = {
            name: client.register_script(self._set.source(name)) for name in self._set.names
        }

    @property
    def is_cluster(self) -> bool:
        return self._cluster

    async def companion(self, scripts: ScriptSet) -> AsyncRunner:
        """A runner of another part's ``scripts`` on this runner's client, with its
        durability (the console's sessions on its settler's): FCALL or EVALSHA, reloads,
        retries, routing and ``WAIT`` as every settle call. This runner checks the server
        first when nothing did yet (a cluster node's URL becomes the cluster client both run
        on). The companion owns nothing: it keeps no connection of the pool between calls,
        its cluster nodes' clients are this runner's, and closing it closes nothing (this
        runner closes them all). It shares this runner's server checks (:meth:`suspect`,
        the recheck): a check or evidence of either is the other's too; what belongs to
        its script set (FCALL or EVALSHA, its scripts loaded) is its own. One per script
        set: asked again (another console on the same settler, every ``end_sessions``), the
        same one, whose scripts are loaded."""
        if self._checks.checked_at is None:
            await self.prepare()
        found = self._companions.get(scripts.library_name)
        if found is None:
            found = AsyncRunner(self.client, scripts, self._durability, _owner=self)
            self._companions[scripts.library_name] = found
        return found

    # -- start-up --------------------------------------------------------------------------

    async def prepare(self) -> dict[str, Any]:
        """Check the server before the first call, and again after evidence that it lost
        its data or restarted (:meth:`suspect`): version (the oldest node's on a cluster),
        every hash slot served, and a ``maxmemory-policy`` that cannot evict settle's records
        (every primary's and replica's); switch a cluster node's URL to a cluster client.
        Returns the ``INFO server`` it judged (empty when the ACL denies INFO). Transient
        failures are repeated. Concurrent callers share one run (:class:`SingleFlight`)."""
        try:
            return await AsyncRetrying(**retry_options(None))(self._full_check)
        except (RedisError, RedisClusterException) as exc:
            raise backend_error(exc, None) from exc

    async def _full_check(self, evidence: int | None = None) -> dict[str, Any]:
        """One try of :meth:`prepare`, shared with the concurrent callers that saw the same
        evidence count (``evidence``; None: now), never with one that saw less: its check
        began before the evidence this caller saw (a connection found dropped while it ran)
        and read the server as it was before."""
        if evidence is None:
            with self._checks.lock:
                evidence = self._checks.evidence
        check = functools.partial(self._prepare_once, evidence)
        return await self._flight.run(f"full {evidence}", check)

    async def _prepare_once(self, evidence: int | None = None) -> dict[str, Any]:
        """One try of :meth:`prepare`; a transient failure is raised as it came.
        ``evidence``: the evidence count the check answers (read when it was found due)."""
        with self._checks.lock:
            losses = self._checks.losses
            if evidence is None:
                evidence = self._checks.evidence
        info: dict[str, Any] = await self._server_info()
        if info:  # INFO denied by the ACL: the version is not known, FUNCTION is tried
            topology.check_server(info)
        replication = await self._replication()  # a replica is refused before anything
        # Decided again on every check: a failover or a rollback may bring a server
        # without FUNCTION (or one that now refuses FUNCTION LOAD).
        fcall = self._load_refused = False
        if (not info or topology.has_functions(info)) and not self._fcall_unknown:
            fcall = await self._load_everywhere()
        if not fcall:
            await self._load_scripts()
        # A call may have found FCALL unknown while this check ran: that finding stands.
        self._fcall = fcall and not self._fcall_unknown
        policies, primaries = await self._eviction_policies(replication)
        warnings = health.check_eviction(policies, allow=self._durability.allow_eviction)
        if warnings.allowed:
            logger.warning("settle.backend.eviction_allowed", policy=",".join(warnings.allowed))
        if warnings.unread:
            nodes = ",".join(node or "server" for node in warnings.unread)
            logger.warning("settle.backend.eviction_unknown", nodes=nodes)
        self._passed(evidence, primaries)
        self._loaded = losses
        self._loads += 1
        return info

    def suspect(self, mark: int | None = None) -> None:
        """Evidence that the server lost its data (a script's ``unclaimed`` reply, NOSCRIPT,
        a missing FUNCTION library): every check of :meth:`prepare` runs again before the
        next call, of this runner and of those that share its client (:meth:`companion`),
        each loading its own scripts again. ``mark``: :meth:`check_mark` when the call that
        found it was sent. A full check that passed since, or one due or under way, answers
        it: the same loss, found by another call in flight with it (a burst finds one loss
        with every call), or by this call before its own check."""
        checks = self._checks
        with checks.lock:
            pending = checks.checked_at is None or self._loaded != checks.losses
            if mark is not None and (pending or mark != self._loads):
                return
            self._checks.evidence += 1
            self._checks.losses += 1
            self._checks.checked_at = None

    def check_mark(self) -> int:
        """The count of this runner's full checks that passed, taken before a call is sent
        and given to :meth:`suspect` with what it found."""
        return self._loads

    def idle_dropped(self) -> None:
        """A kept connection was found closed by the server while idle: :meth:`dropped`,
        unless a check is due or under way already, which reads the server after it closed
        that connection (a restart closes every kept one: one re-read for all)."""
        checked = self._checks.checked_at
        if checked is not None and checked != float("-inf"):
            self.dropped()

    def dropped(self) -> None:
        """Evidence that the server may have restarted (a connection it closed or that
        failed): the primaries' eviction policy is read again before anything more is sent
        (a restart that lost the data shows as NOSCRIPT or a missing library:
        :meth:`suspect`)."""
        checks = self._checks
        with checks.lock:
            checks.evidence += 1
            if checks.checked_at is not None:
                checks.checked_at = float("-inf")

    def _passed(self, evidence: int, primaries: Iterable[str] = ()) -> None:
        """The checks passed, having started when the evidence count was ``evidence``: not
        due again until the interval, unless evidence came while they ran. ``primaries``:
        the cluster primaries whose policy they read (:meth:`ServerChecks.unjudged`)."""
        with self._checks.lock:
            if self._checks.evidence == evidence:
                self._checks.checked_at = monotonic()
            if isinstance(self.client, RedisCluster):
                self._checks.judged.update(primaries)

    @property
    def recheck_interval(self) -> float:
        """Seconds between two reads of the eviction policy on the call path
        (:data:`RECHECK_INTERVAL`), of this runner and those that share its client."""
        return self._checks.interval

    @recheck_interval.setter
    def recheck_interval(self, seconds: float) -> None:
        self._checks.interval = seconds

    def _needs_check(self, call: Call | None) -> bool:
        """Whether :meth:`_check` runs before ``call``: the checks are due, or ``call``'s
        key is on a cluster primary they never read (:meth:`ServerChecks.unjudged`)."""
        # Only a cluster client has primaries of its own to judge (checked first: cheap).
        return self._due() or (self._cluster and self._checks.unjudged(self._node_of(call)))

    def _due(self) -> bool:
        checks = self._checks  # read before every script call: one look-up
        checked = checks.checked_at
        return (
            checked is None
            or self._loaded != checks.losses
            or monotonic() - checked >= checks.interval
        )

    async def _check(self, call: Call | None) -> None:
        """The server checks that are due, inline before ``call`` (no thread): all of
        :meth:`prepare` when :meth:`suspect` (or nothing yet) asked for them, else the
        eviction policy, one ``INFO memory``, once ``recheck_interval`` passed: of the
        server, or on a cluster of the primary that holds ``call``'s key (every primary for a
        call without keys; a hung primary must not fail the calls of the others). A refusal
        raises the start-up's :class:`ConfigurationError`; the call is not sent.

        One try, inside one of ``call``'s tries: a transient failure here is that try's
        failure, repeated and counted by the call's own retries (a check that repeated on
        its own would multiply them). Concurrent calls that find the same check due share
        one run of it (:class:`SingleFlight`), and its outcome, a failure too."""
        with naming(call) if call is not None else contextlib.nullcontext():
            checks = self._checks
            with checks.lock:  # what is due, and the evidence it answers, read together
                evidence = checks.evidence
                full = checks.checked_at is None or self._loaded != checks.losses
            if full:
                await self._full_check(evidence)
                return
            node = self._node_of(call)
            if node is not None and self._node_fresh(node.name, evidence):
                return
            recheck = functools.partial(self._recheck, node, evidence)
            name = "" if node is None else node.name
            await self._flight.run(f"policy {name} {evidence}", recheck)  # as :meth:`_full_check`

    async def _recheck(self, node: Any, evidence: int) -> None:
        """The periodic read of the eviction policy (:meth:`_check`): of the server, of the
        cluster primary ``node``, or of every primary (``node`` None)."""
        policies = await self._primary_policies(node)
        health.check_eviction(policies or {"": None}, allow=self._durability.allow_eviction)
        if node is None:
            self._passed(evidence, policies or ())
        else:
            promoted = self._checks.unjudged(node)
            self._node_passed(node.name, evidence)
            if promoted:
                await self._forget_demoted(str(node.name))

    def _node_passed(self, name: str, evidence: int) -> None:
        """The cluster primary ``name`` passed its recheck; once every primary has, since
        the last evidence, the checks are not due again until the oldest of those rechecks
        is ``recheck_interval`` old (calls skip the per-call lookup of their primary)."""
        assert isinstance(self.client, RedisCluster)
        primaries = [p.name for p in self.client.get_primaries()]  # type: ignore[no-untyped-call,unused-ignore]
        checks = self._checks
        with checks.lock:
            checks.nodes[name] = (evidence, monotonic())
            checks.judged.add(name)
            stamps = [checks.nodes.get(primary) for primary in primaries]
            times = [stamp[1] for stamp in stamps if stamp is not None and stamp[0] == evidence]
            every = primaries and len(times) == len(primaries)
            if every and checks.evidence == evidence and checks.checked_at is not None:
                checks.checked_at = min(times)

    async def _forget_demoted(self, promoted: str) -> None:
        """A primary the checks never read took calls: a failover promoted it (or it was
        added). Every other primary they read is asked its role (``INFO replication``); one
        that answers as a replica (demoted by that failover), or does not answer, is read
        again before its next call: a failback may promote it again after its policy
        changed while it was a replica, and redis-py would follow on its own. Its own view
        of which nodes are primaries lags such a failover (a demoted node may still be
        listed), so the ones it lists are asked, each through a probe of one try of at most
        2 s (a hung one must not hold the call up for the client's timeouts and retries);
        one it no longer lists is not asked. One that refuses INFO keeps its place: its
        role is unknown, as its policy was (forgotten, every call on another primary would
        read it and ask the others again, for good)."""
        assert isinstance(self.client, RedisCluster)
        listed = {p.name: p for p in self.client.get_primaries()}  # type: ignore[no-untyped-call,unused-ignore]
        with self._checks.lock:  # the sync runtime's threads add to it meanwhile
            judged = sorted(self._checks.judged - {promoted})
        for name in judged:
            node = listed.get(name)
            if node is None or await _role_of(node) not in ("master", _REFUSED):
                self._checks.forget(name)

    def _node_of(self, call: Call | None) -> Any:
        """The cluster primary that serves ``call``'s key, whose policy its periodic recheck
        reads; None on a single server, or for a call without keys (every primary is read)."""
        if call is None or not call.keys or not self._cluster:
            return None
        # ``_cluster`` says it is one (an isinstance here would run the Protocol check again)
        client = cast(RedisCluster, self.client)
        return client.get_node_from_key(call.keys[0])  # type: ignore[no-untyped-call,unused-ignore]

    def _node_fresh(self, name: str, evidence: int) -> bool:
        """Whether the primary ``name`` passed a recheck since the last evidence, within
        ``recheck_interval``."""
        stamp = self._checks.nodes.get(name)
        return (
            stamp is not None
            and stamp[0] == evidence
            and monotonic() - stamp[1] < self._checks.interval
        )

    def _function_missing(self, reply: object) -> bool:
        """Whether ``reply`` says the server does not hold the library, or knows no FCALL;
        the latter (renamed or disabled, a rollback to Redis 6.2) is remembered, so every
        later check keeps EVALSHA instead of loading the library again."""
        missing = topology.missing_function(reply)
        if missing == "fcall" and not self._fcall_unknown:
            self._fcall_unknown = True
            logger.warning(
                "settle.backend.functions_refused",
                library=self._set.library_name,
                reason="unknown_command",
                error=type(reply).__name__,
            )
        return missing is not None

    async def _lost(self, call: Call, mark: int) -> None:
        """``call`` met evidence that the server lost its data or restarted (NOSCRIPT, a
        missing library): every check again, now, before the call is sent again (one run
        for every call in flight that found the same loss: ``mark``, :meth:`check_mark`
        when it was sent, :meth:`suspect`). When it returns, a full check passed since the
        call was sent, and loaded every script (and the library) the call needs."""
        self.suspect(mark)
        await self._check(call)

    async def _load_everywhere(self) -> bool:
        """Load the library on the server (each primary of a cluster); when the server
        refuses FUNCTION LOAD (an ACL without it, a renamed command), the library another
        user loaded there (``settle doctor`` run by an admin) is called all the same; False
        when it is not there, or cannot be listed: the runner keeps EVALSHA."""
        try:
            if isinstance(self.client, RedisCluster):
                for node in self.client.get_primaries():  # type: ignore[no-untyped-call,unused-ignore]
                    await self._load_library(node=node)
            else:
                await self._load_library()
        except rx.ResponseError as exc:
            text = str(exc)
            if not isinstance(exc, rx.NoPermissionError) and "unknown" not in text.lower():
                raise
            if await self._preloaded():
                return True
            refused = isinstance(exc, rx.NoPermissionError)
            logger.warning(
                "settle.backend.functions_refused",
                library=self._set.library_name,
                reason="no_permission" if refused else "unknown_command",
                error=type(exc).__name__,
            )
            self._load_refused = True
            return False
        return True

    async def _listed_since(self, reply: object) -> bool:
        """Whether ``reply``, an EVALSHA's, is a refusal (NOPERM) on a runner that keeps
        EVALSHA only because it could not load the library, and ``FUNCTION LIST`` shows the
        library now (an admin ran ``settle doctor`` after the server lost it, or after this
        runner started): then the runner calls FCALL from now on, and the call is sent
        again. A user allowed FCALL alone was refused every call until its process
        restarted."""
        if not (isinstance(reply, rx.NoPermissionError) and self._load_refused):
            return False
        if self._fcall_unknown or not await self._preloaded():
            return False
        self._load_refused, self._fcall = False, True
        logger.info("settle.backend.library_listed", library=self._set.library_name)
        return True

    async def _preloaded(self) -> bool:
        """Whether ``FUNCTION LIST`` shows the library on the server (on each primary of a
        cluster); False when FUNCTION LIST is refused too."""
        name = self._set.library_name
        try:
            if isinstance(self.client, RedisCluster):
                for node in self.client.get_primaries():  # type: ignore[no-untyped-call,unused-ignore]
                    listed = await self.client.execute_command(  # type: ignore[no-untyped-call,unused-ignore]
                        "FUNCTION", "LIST", "LIBRARYNAME", name, target_nodes=node
                    )
                    if not topology.lists_library(listed, name):
                        return False
                return True
            return topology.lists_library(await self.client.function_list(name), name)
        except rx.ResponseError:
            return False

    async def _load_scripts(self) -> None:
        """``SCRIPT LOAD`` every script (on each primary of a cluster), so that NOSCRIPT
        later means the server lost them (a restart, SCRIPT FLUSH) rather than a first use.
        A user refused SCRIPT LOAD keeps EVALSHA of scripts loaded by someone else."""
        sources = [script.script for script in self._scripts.values()]
        try:
            if isinstance(self.client, RedisCluster):
                for source in sources:  # redis-py sends SCRIPT LOAD to every primary
                    await self.client.script_load(source)
                return
            async with self.client.pipeline(transaction=False) as pipe:
                for source in sources:
                    pipe.script_load(source)
                await pipe.execute()
        except rx.NoPermissionError:
            return

    async def _load_library(self, *, node: Any = None, client: Redis | None = None) -> None:
        """``FUNCTION LOAD`` the library, never REPLACE (its name carries its content's
        hash: "already exists" is the same library): on ``client``, on a cluster's ``node``
        (every primary when None), else on the server."""
        library = self._set.library
        try:
            if client is not None:
                await client.function_load(library)
            elif isinstance(self.client, RedisCluster):
                if node is None:
                    for primary in self.client.get_primaries():  # type: ignore[no-untyped-call,unused-ignore]
                        await self._load_library(node=primary)
                    return
                await self.client.execute_command(  # type: ignore[no-untyped-call,unused-ignore]
                    "FUNCTION", "LOAD", library, target_nodes=node
                )
            else:
                await self.client.function_load(library)
        except rx.ResponseError as exc:
            if "already exists" not in str(exc):
                raise

    async def _replication(self) -> dict[str, Any] | None:
        """``INFO replication`` of a standalone (or Sentinel-managed) server, None on a
        cluster (whose client writes to primaries only) or when INFO is denied. A server
        that is a replica is refused (:func:`health.check_primary`): one named by the URL
        with :class:`ConfigurationError`; one the Sentinels name (a failover under way, or
        their view not updated yet) with a transient ``ConnectionError``, after closing the
        pool's idle connections, so the call's next try asks the Sentinels again."""
        if isinstance(self.client, RedisCluster):
            return None
        try:
            replication: dict[str, Any] = await self.client.info("replication")
        except rx.ResponseError:
            return None
        if health.replica_of(replication) is not None and _sentinel_managed(self.client):
            await self.client.connection_pool.disconnect(inuse_connections=False)
            raise rx.ConnectionError(
                f"the Sentinels name a replica of {health.replica_of(replication)} as the "
                "primary (a failover under way?)"
            )
        health.check_primary(replication)
        return replication

    async def _eviction_policies(
        self, replication: Mapping[str, Any] | None
    ) -> tuple[dict[str, str | None], list[str]]:
        """The ``maxmemory_policy`` of each primary and of each replica (a failover makes a
        replica the primary, with its own policy) from ``INFO memory`` (CONFIG GET is often
        blocked on managed Redis); ``None`` where INFO is denied, a replica is out of reach,
        or the reply does not say; and the names of the primaries read. ``replication``: a
        standalone server's ``INFO replication`` (:meth:`_replication`; None: denied), which
        lists its replicas."""
        found = await self._primary_policies()
        if found is None:
            return {"": None}, []
        primaries = list(found)
        if isinstance(self.client, RedisCluster):
            for replica in self.client.get_replicas():  # type: ignore[no-untyped-call,unused-ignore]
                probe = _cancellable(Redis(**{**_node_settings(replica), **_probe_options()}))
                found[f"{replica.host}:{replica.port}"] = await _policy_of(probe)
            return found, primaries
        pool = self.client.connection_pool
        settings = topology.passed_on(pool.connection_kwargs, pool.connection_class)
        if replication is None:  # the primary's policy is still judged; say what was not
            found["its replicas (INFO replication denied)"] = None
            return found, primaries
        replid = replication.get("master_replid")
        for host, port in health.replica_addresses(replication):
            node = {"host": host, "port": port, "decode_responses": False}
            probe = _cancellable(Redis(**{**settings, **node, **_probe_options()}))
            found[f"{host}:{port}"] = await _policy_of(probe, replicating=replid)
        return found, primaries

    async def _primary_policies(self, node: Any = None) -> dict[str, str | None] | None:
        """The ``maxmemory_policy`` of the server, or of each primary of a cluster (only of
        ``node``, one of them, when given), from ``INFO memory``; None when INFO is denied
        (NOPERM, or renamed away)."""
        try:
            if node is not None:
                info = await self.client.info("memory", target_nodes=node)  # type: ignore[call-arg,unused-ignore]
                return {str(node.name): health.eviction_policy(info)}
            if isinstance(self.client, RedisCluster):
                every = RedisCluster.PRIMARIES
                per_node = _per_node(await self.client.info("memory", target_nodes=every))
                return {node: health.eviction_policy(info) for node, info in per_node.items()}
            return {"": health.eviction_policy(await self.client.info("memory"))}
        except rx.ResponseError:
            return None

    async def _server_info(self) -> dict[str, Any]:
        """``INFO server`` of the server (of a cluster's oldest node); empty when the ACL
        denies INFO (``-info``, or ``-@dangerous``): the version is not checked and a
        cluster node's URL is not recognised, and the eviction policy, unread, is warned
        of (``settle.backend.eviction_unknown``), never refused (docs/operations.md)."""
        node = self.client
        if not isinstance(node, RedisCluster):
            try:
                info: dict[str, Any] = await node.info("server")
            except rx.NoPermissionError:
                return {}
            if not topology.is_cluster_mode(info):
                return info
            if self.client is node:  # concurrent first calls: only one of them switches
                await self._switch_to_cluster(node)
        cluster = self.client
        assert isinstance(cluster, RedisCluster)
        every = RedisCluster.ALL_NODES
        try:
            per_node = _per_node(await cluster.info("server", target_nodes=every))
        except rx.NoPermissionError:
            per_node = {}
        states = _per_node(await cluster.cluster_info(target_nodes=every))
        slots: Mapping[tuple[int, int], Any] = await cluster.cluster_slots()  # type: ignore[assignment,unused-ignore]  # redis-py parses it into {(low, high): nodes}
        topology.check_cluster(states, list(slots))
        return topology.oldest_node_info(per_node) if per_node else {}

    async def _switch_to_cluster(self, node: Redis) -> None:
        pool = node.connection_pool
        given = pool.connection_kwargs
        if "path" in given or str(given.get("db", 0)) != "0":
            raise ConfigurationError(
                "the server is a Redis Cluster node: connect over TCP with database 0 "
                "(redis://host:port/0), or use from_cluster()"
            )
        kwargs = topology.passed_on(given, pool.connection_class)
        logger.info("settle.backend.cluster_detected", host=kwargs["host"], port=kwargs["port"])
        self._use(RedisCluster(**{**_CLUSTER_DEFAULTS, **kwargs}))
        self._retired.append(node)
        await node.aclose()

    # -- scripts ---------------------------------------------------------------------------

    async def run(self, call: Call) -> Any:
        """Run one script call; its raw reply (the part decodes it). A reply whose code is
        one of the set's ``lost``, or a reply of a script of the set's ``gone`` without the
        state its caller had read, makes every server check due again before the next call.
        (The core's ``unclaimed``, a shard's state gone, is the settler's to judge: the
        core says a loss once for every call that found it, and the settler then calls
        :meth:`suspect`.)"""
        mark = self._loads  # before it is sent (:meth:`suspect`)
        reply = await self._call(call)
        body = reply.reply if isinstance(reply, Unacknowledged) else reply
        if type(body) is list and body and self._lost_data(call, body):
            self.suspect(mark)
        return reply

    async def run_or_apart(self, call: Call, apart: Callable[[Any], Awaitable[Any]]) -> Any:
        """Run ``call``, a read whose caller can read its keys one at a time: on Redis
        Cluster, one a migration refuses while it splits the keys between two nodes
        (:class:`SlotSplit`, handed back at once, never logged as a failure) is answered by
        ``apart(call)`` instead (docs/operations.md, "Redis Cluster")."""
        try:
            return await self.run(replace(call, caller_splits=True))
        except SlotSplit:
            with telemetry().read_apart(call.script):  # the reads apart: one trace
                return await apart(call)

    def _lost_data(self, call: Call, reply: list[Any]) -> bool:
        """Whether ``reply`` says the server lost data: a code of the set's ``lost``, or no
        state in the reply of a script of the set's ``gone`` (its caller had just read that
        state)."""
        code = reply[0]
        if self._set.lost:
            if isinstance(code, bytes):
                code = code.decode("utf-8", "replace")
            if code in self._set.lost:
                return True
        return call.script in self._set.gone and len(reply) > 3 and not reply[3]

    async def _call(self, call: Call) -> Any:
        with telemetry().redis(self.client, self._command(), call) as span:
            lost: list[BaseException] = []  # tries whose reply was lost: they may have run

            async def once(call: Call) -> Any:
                try:
                    return await self._run_once(call)
                except RedisError as exc:
                    _note_lost(lost, exc)
                    raise

            try:
                try:
                    # The first try without once's frame (every call makes it; few repeat).
                    return await self._run_once(call)
                except (RedisError, RedisClusterException) as exc:
                    if isinstance(exc, RedisError):
                        _note_lost(lost, exc)
                    if not is_transient(exc) or handed_back(call, exc):
                        raise
                    await asyncio.sleep(first_retry_delay(call, exc))
                retrying = AsyncRetrying(**retry_options(call, tries=ATTEMPTS - 1))
                return await retrying(once, call)
            except (RedisError, RedisClusterException) as exc:
                if handed_back(call, exc):  # a migration's refusal its caller reads apart
                    span.read_split(exc)  # no error: the caller's reads apart answer
                    raise slot_split(exc, call) from exc
                raise backend_error(
                    exc, call, earlier_unknown=any(e is not exc for e in lost)
                ) from exc
            except SettleError as exc:  # a refusal of a check on the way (the lane's too)
                if exc.operation_id is None:
                    exc.operation_id = call.operation_id
                raise

    async def _run_once(self, call: Call) -> Any:
        """One try of ``call``, after the server checks that are due (before the first try,
        and before a repeat after a dropped connection: every ConnectionError is evidence
        that the server may have restarted)."""
        try:
            if self._needs_check(call):
                await self._check(call)
            mark = self._loads  # after the checks, as the call is sent (:meth:`suspect`)
            if (
                self._durability.min_replicas
                and call.script in self._set.writing
                and not call.reads_only
            ):
                return await self._run_durable(call)
            if self._fcall:
                try:
                    return await self._fcall_once(call)
                except rx.ResponseError as exc:
                    if not self._function_missing(exc):
                        raise
                # A restart without persistence, FUNCTION FLUSH, a new cluster node, a
                # failover to a server without FUNCTION: check the server again, which
                # decides FCALL or EVALSHA again; load, call again.
                logger.info("settle.backend.library_reloaded", library=self._set.library_name)
                await self._lost(call, mark)
                if self._fcall:
                    return await self._fcall_once(call)
            script = self._scripts[call.script]
            try:
                return await self._evalsha(script.sha, call)
            except NoScriptError:  # a flushed or restarted server: check, load once, call again
                await self._lost(call, mark)
                return await self._evalsha(script.sha, call)
            except rx.NoPermissionError as exc:
                if not await self._listed_since(exc):
                    raise
                return await self._fcall_once(call)
        except rx.ConnectionError as exc:
            _drop_evidence(self, exc)
            # redis-py's Sentinel connection turns a bare READONLY (Redis 7+, Valkey) into a
            # ConnectionError of its own, dropping that one connection: the others kept are
            # the demoted node's too.
            if topology.demoted_behind(exc):
                await self._demoted(call)
            raise
        except rx.ResponseError as exc:
            if not topology.demoted(exc):
                raise
            await self._demoted(call)
            raise rx.ConnectionError(
                f"{call.script}: the server answered READONLY: it is a replica now (a failover "
                "demoted it); nothing was written"
            ) from exc

    async def _demoted(self, call: Call) -> None:
        """``call`` found the server a read-only replica (a failover demoted the primary
        while settle kept connections to it): every check again before the next try, on
        connections made anew. The connections kept idle are closed, so a Sentinel-managed
        client asks the Sentinels for the primary again (redis-py drops a connection itself
        on a bare READONLY, not on Redis 6.2's script error that carries it); a client of a
        URL finds a replica there and is refused (:func:`health.check_primary`)."""
        logger.warning("settle.backend.primary_demoted", script=call.script)
        self.suspect()
        if self._lane is not None and not isinstance(self.client, RedisCluster):
            await self._lane.release_idle()
            await self.client.connection_pool.disconnect(inuse_connections=False)

    async def _evalsha(self, sha: str, call: Call) -> Any:
        if self._lane is None:
            return await self.client.evalsha(sha, len(call.keys), *call.keys, *call.args)
        return await self._lane.execute(
            "EVALSHA", sha, len(call.keys), *call.keys, *call.args, plain=call.plain
        )

    async def _fcall_once(self, call: Call) -> Any:
        function, n = self._set.function(call.script), len(call.keys)
        if self._lane is not None:
            return await self._lane.execute(
                "FCALL", function, n, *call.keys, *call.args, plain=call.plain
            )
        assert isinstance(self.client, RedisCluster)
        # redis-py finds an FCALL's slot by asking a node (COMMAND GETKEYS) on every call: a
        # second round trip, to a node that may be the dead one after a failover. The key is
        # known: send it to the node of its slot (redis-py still follows MOVED and ASK).
        if self._stale_topology:
            await self.client.nodes_manager.initialize()
            self._stale_topology = False
        node = self.client.get_node_from_key(call.keys[0])  # type: ignore[no-untyped-call,unused-ignore]
        try:
            return await self.client.execute_command(  # type: ignore[no-untyped-call,unused-ignore]
                "FCALL", function, n, *call.keys, *call.args, target_nodes=node
            )
        except (rx.ConnectionError, rx.TimeoutError):
            self._stale_topology = True  # the next try reads the topology again
            raise

    async def _run_durable(self, call: Call) -> Any:
        """One try of a writing ``call`` followed by the probe and ``WAIT min_replicas``
        (:meth:`_queue_durable`). The script, the probe and WAIT share one connection (WAIT
        counts that connection's writes): on a cluster, to the node that serves the call's
        slot, or to the node an ASK names. A probe refused after the script ran raises
        :class:`DurabilityError`: the replicas may lack what the script read.

        A cluster node that answers the script with a redirection ran nothing; the rules are
        those redis-py's cluster client follows on the other path (:meth:`_fcall_once`,
        :meth:`_evalsha`). MOVED (the slot moved): read the topology again, send to the
        slot's node. ASK (the slot is migrating and the keys are on the importing node): a
        topology read still names the migrating node, so ASKING and the script, ASKING and
        the probe, and WAIT go to the importing node, in one pipeline on one connection.
        TRYAGAIN (a migrating slot whose keys are split between the two nodes: a script's
        keys that do not exist yet count as elsewhere) is sent again as redis-py's cluster
        client does on the other path (``TRYAGAIN_SENDS``,
        :func:`~settle._runtime.transient.tryagain_pause`), then is transient: the call's own
        retries repeat it; a refused send whose WAIT came back short (it waited
        ``replica_timeout``) is not sent again within the try. An error reply to ASKING
        itself (an ACL user not allowed it: NOPERM) is raised as it is: the script after it
        ran nothing."""
        need = self._durability.min_replicas
        asked: Redis | None = None  # the importing node an ASK named, for the next try
        refused = 0  # sends of this try refused with TRYAGAIN
        redirected = 0
        while redirected < _DURABLE_TRIES:
            if self._stale_topology and isinstance(self.client, RedisCluster):
                await self.client.nodes_manager.initialize()
                self._stale_topology = False
            node = asked or self._node_for(call)
            mark = self._loads  # as the call is sent (:meth:`suspect`)
            replies = await self._send_durable(call, node, asking=asked is not None)
            asking, reply, probed, acks = _durable_replies(replies, asking=asked is not None)
            if isinstance(asking, Exception) and isinstance(reply, Exception):
                # ASKING refused (a NOPERM of an ACL without it): the script after it was
                # redirected unrun, and would be on every try; the refusal is the error. A
                # script that ran anyway (the slot became the importing node's own between
                # the topology read and the call) wrote: its reply is the answer.
                raise asking
            if isinstance(reply, rx.TryAgainError):  # nothing ran: the same node again
                refused += 1
                await _pause_after(reply, refused, acks, need)
                continue
            redirected += 1
            if await self._send_again(call, node, reply, mark):
                continue
            if isinstance(reply, rx.MovedError):  # the slot moved: its node is another
                assert isinstance(self.client, RedisCluster)
                await self.client.nodes_manager.initialize()
                asked = None
                continue
            if isinstance(reply, AskError):  # the slot is migrating, the keys have moved
                asked = await self._asked(node, reply)
                continue
            if isinstance(reply, Exception):
                raise reply
            if isinstance(probed, NoScriptError):
                # The script ran; the node's cache lacks the probe alone (emptied, then
                # filled by a client that loaded only its own scripts: an older settle).
                self.suspect()  # evidence of a lost cache: every check before the next call
                with contextlib.suppress(rx.ResponseError):  # SCRIPT LOAD refused: it stands
                    await node.script_load(self._scripts[WAIT_PROBE].script)
                    again = await self._send_durable(
                        call, node, asking=asked is not None, script=False
                    )
                    probed, acks = again[-2:]
            if isinstance(acks, Exception):
                raise acks
            if isinstance(probed, Exception):
                if self._function_missing(probed):
                    self.suspect()  # lost since the script ran: checked and loaded again
                error = self._not_durable(call, 0, probed)
            elif int(acks) < need:
                error = self._not_durable(call, int(acks))
            else:
                return reply
            if call.stops_caller(reply):  # a verdict that wrote nothing and stops the caller
                return Unacknowledged(reply)
            raise error
        raise BackendError(
            f"{call.script}: the server kept losing its scripts or moving the slot; "
            "the outcome is uncertain, read the record back",
            operation_id=call.operation_id,
        )

    def _queue_durable(self, pipe: Any, call: Call, *, asking: bool, script: bool = True) -> None:
        """Queue on ``pipe`` the durable path's commands for ``call``: the script (unless
        not ``script``: :meth:`_send_durable`), then the runtime's
        :data:`~settle._runtime.scripts.WAIT_PROBE` in the call's slot, then ``WAIT``. WAIT
        waits for its connection's last write; on Valkey and Redis 7.2+ a script that wrote
        nothing (a replay, an absorbed repeat) leaves that where it was, so WAIT could
        acknowledge the record the script read (another client's write) before any replica
        had it; the probe always writes. With ``asking``, an ``ASKING`` before each script
        (it lets one command in)."""
        probe = (wait_probe_key(call.keys[0]),)
        own = ((call.script, call.keys, call.args),) if script else ()
        # Behind ASKING the probe leaves no key the migrating node may hold (wait_probe.lua).
        for name, keys, args in (*own, (WAIT_PROBE, probe, ("1",) if asking else ())):
            if asking:
                pipe.execute_command("ASKING")
            if self._fcall:
                pipe.fcall(self._set.function(name), len(keys), *keys, *args)
            else:
                pipe.evalsha(self._scripts[name].sha, len(keys), *keys, *args)
        wait_ms = self._durability.wait_ms_for(call.wait_ms)
        pipe.execute_command("WAIT", self._durability.min_replicas, wait_ms)

    async def _send_durable(
        self, call: Call, node: Redis, *, asking: bool, script: bool = True
    ) -> list[Any]:
        """The replies of one send of :meth:`_queue_durable` on ``node`` (without the script
        when not ``script``: it ran, and the node had not loaded the probe). A failed
        connection forgets the node (:meth:`_forget_node`)."""
        try:
            async with node.pipeline(transaction=False) as pipe:
                self._queue_durable(pipe, call, asking=asking, script=script)
                return list(await pipe.execute(raise_on_error=False))
        except (rx.ConnectionError, rx.TimeoutError):
            await self._forget_node(node)
            raise

    def _not_durable(
        self, call: Call, acks: int, probe_refused: Exception | None = None
    ) -> DurabilityError:
        """The :class:`DurabilityError` of ``call``, whose script ran: ``acks`` replicas
        acknowledged, or the probe that makes WAIT cover the script's reads was refused
        (``probe_refused``: a slot that migrates under it, an ACL without its key, a server
        that lost the probe since the script ran): the replicas may lack what it read, and
        no replica is known to hold it (``acks`` 0: WAIT's count was of other writes)."""
        need = self._durability.min_replicas
        wait_ms = self._durability.wait_ms_for(call.wait_ms)
        logger.error(
            "settle.backend.durability_failed",
            script=call.script,
            operation_digest=operation_digest(call.operation_id),
            attempt_id=call.attempt_id,
            acknowledged=acks,
            required=need,
            probe_refused=None if probe_refused is None else type(probe_refused).__name__,
        )
        if probe_refused is not None:
            why = (
                f"the write that makes WAIT cover it was refused ({_probe_refusal(probe_refused)})"
            )
        else:
            why = f"{acks} of {need} replicas acknowledged within {wait_ms} ms"
        return DurabilityError(
            f"{call.script}: {why}; the outcome is uncertain, read the record back",
            operation_id=call.operation_id,
            acknowledged=acks,
            required=need,
        )

    async def _send_again(self, call: Call, node: Redis, reply: object, mark: int) -> bool:
        """Whether the durable path's script ``reply`` (it ran nothing) asks for its
        pipeline to be sent again, after what it says was done: the server lost the script
        (NOSCRIPT: loaded again on ``node``) or the library (the checks decide FCALL or
        EVALSHA again; loaded again on ``node``), or an EVALSHA refused where the library is
        listed now (:meth:`_listed_since`: FCALL). ``mark``: :meth:`check_mark` as the
        pipeline was sent."""
        if isinstance(reply, NoScriptError):
            await self._lost(call, mark)  # its checks load every script, the probe included
            await node.script_load(self._scripts[call.script].script)
            return True
        if self._function_missing(reply):
            logger.info("settle.backend.library_reloaded", library=self._set.library_name)
            await self._lost(call, mark)  # decides FCALL or EVALSHA again
            if self._fcall:
                await self._load_library(client=node)
            return True
        return not self._fcall and await self._listed_since(reply)

    async def _forget_node(self, node: Redis) -> None:
        """Drop a cluster node's client after its connection failed (the node may be dead
        and its slots served by a promoted replica): the next try reads the topology again."""
        if not isinstance(self.client, RedisCluster):
            return
        for name, known in list(self._nodes.items()):
            if known is node:
                del self._nodes[name]
                logger.warning("settle.backend.node_lost", node=name)
        self._stale_topology = True
        with contextlib.suppress(RedisError, OSError):  # a dead node's sockets
            await node.aclose()

    def _node_for(self, call: Call) -> Redis:
        """The client of the node that serves the call's slot (the client itself if standalone)."""
        if not isinstance(self.client, RedisCluster):
            return self.client
        node = self.client.get_node_from_key(call.keys[0])  # type: ignore[no-untyped-call,unused-ignore]
        if node is None:
            raise BackendError(
                f"{call.script}: no node serves the slot of {call.keys[0]!r}",
                operation_id=call.operation_id,
            )
        return self._client_of(node)

    async def _asked(self, node: Redis, error: AskError) -> Redis:
        """The client of the node an ASK from ``node`` names: the importing node of a
        migrating slot (redis-py's ``ASK <slot> :<port>`` without a host: ``node``'s host)."""
        assert isinstance(self.client, RedisCluster)
        host = error.host or node.connection_pool.connection_kwargs["host"]
        host, port = self.client.nodes_manager.remap_host_port(host, error.port)
        target = self.client.get_node(host=host, port=port)  # type: ignore[no-untyped-call,unused-ignore]
        if target is None:  # a node added since the topology was read
            await self.client.nodes_manager.initialize()
            target = self.client.get_node(host=host, port=port)  # type: ignore[no-untyped-call,unused-ignore]
        if target is None:
            raise BackendError(
                f"the cluster redirected to {host}:{port} (ASK), a node it does not list; "
                "nothing was written, the call is safe to repeat"
            )
        return self._client_of(target)

    def _client_of(self, node: Any) -> Redis:
        """The runner's own client of the cluster node ``node`` (made once per node)."""
        client = self._nodes.get(node.name)
        if client is None:
            # No retries of redis-py's own, as redis-py gives the cluster client's node
            # connections: a timeout or a dropped connection must reach the runner, which
            # forgets the node (:meth:`_forget_node`) and repeats only what may be repeated.
            # redis-py's default Retry (10 tries, on timeouts too) waited 11 socket timeouts
            # per try on a hung primary whose replica had taken over, and sent XREADGROUP
            # again after a lost reply.
            settings = {**_node_settings(node), "retry": Retry(NoBackoff(), 0)}
            client = self._nodes[node.name] = _cancellable(Redis(**settings))
        return client

    def _command(self) -> str:
        """The command the scripts are run with (their Redis spans' operation name)."""
        return "FCALL" if self._fcall else "EVALSHA"

    async def run_many(self, calls: list[Call]) -> list[Any]:
        """Run read calls together: one pipeline on a single server; on a cluster, one call
        at a time (each call's slot may live on another node, and EVALSHA is not pipelined
        across nodes)."""
        if self.is_cluster:
            return [await self._call(call) for call in calls]
        first = calls[0] if calls else None
        with telemetry().pipeline(self.client, self._command(), calls):
            try:
                replies: list[Any] = await AsyncRetrying(**retry_options(first))(
                    self._pipeline, calls
                )
            except (RedisError, RedisClusterException) as exc:
                raise backend_error(exc, first) from exc
        # Not checked for lost data: the namespace's claim planning expects 'unclaimed'
        # (a shard never used), right after its own check of the server.
        return replies

    async def _pipeline(self, calls: list[Call]) -> list[Any]:
        """One try of :meth:`run_many` on a single server (read calls: safe to repeat)."""
        try:
            if self._needs_check(calls[0] if calls else None):  # as :meth:`_run_once`
                await self._check(calls[0] if calls else None)
            mark = self._loads  # as the calls are sent (:meth:`suspect`)
            replies = await self._send_pipeline(calls)
            if any(self._function_missing(r) or isinstance(r, NoScriptError) for r in replies):
                logger.info("settle.backend.library_reloaded", library=self._set.library_name)
                # decides FCALL or EVALSHA again, loads the scripts
                await self._lost(calls[0], mark)
                replies = await self._send_pipeline(calls)
            elif not self._fcall:
                refused = next((r for r in replies if isinstance(r, rx.NoPermissionError)), None)
                if await self._listed_since(refused):  # FCALL of the library listed now
                    replies = await self._send_pipeline(calls)
        except rx.ConnectionError as exc:
            _drop_evidence(self, exc)
            raise
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    async def _send_pipeline(self, calls: list[Call]) -> list[Any]:
        async with self.client.pipeline(transaction=False) as pipe:
            for call in calls:
                keys, n = call.keys, len(call.keys)
                if self._fcall:
                    pipe.fcall(self._set.function(call.script), n, *keys, *call.args)
                else:
                    pipe.evalsha(self._scripts[call.script].sha, n, *keys, *call.args)
            return list(await pipe.execute(raise_on_error=False))

    # -- plain commands --------------------------------------------------------------------

    async def exists(self, keys: tuple[str, ...]) -> int | None:
        """How many of ``keys`` exist: one EXISTS on a single server, one per key (pipelined
        per node by redis-py) on a cluster. A read, repeated on transient failures. None when
        the user's ACL refuses EXISTS (the caller decides what an unknown count means).

        Not one EXISTS per slot, as redis-py's cluster ``exists`` sends: while a slot
        migrates, its importing node serves a command of one key after ASK, but refuses one
        of several keys it does not all hold with TRYAGAIN until the slot has moved, and
        redis-py gives up after 16 tries (ClusterError, "TTL exhausted")."""

        async def send(client: Any) -> int | None:
            try:
                if not isinstance(client, RedisCluster):
                    found: int = await client.exists(*keys)
                    return found
                async with client.pipeline() as pipe:  # type: ignore[no-untyped-call,unused-ignore]
                    for key in keys:
                        pipe.exists(key)
                    counts: list[int] = await pipe.execute()
                return sum(counts)
            except rx.NoPermissionError:
                return None

        return await self.command("EXISTS", send)  # type: ignore[no-any-return]

    async def command(
        self,
        what: str,
        send: Callable[[Any], Awaitable[Any]],
        *,
        key: str | None = None,
        repeatable: bool = True,
    ) -> Any:
        """Run one plain command (``send(client)`` issues it, or a pipeline of commands on
        ``key`` alone, on the client it is given) with the same error mapping as scripts:
        transient failures repeated when ``repeatable``, then a typed
        :class:`~settle.errors.SettleError`. A Redis error reply reaches the caller as
        :class:`~settle.errors.BackendError` whose ``code`` is the reply's error code.

        With ``key`` on a cluster, ``send`` gets the client of the node that serves the
        key's slot (:meth:`_routed`) and the periodic recheck reads that primary alone: a
        hung primary holds up only the commands on its own slots."""
        call = Call(what, (key,) if key is not None else (), ())

        async def once() -> Any:
            try:
                if self._needs_check(call):  # before each try, as :meth:`_run_once`
                    await self._check(call)
                return await self._routed(call, send)
            except rx.ConnectionError as exc:
                _drop_evidence(self, exc)
                raise

        with telemetry().redis(self.client, what, key=key):
            tries = ATTEMPTS
            try:
                if repeatable:
                    return await AsyncRetrying(**retry_options(call))(once)
                if self._needs_check(call):  # repeatable even where the command is not
                    check = Call(f"the server check before {what}", call.keys, ())
                    try:
                        await AsyncRetrying(**retry_options(check))(self._check, check)
                    except (RedisError, RedisClusterException) as exc:
                        raise backend_error(exc, check) from exc
                tries = 1
                try:
                    return await self._routed(call, send)
                except rx.ConnectionError as exc:
                    _drop_evidence(self, exc)
                    raise
            except (RedisError, RedisClusterException) as exc:
                if error_code(exc) == "NOGROUP":
                    # A consumer group a part made (before any command on it) is gone: the
                    # server lost its data (a FLUSHALL, a restart without persistence) or
                    # the stream was deleted. Checked again before the group is made anew.
                    self.suspect()
                raise backend_error(exc, call, tries=tries) from exc

    async def _routed(self, call: Call, send: Callable[[Any], Awaitable[Any]]) -> Any:
        """``send`` on the client of the cluster node that serves ``call``'s key; on a
        single server, or for a call without keys, on :attr:`client`.

        redis-py's cluster client finds the key of a command it cannot parse on its own
        (XREADGROUP's, after STREAMS; FCALL's) by asking a node (COMMAND GETKEYS), the same
        node whichever slot the key is in: when that node hangs, every such command waits
        its socket timeout, on each try, whichever primary serves it. The key is known:
        the command goes to its node's own client, as the durable path's script calls do
        (:meth:`_node_for`), and a failed connection makes the next try read the topology
        again (:meth:`_forget_node`). A node that redirects (MOVED, ASK: the slot moved or
        is moving) ran nothing: the command goes once more through the cluster client,
        which follows the redirection, and the next try reads the topology again."""
        if not call.keys or not isinstance(self.client, RedisCluster):
            return await send(self.client)
        if self._stale_topology:
            await self.client.nodes_manager.initialize()
            self._stale_topology = False
        node = self._node_for(call)
        try:
            return await send(node)
        except (rx.ConnectionError, rx.TimeoutError):
            await self._forget_node(node)
            raise
        except AskError:  # MovedError is one
            self._stale_topology = True
        return await send(self.client)

    async def aclose(self) -> None:
        for companion in self._companions.values():
            await companion.aclose()
        if self._lane is not None:
            await self._lane.aclose()
        if self._owner is not None:
            return  # the client and the nodes' clients are the owner's to close
        for node in [*self._nodes.values(), *self._retired]:
            await node.aclose()
        await self.client.aclose()
        # A Sentinel-managed client (from_sentinel) also holds clients of the Sentinels.
        manager = getattr(getattr(self.client, "connection_pool", None), "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            await sentinel.aclose()


class _Lane:
    """The script calls' own way to a standalone (or Sentinel-managed) server: a command
    sent on a connection of the client's pool and its reply read, without redis-py's
    per-command machinery (its retries, which the runner makes itself; its event dispatch;
    hooks that APM agents patch into ``execute_command``), which costs more client CPU than
    the round trip. A connection whose reply was not read whole (an error, a cancelled task)
    is closed, never reused.

    With ``keep`` (a client settle made, whose pool serves this runner alone) the
    connections it used are kept for the next call rather than handed back each time (the
    pool's lock and bookkeeping cost as much again), up to half the pool's size, so the
    rest of the pool always serves everything else. A client the application passed in may
    be shared by many facades, some never closed (and may have a blocking pool, whose size
    is the application's bound): its connections go back after every call. A kept
    connection is checked before each use as the pool checks one before handing it out
    (closed by the server, flagged by a maintenance notification). A process forked with
    kept connections leaves them to its parent."""

    def __init__(
        self,
        pool: Any,
        *,
        keep: bool,
        dropped: Callable[[], None],
        due: Callable[[], bool],
        check: Callable[[None], Awaitable[None]],
    ) -> None:
        self._pool = pool
        #: Told when a kept connection was found closed by the server (a restart drops it):
        #: the runner's checks are then due. Before anything is sent on any connection,
        #: a due check runs (``check``): also a call that passed the runner's own look at
        #: ``due`` before another call found the drop waits for it.
        self._dropped = dropped
        self._due = due
        self._check_server = check
        self._keep = int(getattr(pool, "max_connections", 0) or 0) // 2 if keep else 0
        self._idle: list[Any] = []
        self._pid = os.getpid()
        #: A Sentinel-managed pool of the primary: its kept connections follow its failovers.
        self._sentinel = getattr(pool, "is_master", None) is True

    async def execute(self, *command: Any, plain: bool = False) -> Any:
        """Send ``command`` and read its reply; ``plain``: its arguments need no look
        (:attr:`Call.plain`)."""
        return await self._exchange(await self._take(), command, plain)

    async def _take(self) -> Any:
        """A connection ready to send on: a kept one, else one of the pool; the server
        checked first if a check is due (before a connection is held: the check takes one
        of the pool's, which an application's bounded pool may not have to spare)."""
        if self._pid != os.getpid():  # forked: these sockets are the parent's
            self._idle, self._pid = [], os.getpid()
        if self._due():
            await self._check_server(None)
        try:
            conn = self._idle.pop()
        except IndexError:  # none kept (or another thread took the last one)
            return await self._pool.get_connection()
        if self._sentinel and _left_primary(self._pool, conn):
            # Closed, and one of the pool's in its place: the pool's connections ask the
            # Sentinels when they connect, where a kept one would reconnect to its old host.
            await self._drop(conn)
            return await self._pool.get_connection()
        try:
            stale = await self._check(conn)
        except BaseException:  # cancelled while checking it: kept again, not lost
            self._idle.append(conn)
            raise
        if stale and self._due():  # found closed by the server: checked before it is used
            try:
                await self._check_server(None)  # (kept: the pool is settle's own, unbounded)
            except BaseException:
                await self._pool.release(conn)  # closed: the pool connects it again
                raise
        return conn

    async def _check(self, conn: Any) -> bool:
        """Make a kept connection ready to send on (it connects again before sending);
        True when the server had closed it (the runner was told)."""
        if _should_reconnect(conn):  # a maintenance notification moved its endpoint
            await conn.disconnect()
            return False
        try:
            # Data nobody asked for: a new socket, as the pool does, unless maintenance
            # notifications are on (the data is one, read with the next reply).
            stale = await conn.can_read() and not _notifications(self._pool)
        except (rx.ConnectionError, OSError, AttributeError):
            stale = True  # the server closed it while it was idle (a timeout, a restart)
        if stale:
            self._dropped()  # before the first await: every call from now on checks first
            await conn.disconnect()
        return bool(stale)

    async def _exchange(self, conn: Any, command: tuple[Any, ...], plain: bool = False) -> Any:
        try:
            packed = pack_command(conn, command, plain)
        except BaseException:  # an argument that does not encode: nothing was sent
            await self._give_back(conn)
            raise

        lost: list[Exception] = []  # sends whose reply was lost: they may have run
        first: Exception | None = None
        done = False
        try:
            if retries_as_redis_py(conn.retry):  # else an application's policy: every try
                try:  # the first try straight away (every call makes it; few repeat)
                    reply = await self._round_trip(conn, packed)
                    done = True
                except Exception as exc:  # noqa: BLE001  # the retry policy judges it, below
                    first = exc
            if not done:
                # The connection's own retry policy, as redis-py's execute_command applies
                # it (a new socket after a dropped one; none on the clients settle makes),
                # handed the first try's error, if any, as its own first try's (outside the
                # except block: a repeat's error is not chained to it).
                async def failed(error: Exception) -> None:
                    lost.append(error)
                    await conn.disconnect()

                once = functools.partial(self._round_trip, conn, packed)
                reply = await conn.retry.call_with_retry(tried(first, once), failed)
        except rx.ResponseError as exc:  # the whole reply was read: the connection is sound
            await self._give_back(conn)
            if lost:  # a refusal of the repeat says nothing of the send before it
                raise exc from lost[-1]
            raise
        except BaseException:
            await self._drop(conn)
            raise
        await self._give_back(conn)
        return reply

    async def _round_trip(self, conn: Any, packed: Any) -> Any:
        """One send and its reply: on the sync lane without redis-py's frames around them
        where they are its own (``packing.exchange``); the asyncio lane bounds both itself
        (``_Pipelined``)."""
        return await exchange(conn, packed)

    async def _drop(self, conn: Any) -> None:
        """A connection whose replies were not all read: closed, never used again."""
        await conn.disconnect()
        await self._pool.release(conn)

    async def _give_back(self, conn: Any) -> None:
        if len(self._idle) < self._keep and not _should_reconnect(conn):
            self._idle.append(conn)
        else:
            await self._pool.release(conn)  # which reconnects one a notification flagged

    async def release_idle(self) -> None:
        """Hand the kept connections back to the pool (whose idle ones the caller closes).
        A connection handed back to the lane meanwhile (another thread or task ending its
        call while this one releases, as a demotion does mid-life) stays kept, never dropped
        unreleased; a forked child's inherited ones are the parent's: only forgotten."""
        if self._pid == os.getpid():
            await self._give_all_back()
        else:
            self._idle = []

    async def aclose(self) -> None:
        await self.release_idle()

    async def _give_all_back(self) -> None:
        """Hand every kept connection back to the pool (closing, or a new event loop)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            try:
                await self._pool.release(conn)
            except (KeyError, ValueError):  # the pool was reset meanwhile: not its own now
                with contextlib.suppress(Exception):
                    await conn.disconnect()


def _should_reconnect(conn: Any) -> bool:
    """redis-py flags a connection to reconnect on a maintenance notification (MOVING)."""
    check = getattr(conn, "should_reconnect", None)
    return bool(check()) if check is not None else False


def _left_primary(pool: Any, conn: Any) -> bool:
    """Whether ``conn`` reaches a primary that a Sentinel-managed pool no longer names: the
    pool learned of a failover when one of its connections asked the Sentinels (a new
    connection, or ``pool.get_master_address()``), and redis-py then closes the pool's idle
    connections; the lane's kept ones are outside the pool, and are replaced before use.
    Until then the old primary may still take writes, lost when it is demoted
    (docs/operations.md, "Redis Sentinel"). Judged by the connection that reaches it: the
    proxy of redis-py's client-side caching (``cache_config``) keeps the host and port it
    was made with, before its connection asked the Sentinels."""
    address = pool.master_address
    reaches = getattr(conn, "_conn", conn)  # redis-py's CacheProxyConnection: its own
    return address is not None and (reaches.host, reaches.port) != tuple(address)


def _notifications(pool: Any) -> bool:
    """Whether the pool has redis-py's maintenance notifications on."""
    check = getattr(pool, "maint_notifications_enabled", None)
    return bool(check()) if check is not None else False


# unasync: async-only
from settle._runtime import cancel_safe  # noqa: E402
from settle._runtime.deadlines import Deadlines, Watch  # noqa: E402


async def exchange(conn: Any, packed: Any) -> Any:
    """The asyncio counterpart of ``packing.exchange``: the connection's own send and read
    (``_Lane._round_trip``, which ``_Pipelined`` replaces)."""
    await conn.send_packed_command(packed)
    return await conn.read_response()


#: A call queued on the asyncio lane: its command, its caller's future, whether it is plain.
_Queued = tuple[tuple[Any, ...], "asyncio.Future[Any]", bool]


class _Pipelined(_Lane):
    """The asyncio lane, which also pipelines: script calls that tasks issue while another
    call of this runner is on the wire are queued, and sent together in one write on one
    connection on the event loop's next turn, their replies read in order (as ioredis'
    auto-pipelining does). A call made while nothing else is in flight goes alone at once,
    so a caller that awaits each call pays nothing for it. Each call still gets its own
    reply, its own error reply, its own encoding error; a call cancelled while queued or in
    flight leaves the others alone: the batch is sent and read by a task of its own, and the
    reply of a cancelled call is read and dropped. Every settle script is safe to send
    without a reply having been read for it: that is what a cancelled call is already. A
    batch that fails on the connection is sent again as the connection's retry policy says
    (its calls that have no reply yet), as a call alone is; a batch that could not run at
    all (its task cancelled, its loop closed) fails its calls with a ConnectionError, which
    the runner repeats. The queue belongs to one event loop: a runner used from another
    loop later (``asyncio.run`` twice) starts afresh."""

    def __init__(self, pool: Any, **options: Any) -> None:  # _Lane's
        super().__init__(pool, **options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: list[_Queued] = []
        self._in_flight = 0
        self._batches: set[asyncio.Task[None]] = set()
        self._deadlines: Deadlines

    async def execute(self, *command: Any, plain: bool = False) -> Any:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new loop: what was queued or on the wire is gone
            self._loop, self._queue, self._in_flight, self._batches = loop, [], 0, set()
            self._deadlines = Deadlines(loop)
            await self._give_all_back()  # the kept ones too: their streams were the old loop's
        if not self._in_flight and not self._queue:
            self._in_flight += 1
            try:
                return await super().execute(*command, plain=plain)
            finally:
                self._in_flight -= 1
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append((command, future, plain))
        if len(self._queue) == 1:
            loop.call_soon(self._flush, loop)
        return await future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self._loop:
            return
        batch, self._queue = self._queue, []
        self._in_flight += 1
        task = loop.create_task(self._send(batch))
        self._batches.add(task)
        task.add_done_callback(lambda done: self._sent(batch, done))

    def _sent(self, batch: list[_Queued], task: Any) -> None:
        """The batch's task ended (also when it was cancelled before it ran): no call of it
        may wait forever."""
        if task.get_loop() is self._loop:
            self._batches.discard(task)
            self._in_flight -= 1
        for _, future, _ in batch:
            if not future.done():
                future.set_exception(rx.ConnectionError("the pipelined batch was not sent"))

    async def _send(self, batch: list[_Queued]) -> None:
        try:
            conn = await self._take()
        except Exception as exc:  # noqa: BLE001 - whatever it is, it is each caller's error
            for _, future, _ in batch:  # no connection (server down, credentials refused)
                if not future.done():
                    future.set_exception(_own(exc))
            return
        calls = []
        for command, future, plain in batch:
            try:
                calls.append((future, pack_command(conn, command, plain)))
            except (rx.DataError, ValueError, TypeError) as exc:  # it does not encode: alone
                if not future.done():
                    future.set_exception(exc)

        async def once() -> None:
            waiting = [(future, packed) for future, packed in calls if not future.done()]
            if not waiting:
                return
            watch = await self._write(conn, [part for _, packed in waiting for part in packed])
            try:
                for future, _ in waiting:
                    try:
                        reply = await self._read(conn, watch)
                    except rx.ResponseError as exc:  # this call's error reply, read whole
                        if lost:  # a refusal of the repeat says nothing of the send before it
                            exc.__cause__ = lost[-1]
                        if not future.done():
                            future.set_exception(exc)
                        continue
                    if not future.done():
                        future.set_result(reply)
            finally:
                self._deadlines.finish(watch)

        lost: list[Exception] = []  # sends of the batch whose replies were lost

        async def failed(error: Exception) -> None:
            lost.append(error)
            await conn.disconnect()

        try:
            await conn.retry.call_with_retry(once, failed)
        except BaseException as exc:
            await self._drop(conn)
            for future, _ in calls:
                if not future.done():
                    future.set_exception(
                        _own(exc)
                        if isinstance(exc, Exception)
                        else rx.ConnectionError("the pipelined batch was cancelled")
                    )
            if not isinstance(exc, Exception):
                raise
            return
        await self._give_back(conn)

    # -- deadlines: one timer per lane (settle/_runtime/deadlines.py) ------------------

    async def _round_trip(self, conn: Any, packed: Any) -> Any:
        watch = await self._write(conn, packed)
        try:
            return await self._read(conn, watch)
        finally:
            self._deadlines.finish(watch)

    async def _write(self, conn: Any, packed: Any) -> Watch | None:
        """Send ``packed`` as ``conn.send_packed_command`` does, within the connection's
        ``socket_timeout``; the watch that bounds the reads of its replies next (None: none,
        or the connection bounds its own)."""
        if not cancel_safe.watchable(conn):  # a connection class of the application's
            await conn.send_packed_command(packed)
            return None
        await cancel_safe.ready(conn)
        watch = self._deadlines.start(conn.socket_timeout)
        try:
            await cancel_safe.write(conn, packed, bounded=watch is None)
        except BaseException as exc:
            if self._deadlines.finish(watch, exc):
                raise rx.TimeoutError("Timeout writing to socket") from None
            raise
        return watch

    async def _read(self, conn: Any, watch: Watch | None) -> Any:
        """One reply, read as ``conn.read_response()`` reads it, within the connection's
        ``socket_timeout`` from now (redis-py's own when ``watch`` is None)."""
        if watch is None:
            return await conn.read_response()
        self._deadlines.again(watch, conn.socket_timeout)
        # Its own read, without a timeout of its own: the watch bounds it, and stands for
        # that timeout where a maintenance notification relaxes it (as redis-py's read sets).
        conn._active_read_timeout = watch
        try:
            return await cancel_safe.read(conn)  # its read_response(timeout=math.inf)
        except BaseException as exc:
            # A reply read whole (an error reply) leaves the watch on for the next read.
            if watch.expired and self._deadlines.finish(watch, exc):
                # read_response closed the connection, as on its own timeout
                raise rx.TimeoutError(f"Timeout reading from {conn._host_error()}") from None
            raise
        finally:
            conn._active_read_timeout = None

    async def aclose(self) -> None:
        mine = [t for t in self._batches if t.get_loop() is asyncio.get_running_loop()]
        if mine:  # let the batches on the wire end (wait: a cancelled close cancels none)
            await asyncio.wait(mine)
        await super().aclose()


def _own(exc: Exception) -> Exception:
    """A copy of a batch's failure for each of its calls (one exception object raised in
    many tasks would carry each one's traceback into the next)."""
    try:
        copy = type(exc)(*exc.args)
    except Exception:  # noqa: BLE001 - an exception class with another signature
        return exc
    copy.__cause__ = exc
    return copy


# unasync: end


def _note_lost(lost: list[BaseException], exc: RedisError) -> None:
    """Add to ``lost`` the failure of a try whose reply was lost (it may have run): a
    dropped connection or a timeout, or the error of the lane's repeat after one."""
    if isinstance(exc, (rx.ConnectionError, rx.TimeoutError)):
        lost.append(exc)
    elif isinstance(exc, rx.ResponseError) and isinstance(
        exc.__cause__, (rx.ConnectionError, rx.TimeoutError)
    ):
        lost.append(exc.__cause__)  # the lane sent it again after a lost reply


def _drop_evidence(runner: AsyncRunner, exc: rx.ConnectionError) -> None:
    """A call's ConnectionError: the server may have restarted, unless it is one that is no
    sign of that (credentials refused, the pool exhausted)."""
    if is_transient(exc):
        runner.dropped()


def _sentinel_managed(client: Redis) -> bool:
    """Whether ``client`` reaches the primary the Sentinels name (``from_sentinel``, or a
    client of redis-py's ``Sentinel.master_for``)."""
    return isinstance(client.connection_pool, SentinelConnectionPool)


def _socket_timeout(client: Any) -> float | None:
    """The socket timeout ``client``'s connections are made with (seconds), or None."""
    if isinstance(client, RedisCluster):
        given = client.nodes_manager.connection_kwargs
    else:
        pool = getattr(client, "connection_pool", None)
        given = getattr(pool, "connection_kwargs", {})
    timeout = given.get("socket_timeout")
    return None if timeout is None else float(timeout)


def _durable_replies(replies: Sequence[Any], *, asking: bool) -> tuple[Any, Any, Any, Any]:
    """The durable pipeline's replies (:meth:`AsyncRunner._queue_durable`): the first
    ASKING's (None without), the script's, the probe's, WAIT's."""
    if asking:
        first, reply, _, probed, acks = replies
        return first, reply, probed, acks
    reply, probed, acks = replies
    return None, reply, probed, acks


def _probe_refusal(refusal: Exception) -> str:
    """What refused the probe, in words for a :class:`DurabilityError`."""
    if isinstance(refusal, rx.AskError | rx.MovedError | rx.TryAgainError):
        return f"its slot is moving to another node: {type(refusal).__name__}"
    return f"{type(refusal).__name__}: {refusal}"


async def _pause_after(refusal: rx.TryAgainError, refused: int, acks: Any, need: int) -> None:
    """Wait before a call's next send after its ``refused``-th TRYAGAIN of this try, as
    TRYAGAIN's budget says; raise ``refusal`` (transient) when the try has spent it, or
    when the refused send's WAIT, which runs all the same, acknowledged fewer than
    ``need`` (too few replicas connected): it waited ``replica_timeout`` (or the call's
    ``wait_ms``), as each send
    again would (16 sends a try made a call wait 64 of them, where one a try waited 4)."""
    short = not isinstance(acks, Exception) and int(acks) < need
    pause = None if short else tryagain_pause(refused)
    if pause is None:
        raise refusal
    await asyncio.sleep(pause)


def _check_wait_fits(client: Any, durability: Durability) -> None:
    """``WAIT`` blocks the connection for up to ``replica_timeout``: a socket timeout that
    ends sooner turns every durable write into a timeout, repeated, then a BackendError
    instead of the DurabilityError it is. Refuse the combination up front."""
    if not durability.min_replicas:
        return
    timeout = _socket_timeout(client)
    if timeout is not None and durability.replica_timeout >= timeout:
        raise ConfigurationError(
            f"replica_timeout ({durability.replica_timeout} s) must be shorter than the "
            f"client's socket timeout ({timeout} s): WAIT holds the connection that long. "
            "Lower replica_timeout or raise socket_timeout."
        )


def check_block_fits(client: Any, block: float) -> None:
    """``XREADGROUP ... BLOCK`` holds the connection for up to ``block`` seconds when the
    stream has nothing new: a socket timeout that ends sooner turns every idle poll into a
    timeout (then a BackendError). Refuse the combination up front."""
    timeout = _socket_timeout(client)
    if timeout is not None and block >= timeout:
        raise ConfigurationError(
            f"block ({block} s) must be shorter than the stream client's socket timeout "
            f"({timeout} s): an idle poll holds the connection that long. Lower block or "
            "raise socket_timeout."
        )


def _per_node(result: Any) -> dict[str, Mapping[str, Any]]:
    """redis-py answers ``{node: reply}`` for several nodes and the bare reply for one."""
    if (
        isinstance(result, Mapping)
        and result
        and all(isinstance(v, Mapping) for v in result.values())
    ):
        return {str(k): v for k, v in result.items()}
    return {"node": result}


def _probe_options() -> dict[str, Any]:
    """A replica is asked for its policy once, at start-up, in one try of at most 2 s (no
    retries: redis-py's default would make one out of reach cost ~25 s); one that does not
    answer, or refuses the credentials, is warned about."""
    return {"socket_timeout": 2.0, "socket_connect_timeout": 2.0, "retry": Retry(NoBackoff(), 0)}


#: :func:`_role_of` of a node that refuses ``INFO replication`` (NOPERM, renamed away).
_REFUSED = "refused"


async def _role_of(node: Any) -> str | None:
    """The role of the cluster node ``node`` (``master``, ``slave``) through a probe of its
    own (:func:`_probe_options`), closed after; :data:`_REFUSED` when it refuses INFO, None
    when it cannot be reached."""
    probe = _cancellable(Redis(**{**_node_settings(node), **_probe_options()}))
    try:
        return str((await probe.info("replication")).get("role"))
    except rx.ResponseError:
        return _REFUSED
    except (RedisError, OSError):
        return None
    finally:
        await probe.aclose()


async def _policy_of(probe: Redis, *, replicating: Any = None) -> str | None:
    """One node's policy through a client of its own, closed after; None when the node
    cannot be reached or refuses INFO, or (``replicating``: the primary's replication id)
    is not a replica of that primary: the address a primary lists is the one its replica
    announces or the one it sees, and from here it may reach another server."""
    try:
        if replicating is not None:
            replication = await probe.info("replication")
            if not health.replicates(replication, replicating):
                return None
        return health.eviction_policy(await probe.info("memory"))
    except (RedisError, OSError):
        return None
    finally:
        await probe.aclose()


def _node_settings(node: Any) -> dict[str, Any]:
    """Connection settings for a plain client of one cluster node, taken from the cluster
    client (redis-py's asyncio node keeps them; its sync node keeps a client that has them)."""
    given = getattr(node, "connection_kwargs", None)
    kind = getattr(node, "connection_class", None)
    if given is None:
        pool = node.redis_connection.connection_pool
        given, kind = pool.connection_kwargs, pool.connection_class
    node_address = {"host": node.host, "port": node.port, "decode_responses": False}
    return {**topology.passed_on(given, kind), **node_address}
