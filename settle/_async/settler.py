"""``AsyncSettler``: the asyncio facade. Each method plans a call in the core, runs it on the
backend and lets the core decode the reply; no rule lives here."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import datetime
from typing import Any, Literal, Protocol, Self, TypeVar

from redis.asyncio import Redis, RedisCluster

from settle._core.codec import UndecodableEntry
from settle._core.engine import Core, QuarantineFollower, QuarantineQuery, QuarantineScan
from settle._core.layout import LOG_MAX
from settle._core.scripts import SCRIPTS
from settle._runtime import Call, Durability, naming
from settle._runtime._async import AsyncConnectable, AsyncRunner, SingleFlight
from settle._runtime.options import check_client
from settle._runtime.transient import SlotSplit
from settle._telemetry import CallSpan, telemetry
from settle.config import SettleConfig
from settle.decorator._async import (
    AsyncOperation,
    KeySpec,
    PrincipalSpec,
    ReplayHook,
    RequestSpec,
    RetrySpec,
    TerminalSpec,
)
from settle.decorator._options import Options
from settle.errors import ConfigurationError, InvalidInput
from settle.models import (
    AttemptObservation,
    InProgress,
    OperationRecord,
    QuarantineEntry,
    QuarantineHeader,
    QuarantineKind,
    Renewal,
    Replay,
    Reservation,
    Reserved,
    Resolution,
    Settlement,
    StoredFailure,
    TrimResult,
)

__all__ = ["AsyncBackend", "AsyncQuarantine", "AsyncSettler"]

#: What a quarantine listing lists.
#: What a listing yields: entries, headers, or (the console's) entries and the marks of
#: those this version cannot decode.
E = TypeVar(
    "E",
    QuarantineEntry,
    QuarantineHeader,
    QuarantineEntry | UndecodableEntry,
    QuarantineHeader | UndecodableEntry,
)


class AsyncBackend(Protocol):
    """What a settler runs its calls on: the runtime's runner, or the reference model."""

    async def run(self, call: Call) -> Any: ...
    async def run_many(self, calls: list[Call]) -> list[Any]: ...
    async def prepare(self) -> dict[str, Any]: ...
    async def exists(self, keys: tuple[str, ...]) -> int | None: ...
    def check_mark(self) -> int: ...
    def suspect(self, mark: int | None = None) -> None: ...
    async def aclose(self) -> None: ...


class AsyncSettler(AsyncConnectable):
    """Fenced, idempotent operation records in one namespace of a Redis server or cluster."""

    _runner: AsyncBackend

    def __init__(
        self, client: Redis | RedisCluster, config: SettleConfig | None = None, **options: Any
    ) -> None:
        check_client(client, (Redis, RedisCluster), type(self).__name__)
        resolved = _config(config, options)
        durability = Durability(
            resolved.min_replicas, resolved.replica_timeout, resolved.allow_eviction
        )
        self._init(AsyncRunner(client, SCRIPTS, durability), resolved)

    def _init(self, backend: AsyncBackend, config: SettleConfig) -> None:
        self.config = config
        #: Named by every call's span: read once (a pydantic field is read through its
        #: model's ``__getattr__`` hook, ~500 instructions).
        self._namespace = config.namespace
        self._core = Core(config)
        self._runner = backend
        self._checked = False
        #: What the start-up checks of the namespace do (:meth:`_reading`): claim every
        #: shard ("claim"), only check the counts ("count"), or nothing ("none").
        self._namespace_check: Literal["claim", "count", "none"] = "claim"
        #: The start-up checks and the namespace re-checks after a loss, one run for every
        #: concurrent call that needs them.
        self._flight = SingleFlight()
        #: The losses said (``Core.losses_said``) whose namespace re-check passed.
        self._rechecked = 0
        self.quarantine = AsyncQuarantine(self)

    @classmethod
    def _from_backend(cls, backend: AsyncBackend, config: SettleConfig) -> Self:
        settler = cls.__new__(cls)
        settler._init(backend, config)
        return settler

    async def __aenter__(self) -> Self:
        try:
            await self.check()
        except BaseException:
            await self.aclose()  # a refused start-up keeps no connection open
            raise
        return self

    async def check(self) -> None:
        """Verify the server and the namespace's shard count (done once, lazily). Called
        before any call (entering the settler's ``with`` block calls it), the set-up is
        reported in a span of its own, ``settle.check``: its Redis calls in one trace,
        under the caller's span."""
        if self._checked:
            return
        with telemetry().check(self.config.namespace):
            await self._check()

    async def _check(self) -> None:
        """:meth:`check`, inside the call that needs it (its span holds the set-up): one
        run for every concurrent call (:class:`SingleFlight`); a failure reaches each, and
        the next call checks again."""
        if not self._checked:
            await self._flight.run("start", self._start)

    async def _start(self) -> None:
        if self._checked:  # a run that ended just before this one began
            return
        await self._runner.prepare()
        if self._namespace_check == "claim":
            await self._check_namespace(starting=True)
        elif self._namespace_check == "count":
            await self._check_counts()
        self._checked = True

    def _reading(self, *, namespace: bool = True) -> Self:
        """This settler, made one that only reads (settle's tools: the CLI's read
        commands, ``settle doctor``'s quarantine rows, the console without a token): its
        check (:meth:`check`, or the first call's) writes nothing. The server is checked
        as for any settler; the namespace's metadata and every shard state's count are
        checked without claiming a shard (:meth:`_check_counts`). A claim makes a state the
        server lost again, which hides the loss from the application's next write on that
        shard: that write says it (``settle.namespace.state_lost``) only when it finds the
        state gone. ``namespace=False``: the server alone (a probe that reads the stored
        shard count before the settler that uses it is made). Before the check, never
        after; returns the settler."""
        self._namespace_check = "count" if namespace else "none"
        return self

    async def _check_counts(self) -> None:
        """The namespace's check of a settler that only reads (:meth:`_reading`): its
        metadata must name this settler's shard count, and each surviving shard state too;
        a missing state is left missing, and nothing is written."""
        if not self._core.decode_namespace(await self._runner.run(self._core.plan_namespace())):
            raise ConfigurationError(
                f"namespace {self.config.namespace!r} does not exist in this Redis (its "
                "metadata is missing): nothing was ever written to it, or Redis lost its data; "
                "this settler only reads, and wrote nothing. settle doctor shows the namespace"
            )
        checks = self._core.plan_claims(claim=False)  # a missing state is left missing
        self._core.decode_claims(checks, await self._runner.run_many(checks))

    async def _check_namespace(self, *, starting: bool = False) -> None:
        # Missing metadata is created only once every surviving shard state agreed with
        # this client's shard count and no state beyond it survives (SPEC 4; the rules are
        # the core's).
        if not self._core.decode_namespace(await self._runner.run(self._core.plan_namespace())):
            checks = self._core.plan_claims(claim=False)
            self._core.decode_claims(checks, await self._runner.run_many(checks))
            if beyond := self._core.states_beyond():
                self._core.decode_beyond(await self._runner.exists(beyond))
            create = self._core.plan_namespace(create=True)
            self._core.decode_namespace(await self._runner.run(create))
        claims = self._core.plan_claims()
        self._core.decode_claims(claims, await self._runner.run_many(claims), starting=starting)

    def _span(self, name: str, reservation: Reservation | None = None) -> CallSpan:
        """The span (and duration) of one settle call; ``span.done(result)`` records what
        the result says. A shared no-op without OpenTelemetry."""
        return telemetry().call(name, self._namespace, reservation)

    async def _run(self, call: Call) -> Any:
        if not self._checked:
            with naming(call):
                await self._check()
        mark, checked = self._core.loss_mark(), self._runner.check_mark()
        raw = await self._runner.run(call)
        # A shard without state (first use, or lost) is claimed only after the namespace
        # metadata was checked again (SPEC 4; the rule is the core's).
        if (claiming := self._core.claim(call, raw, mark)) is not None:
            # Every call in flight finds the same loss (the core says it once): one check of
            # the server and of the namespace for all of them, and for those sent before it
            # ended (their shards were not claimed again yet).
            said = self._core.losses_said
            while self._rechecked < said:  # (a run under way for an earlier loss: then ours)
                after = functools.partial(self._after_loss, said, checked)
                await self._flight.run("loss", after)
            raw = await self._runner.run(claiming)
            self._core.claim(claiming, raw)
        return raw

    async def _after_loss(self, said: int, checked: int) -> None:
        """The checks after the loss ``said`` (``Core.losses_said``): the server's again
        (its policy, the scripts it lost), unless a check passed since the call that found
        it was sent (``checked``: the runner's ``check_mark()`` then); then the namespace,
        before any shard is claimed again."""
        if self._rechecked >= said:  # a run that ended just before this one began
            return
        self._runner.suspect(checked)
        await self._check_namespace()
        self._rechecked = max(self._rechecked, said)

    async def reserve(
        self,
        operation_id: str,
        request: Any = None,
        *,
        principal: str,
        lease: float | None = None,
        fingerprint: str | None = None,
        attempt_id: str | None = None,
    ) -> Reserved | Replay | InProgress:
        """Claim ``operation_id`` for a new attempt (SPEC 2, reserve table).

        ``attempt_id``: leave it out (a random one is drawn). The same ``attempt_id`` asking
        again while its lease is live gets its own reservation back (a repeat after a lost
        reply), so one that a second worker or delivery can present too (a message id)
        would let both run the operation: see docs/concepts.md (R9)."""
        with self._span("reserve") as span:
            call = self._core.plan_reserve(
                operation_id,
                request,
                principal=principal,
                lease=lease,
                fingerprint=fingerprint,
                attempt_id=attempt_id,
            )
            return span.done(self._core.decode_reserve(call, await self._run(call)))

    async def complete(
        self, reservation: Reservation, result: Any, *, expected_version: int | None = None
    ) -> Settlement:
        """Settle the attempt with a committed success (absorbing)."""
        with self._span("complete", reservation) as span:
            call = self._core.plan_complete(reservation, result, expected_version=expected_version)
            return span.done(self._core.decode_settlement(call, await self._run(call)))

    async def fail(
        self,
        reservation: Reservation,
        error: BaseException | StoredFailure | Any,
        *,
        expected_version: int | None = None,
    ) -> Settlement:
        """Settle the attempt with a definite failure (absorbing, replayed thereafter)."""
        with self._span("fail", reservation) as span:
            call = self._core.plan_fail(reservation, error, expected_version=expected_version)
            return span.done(self._core.decode_settlement(call, await self._run(call)))

    async def mark_provisional(
        self, reservation: Reservation, reason: str, *, expected_version: int | None = None
    ) -> Settlement:
        """Record that the attempt ended in uncertainty; the next reserve takes over."""
        with self._span("mark_provisional", reservation) as span:
            call = self._core.plan_mark_provisional(
                reservation, reason, expected_version=expected_version
            )
            return span.done(self._core.decode_settlement(call, await self._run(call)))

    async def renew(self, reservation: Reservation, lease: float | None = None) -> Renewal:
        """Extend a live lease of the current generation (a heartbeat).

        With ``min_replicas`` its ``WAIT`` lasts at most a third of ``lease`` (a heartbeat's
        interval) when that is shorter than ``replica_timeout``: a replica that lags longer
        raises :class:`~settle.errors.DurabilityError` then (the lease was extended on the
        primary), so a heartbeat's next renewal is sent in time."""
        with self._span("renew", reservation) as span:
            call = self._core.plan_renew(reservation, lease=lease)
            return span.done(self._core.decode_renew(call, await self._run(call)))

    async def get(self, operation_id: str) -> OperationRecord | None:
        with self._span("get"):
            call = self._core.plan_get(operation_id)
            return self._core.decode_get(call, await self._run(call))

    async def get_many(self, operation_ids: list[str]) -> list[OperationRecord | None]:
        """The records of several operations, in their order (None where there is none), as
        :meth:`get` reads each: one script call per shard and 100 records, run together
        (one round trip on a single server; one per call on a cluster)."""
        with self._span("get_many"):
            calls = self._core.plan_get_many(operation_ids)
            if not await self._on_cluster():
                raws = await self._run_many(calls) if calls else []
                return self._core.decode_get_many(operation_ids, calls, raws)
            sent: list[Call] = []
            raws = []
            for call in calls:
                try:
                    parts = [call]
                    replies = await self._run_many(
                        [replace(call, caller_splits=len(call.keys) > 1)]
                    )
                except SlotSplit:
                    # A migrating slot refuses it (TRYAGAIN); it serves one record at a time.
                    parts = self._core.record_by_record(call)
                    replies = await self._run_many(parts)
                sent += parts
                raws += replies
            return self._core.decode_get_many(operation_ids, sent, raws)

    async def _on_cluster(self) -> bool:
        """Whether the calls run on Redis Cluster (not a single server, nor a model), known
        once the server was checked (``from_url`` on a cluster node switches then)."""
        if not self._checked:
            await self._check()
        return isinstance(self._runner, AsyncRunner) and self._runner.is_cluster

    async def _run_many(self, calls: list[Call]) -> list[Any]:
        if not self._checked:
            await self._check()
        return await self._runner.run_many(calls)

    async def attempts(self, operation_id: str) -> list[AttemptObservation]:
        with self._span("attempts"):
            call = self._core.plan_attempts(operation_id)
            if not await self._on_cluster():
                return self._core.decode_attempts(call, await self._run(call))
            try:
                raw = await self._run(replace(call, caller_splits=True))
            except SlotSplit:
                raw = await self._attempts_apart(call)
            return self._core.decode_attempts(call, raw)

    async def _attempts_apart(self, call: Call) -> Any:
        """``call``, an ``attempts`` read refused while a migration splits the record and
        the previous layout's attempt log (a key that normally does not exist, which a
        migrating slot counts as elsewhere), in single-key reads: the record's type, that
        log's entries when the record is in that layout (a HASH), then the record's own
        log (:meth:`Core.attempts_apart` joins them). In this order, a write that moves a
        HASH record to the current layout between the reads (it deletes the list) is
        seen in the record's read, never as an empty log."""
        runner = self._runner
        assert isinstance(runner, AsyncRunner)
        record, log = call.keys
        kind = await runner.command("TYPE", lambda client: client.type(record), key=record)
        legacy: list[Any] = []
        if kind in (b"hash", "hash"):  # the previous layout (never written back to it)
            legacy = await runner.command(
                "LRANGE", lambda client: client.lrange(log, -LOG_MAX, -1), key=log
            )
        raw = await self._run(self._core.record_only(call))
        return self._core.attempts_apart(raw, legacy)

    def operation(
        self,
        *,
        key: KeySpec,
        principal: PrincipalSpec,
        fingerprint: RequestSpec | None = None,
        result_type: Any = None,
        lease: float | None = None,
        timeout: float | None = None,
        retry: RetrySpec | None = None,
        terminal: TerminalSpec = (),
        wait: float = 5.0,
        name: str | None = None,
        on_replay: ReplayHook | None = None,
    ) -> AsyncOperation:
        """Decorate a retryable outbound call so that each operation settles once (SPEC 6).

        ``key``: the operation id, a callable over the call's arguments or a ``str.format``
        template over them by name (``"charge:{request.order_id}"``). ``principal``: a str
        or a callable over the call's arguments. ``fingerprint``: a callable over the call's
        arguments returning the request to fingerprint (default: every argument but the
        ``Attempt`` and ``self``). ``result_type``: what replayed results are validated into
        (default: the return annotation). ``lease``: seconds, renewed every lease/3 while
        the function runs. ``timeout``: seconds per attempt. ``retry``: a
        ``tenacity.Retrying(stop=..., wait=..., retry=...)`` policy for uncertain outcomes
        (default: 3 attempts, exponential backoff with jitter). ``terminal``: exception
        types stored with ``fail`` and replayed as ``OperationFailed``. ``wait``: seconds to
        wait for another attempt that holds the lease before ``OperationInProgress``.
        ``name``: the function's identity in the fingerprint (default ``module.qualname``):
        functions of different names with colliding keys get ``FingerprintMismatch``, never
        each other's results; give two functions the same ``name`` to share operations on
        purpose, and each variant a factory makes its own (they share one ``module.qualname``).
        A lambda without ``name`` is refused, and so is a second definition under an identity
        already decorated in the namespace whose key can make the same ids.
        ``on_replay``: a plain callable (never awaited: a coroutine function is refused), called
        with the stored ``OperationRecord`` when a call's outcome is replayed rather than
        computed. The function needs a return annotation or
        ``result_type`` (``InvalidInput`` at decoration otherwise).
        See docs/outbound-calls.md.
        """
        options = Options(
            self.config,
            key=key,
            principal=principal,
            fingerprint=fingerprint,
            result_type=result_type,
            lease=lease,
            timeout=timeout,
            retry=retry,
            terminal=terminal,
            wait=wait,
            name=name,
            on_replay=on_replay,
            place=getattr(self._runner, "place", "redis"),
        )
        return AsyncOperation(self, options)


class AsyncQuarantine:
    """The quarantine of one namespace: list, get, resolve, follow."""

    def __init__(self, settler: AsyncSettler) -> None:
        self._settler = settler
        # The plans of the reads below, not yet read (the core's, with their filters), for
        # the reads and for settle's tools, which mark what this version cannot decode
        # (``.marking()``) or read headers only (``.header_marking()``), then run them with
        # the private runners below: the CLI reaches no further into the settler.
        #: The walk :meth:`scan` plans, run by :meth:`_scanned` (``settle quarantine
        #: export``, ``settle stats``, ``settle doctor``'s oldest unresolved entry).
        self._walk = settler._core.quarantine_scan
        #: The listing :meth:`list` and :meth:`headers` plan, run by :meth:`_listed`
        #: (``settle quarantine ls``, ``settle inspect``).
        self._listing = settler._core.quarantine_query
        #: The follower :meth:`follow` plans, run by :meth:`_followed` (``settle quarantine
        #: tail``).
        self._following = settler._core.quarantine_follower

    async def _run_many(self, calls: list[Call]) -> list[Any]:
        runner = self._settler._runner
        if not (await self._settler._on_cluster() and isinstance(runner, AsyncRunner)):
            return await self._settler._run_many(calls)
        return [await self._read(runner, call) for call in calls]

    async def _read(self, runner: AsyncRunner, call: Call) -> Any:
        """One call of a quarantine read on Redis Cluster. A read of a shard whose slot is
        migrating, refused while the migration splits its stream and resolutions between
        the nodes (or one of them does not exist), is done in two single-key reads the
        migrating slot serves: the stream's entries, then their resolutions (the same
        answer, a round trip more; docs/operations.md, "Redis Cluster")."""
        if call.script != "quarantine_read":
            return (await self._settler._run_many([call]))[0]
        try:
            return (await self._settler._run_many([replace(call, caller_splits=True)]))[0]
        except SlotSplit:
            pass
        core = self._settler._core
        reply = (await self._settler._run_many([core.stream_only(call)]))[0]
        ids = core.match_ids(reply)
        if not ids:
            return core.with_resolutions(call, reply, [])
        key, stream = call.keys[1], call.keys[0]
        found = await runner.command("HMGET", lambda client: client.hmget(key, ids), key=key)
        span = core.unresolved_span(reply, found)
        if span is None:
            return core.with_resolutions(call, reply, found)
        entries = await runner.command(
            "XRANGE", lambda client: client.xrange(stream, *span), key=stream
        )
        return core.with_resolutions(call, reply, found, (e[0] for e in entries))

    def _query(
        self,
        kind: QuarantineKind | str | None,
        operation_id: str | None,
        since: datetime | None,
        until: datetime | None,
        unresolved: bool,
        limit: int,
        newest_first: bool,
    ) -> QuarantineQuery[QuarantineEntry]:
        """The listing ``list`` and ``headers`` plan from the same filters (each method
        spells them out, with their defaults, for type checkers and the docs)."""
        return self._listing(
            kind=kind,
            operation_id=operation_id,
            since=since,
            until=until,
            unresolved=unresolved,
            limit=limit,
            newest_first=newest_first,
        )

    async def _listed(self, query: QuarantineQuery[E]) -> list[E]:
        """Run a planned listing to its end (``list``, ``headers``, and the console's pages,
        which plan theirs from a cursor)."""
        with self._settler._span("quarantine.list"):
            while calls := query.calls():
                query.feed(calls, await self._run_many(calls))
            return query.result()

    async def headers(
        self,
        *,
        kind: QuarantineKind | str | None = None,
        operation_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        unresolved: bool = False,
        limit: int = 100,
        newest_first: bool = True,
    ) -> list[QuarantineHeader]:
        """The entries ``list`` would return, as headers: id, kind, time and whether
        resolved, and nothing else. Redis sends no payload (up to
        ``quarantine_payload_bytes`` an entry) and no other field: what counting entries by
        kind, time or status needs (the console's overview)."""
        filters = (kind, operation_id, since, until, unresolved, limit, newest_first)
        return await self._listed(self._query(*filters).headers())

    async def list(
        self,
        *,
        kind: QuarantineKind | str | None = None,
        operation_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        unresolved: bool = False,
        limit: int = 100,
        newest_first: bool = True,
    ) -> list[QuarantineEntry]:
        filters = (kind, operation_id, since, until, unresolved, limit, newest_first)
        return await self._listed(self._query(*filters))

    async def scan(
        self,
        *,
        kind: QuarantineKind | str | None = None,
        operation_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        unresolved: bool = False,
    ) -> AsyncIterator[QuarantineEntry]:
        """Every matching entry, oldest first, with no cap: read a page at a time, so
        memory stays bounded (a few hundred entries) however long the quarantine is."""
        scan = self._walk(
            kind=kind, operation_id=operation_id, since=since, until=until, unresolved=unresolved
        )
        async for entry in self._scanned(scan):
            yield entry

    async def _scanned(self, scan: QuarantineScan[E]) -> AsyncIterator[E]:
        """Run a planned walk (``_walk``) to its end, a page at a time (``scan``, and
        ``settle stats``, which walks headers: ``_walk().header_marking()``, no payload
        read)."""
        while not scan.finished:
            calls = scan.calls()
            if calls:
                scan.feed(calls, await self._run_many(calls))
            for entry in scan.ready():
                yield entry

    async def get(self, quarantine_id: str) -> QuarantineEntry:
        """One entry by ``shard/id`` (as in ``Settlement.quarantine_id``) or a bare id."""
        with self._settler._span("quarantine.get"):
            calls = self._settler._core.plan_quarantine_lookup(quarantine_id)
            return self._settler._core.decode_quarantine_lookup(
                quarantine_id, calls, await self._run_many(calls)
            )

    async def resolve(self, quarantine_id: str, *, note: str) -> Resolution:
        """Mark an entry resolved with a note; the evidence stays. The first note stands."""
        self._settler._core.check_note(note)
        with self._settler._span("quarantine.resolve"):
            entry = await self.get(quarantine_id)
            call = self._settler._core.plan_resolve(entry, note)
            return self._settler._core.decode_resolve(call, await self._settler._run(call))

    async def trim(
        self, *, older_than: float | None = None, include_unresolved: bool = False
    ) -> TrimResult:
        """Delete resolved entries (older than ``older_than`` seconds, when given) with their
        resolutions. Unresolved evidence goes only with ``include_unresolved=True``, which
        needs ``older_than``. See docs/operations.md, "Quarantine retention"."""
        trim = self._settler._core.quarantine_trim(
            older_than=older_than, include_unresolved=include_unresolved
        )
        with self._settler._span("quarantine.trim"):
            while call := trim.next_call():
                trim.feed(call, await self._settler._run(call))
            return trim.result()

    async def follow(
        self,
        *,
        kind: QuarantineKind | str | None = None,
        operation_id: str | None = None,
        unresolved: bool = False,
        since: datetime | None = None,
        poll_interval: float = 0.5,
    ) -> AsyncIterator[QuarantineEntry]:
        """Yield entries written from now (or ``since``) on, oldest first, until closed.
        An entry this version cannot decode (another version or program wrote it) is
        skipped, logged as ``settle.quarantine.undecodable`` with its id: the follow goes
        on (docs/concepts.md, "The quarantine")."""
        follower = self._following(
            kind=kind,
            operation_id=operation_id,
            unresolved=unresolved,
            since=since,
            poll_interval=poll_interval,
        )
        async for entry in self._followed(follower, poll_interval):
            if not isinstance(entry, UndecodableEntry):
                yield entry

    async def _followed(
        self,
        follower: QuarantineFollower,
        poll_interval: float,
        stopped: Callable[[], bool] = lambda: False,
    ) -> AsyncIterator[QuarantineEntry | UndecodableEntry]:
        """Run a follower until closed or ``stopped()``, each entry it cannot decode marked
        in its place (``follow`` skips those; ``settle quarantine tail`` shows them, and
        stops on its Ctrl-C flag even when the ``KeyboardInterrupt`` was lost)."""
        while not stopped():
            calls = follower.calls()
            for entry in follower.feed(calls, await self._run_many(calls)):
                yield entry
            if follower.idle:
                await asyncio.sleep(poll_interval)


def _config(config: SettleConfig | None, options: dict[str, Any]) -> SettleConfig:
    if config is not None and not isinstance(config, SettleConfig):
        raise InvalidInput(
            f"config must be a SettleConfig, got {type(config).__name__}; pass the settings "
            "as keyword arguments or as SettleConfig(...)"
        )
    if config is not None:
        return SettleConfig(**{**config.model_dump(), **options}) if options else config
    return SettleConfig(**options)
