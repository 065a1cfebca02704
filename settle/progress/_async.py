"""The asyncio shell of ``settle.progress``: ``AsyncProgressStore`` (progress of one
consumer on its own Redis) and ``AsyncStreamConsumer`` (a Redis Streams consumer-group
worker). Hand-written; ``_sync.py`` is generated from it by ``scripts/unasync.py`` (a test
fails on drift). Every rule lives in ``_core`` and ``_step``; this only does I/O.

Per delivery: XREADGROUP (or XAUTOCLAIM of a stuck one) -> consult progress -> apply the
effect -> record progress durably -> fenced XACK -> record the receipt. The stream lives on
one Redis, progress on another; nothing is acknowledged before the progress that covers it
is durable, and a worker that no longer owns a delivery cannot acknowledge it (the
ownership check runs in the same Lua call as the XACK).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Generator
from contextlib import ExitStack
from dataclasses import dataclass, field
from time import monotonic
from typing import Any, TypeVar

from redis.asyncio import Redis, RedisCluster

# unasync: async-only
from settle._input import awaited

# unasync: end
from settle._runtime import Call, Durability
from settle._runtime._async import (
    AsyncConnectable,
    AsyncRunner,
    check_block_fits,
    client_from_url,
)
from settle._runtime.options import check_client
from settle._runtime.transient import APART_ROUNDS, unsettled_apart
from settle._telemetry import telemetry
from settle.errors import BackendError
from settle.progress import _step
from settle.progress._core import (
    ConsumerOptions,
    ProgressCore,
    ProgressReply,
    StreamEntry,
    StreamVerdict,
    check_apply,
)
from settle.progress._keys import StreamKeys
from settle.progress._scripts import PROGRESS, STREAM
from settle.progress._step import (
    Instruction,
    Notify,
    RunEffect,
    RunScript,
    RunStreamScript,
    Settling,
)
from settle.progress.errors import InvalidDelivery, ProviderReset
from settle.progress.identity import (
    AttemptId,
    DeliveryId,
    EmissionId,
    ProviderScope,
    SettlementAuthority,
    check_name,
)
from settle.progress.models import (
    Applied,
    EffectContext,
    IntentKind,
    Progress,
    SettleIntent,
    SettlementReceipt,
)

__all__ = ["AsyncEffect", "AsyncProgressStore", "AsyncStreamConsumer", "Observer", "PollReport"]

#: An ``async def`` effect, or a plain function (its value stands: it ran).
AsyncEffect = Callable[[EffectContext], Awaitable[object] | object]
#: Called at each step of a delivery (``effect_applied``, ``progress_recorded``, ...): for
#: metrics and tracing, and for tests that cut a worker at an exact step.
Observer = Callable[[str, DeliveryId], None]
T = TypeVar("T")


def _noop(_step: str, _delivery: DeliveryId) -> None:
    return None


async def _unused_effect(_context: EffectContext) -> None:
    raise AssertionError("no effect runs in this procedure")  # pragma: no cover


class AsyncProgressStore(AsyncConnectable):
    """Progress of ``consumer`` (in ``namespace``) on the progress server.

    ``min_replicas`` / ``replica_timeout``: as ``SettleConfig``'s, every progress write is
    followed by ``WAIT`` and too few acknowledgements raise ``DurabilityError``.
    ``allow_eviction``: as ``SettleConfig``'s, accept an evicting ``maxmemory-policy``."""

    def __init__(
        self,
        client: Redis | RedisCluster | Any,
        *,
        consumer: str,
        namespace: str = "default",
        observer: Observer | None = None,
        receipts_cap: int = 10_000,
        min_replicas: int = 0,
        replica_timeout: float = 1.0,
        allow_eviction: bool = False,
    ) -> None:
        check_client(client, (Redis, RedisCluster), type(self).__name__)
        self.core = ProgressCore(namespace, consumer, receipts_cap)
        self.consumer = consumer
        self.observer = observer or _noop
        self._runner = AsyncRunner(
            client, PROGRESS, Durability(min_replicas, replica_timeout, allow_eviction)
        )

    # unasync: async-only
    async def close(self) -> None:
        """The same as ``aclose()``."""
        await self.aclose()

    # unasync: end
    async def drive(
        self,
        steps: Generator[Instruction, Any, T],
        effect: AsyncEffect = _unused_effect,
        stream: AsyncRunner | None = None,
    ) -> T:
        """Carry out a procedure of ``settle.progress._step``: scripts on this store's
        server (and on ``stream``'s), the effect, the observer."""
        reply: Any = None
        error: Exception | None = None
        with ExitStack() as spans:
            settling: Any = None  # the span of the settlement under way, if any
            while True:
                try:
                    instruction = steps.throw(error) if error is not None else steps.send(reply)
                except StopIteration as done:
                    if settling is not None:
                        settling.done(done.value)
                    return done.value  # type: ignore[no-any-return]
                reply, error = None, None
                match instruction:
                    case RunScript(call=call):
                        reply = await self._runner.run(call)
                    case RunStreamScript(call=call):
                        assert stream is not None, "a stream procedure needs the stream's runner"
                        reply = await stream.run(call)
                    case RunEffect(context=context):
                        try:
                            reply = effect(context)
                            # unasync: async-only
                            reply = await awaited(reply)  # a plain effect ran: it stands
                            # unasync: end
                        except Exception as exc:  # noqa: BLE001 - the procedure decides
                            error = exc
                    case Notify(step=step, delivery=delivery):
                        self.observer(step, delivery)
                    case Settling(scope=scope, kind=kind):
                        client = stream.client if stream is not None else None
                        settling = telemetry().settling(scope, kind, self.consumer, client)
                        spans.enter_context(settling)

    async def progress(self, call: Call) -> ProgressReply:
        """Run one planned progress call and decode its reply."""
        return self.core.decode(call, await self._runner.run(call))

    async def apply(
        self,
        scope: ProviderScope,
        delivery: DeliveryId,
        emission: EmissionId,
        effect: AsyncEffect,
        *,
        attempt: AttemptId | None = None,
        fields: dict[str, bytes] | None = None,
    ) -> Applied:
        """Apply a delivery: consult progress; run ``effect`` unless the delivery or its
        emission is already applied; then record progress durably (and open its settle
        intent). Only the returned progress authorizes settling the delivery. Like every
        write of the store's own, it creates the scope's progress when there is none (the
        store has no stream server to ask whether that progress was lost: a
        ``StreamConsumer`` asks)."""
        checked = check_apply(effect, fields)
        steps = _step.apply(
            self.core,
            scope,
            delivery,
            emission,
            attempt or AttemptId.new(),
            checked,
            claim=True,
        )
        return await self.drive(steps, effect)

    async def dead_letter(
        self,
        scope: ProviderScope,
        delivery: DeliveryId,
        emission: EmissionId | None,
        *,
        reason: str,
        delivery_count: int,
    ) -> ProgressReply:
        """Quarantine a delivery durably (evidence + dead_letter intent) before the provider
        is told."""
        steps = _step.dead_letter(
            self.core, scope, delivery, emission, reason, delivery_count, claim=True
        )
        return await self.drive(steps)

    async def defer(
        self, scope: ProviderScope, delivery: DeliveryId, emission: EmissionId, *, reason: str
    ) -> ProgressReply:
        """Set a delivery aside durably (unapplied) before the provider stops redelivering it."""
        return await self.drive(
            _step.defer(self.core, scope, delivery, emission, reason, claim=True)
        )

    async def record_receipt(
        self,
        scope: ProviderScope,
        delivery: DeliveryId,
        kind: IntentKind,
        verdict: StreamVerdict,
        worker: str,
    ) -> SettlementReceipt:
        """Record what the provider said; a conclusive answer closes the settle intent."""
        call = self.core.plan_receipt(scope, delivery, kind, verdict, worker)
        reply = await self.drive(_step.progress(self.core, call, claim=True))
        return self.core.receipt(delivery, kind, verdict, worker, reply)

    async def observe(
        self,
        scope: ProviderScope,
        after: DeliveryId | None,
        listing: list[DeliveryId],
        *,
        last_delivered: DeliveryId | None,
        oldest_pending: DeliveryId | None,
        pending: int,
    ) -> Progress:
        """Store the provider floor as observed; advance the floor along ``listing``. A
        listing that starts above the floor (``after``) raises :class:`UnprovenListing` and
        writes nothing."""
        call = self.core.plan_observe(
            scope,
            after,
            listing,
            last_delivered=last_delivered,
            oldest_pending=oldest_pending,
            pending=pending,
        )
        reply = await self.drive(_step.progress(self.core, call, claim=True))
        return self.core.observed(scope, reply, strict=True)

    async def read(self, scope: ProviderScope) -> Progress:
        call = self.core.plan_read(scope)
        raw = await self._runner.run_or_apart(call, self._read_apart)
        return self.core.decode(call, raw).progress

    async def _read_apart(self, call: Call) -> Any:
        """A ``read`` that a Redis Cluster migration refused (its script names the scope's
        eleven keys, several of which a scope rarely has: the importing node cannot hold
        them), in single-key reads, which a migrating slot serves (after ASK if the key
        moved): the meta, the five hashes the reply holds, then the meta again. Every write
        to those hashes but the intents changes the meta (its ``ver``; the floor moves
        with it): when it is the same before and after, the answer is the state when the
        intents were read; else all is read again."""
        meta, applied, resolved, gaps, intents, deferred = call.keys[:6]
        for _ in range(APART_ROUNDS):
            first = await self._hash(meta)
            parts = [await self._hash(key) for key in (applied, resolved)]
            parts.append(
                await self._runner.command("HKEYS", lambda client: client.hkeys(gaps), key=gaps)
            )
            parts += [await self._hash(key) for key in (intents, deferred)]
            if await self._hash(meta) == first:
                return self.core.read_apart(first, parts)
        raise unsettled_apart(call, f"the progress of consumer {self.consumer!r}")

    async def _hash(self, key: str) -> dict[Any, Any]:
        found: dict[Any, Any] = await self._runner.command(
            "HGETALL", lambda client: client.hgetall(key), key=key
        )
        return found

    async def receipts(self, scope: ProviderScope, *, limit: int = 100) -> list[SettlementReceipt]:
        """The latest settlement receipts of ``scope`` (what the provider said), newest first."""
        call = self.core.plan_receipts(scope, limit)
        return self.core.decode_receipts(call, await self._runner.run(call))

    async def scopes(self) -> list[ProviderScope]:
        call = self.core.plan_scopes()
        return self.core.decode_scopes(call, await self._runner.run(call))

    async def show(self) -> list[Progress]:
        """The progress of every scope this consumer has recorded."""
        return [await self.read(scope) for scope in await self.scopes()]


@dataclass
class PollReport:
    """What one poll did: deliveries handled, and the receipts the provider gave."""

    handled: list[DeliveryId] = field(default_factory=list)
    receipts: list[SettlementReceipt] = field(default_factory=list)


class AsyncStreamConsumer:
    """One worker of a consumer group; ``store`` holds the consumer's progress elsewhere.

    ``min_replicas`` / ``replica_timeout`` apply to the stream's server (the store has its
    own for the progress server)."""

    def __init__(
        self,
        client: Redis | RedisCluster | Any,
        store: AsyncProgressStore,
        *,
        stream: str,
        group: str,
        worker: str | None = None,
        emission_field: str = "emission_id",
        max_deliveries: int = 5,
        claim_idle: float = 30.0,
        batch: int = 32,
        block: float = 1.0,
        listing: int = 512,
        retry_pause: float = 0.5,
        min_replicas: int = 0,
        replica_timeout: float = 1.0,
        allow_eviction: bool = False,
    ) -> None:
        # Checked here, before anything is sent: a bad option would otherwise surface only
        # after XREADGROUP handed this worker deliveries (dead-lettering them all, say), and
        # so would a name the settlement authority refuses.
        self.options = ConsumerOptions.check(
            emission_field=emission_field,
            max_deliveries=max_deliveries,
            claim_idle=claim_idle,
            batch=batch,
            block=block,
            listing=listing,
            retry_pause=retry_pause,
        )
        if not isinstance(store, AsyncProgressStore):  # the other flavour's replies differ
            raise InvalidDelivery(
                f"store must be a settle.progress.AsyncProgressStore, got {type(store).__name__}"
            )
        check_client(
            client,
            (Redis, RedisCluster),
            type(self).__name__,
            "from_urls(stream_url, progress_url, consumer=...)",
        )
        default = f"{store.consumer[:240]}-{uuid.uuid4().hex[:12]}"
        self.worker = check_name(default if worker is None else worker, "worker")
        self.store = store
        self.stream = stream
        self.group = group
        self.core = store.core
        self.scope: ProviderScope | None = None
        self._claim_from = "0-0"
        # Whether the next claim looks at this worker's own pending list: deliveries a
        # call whose reply was lost handed over, or that a stopped poll left (see _own).
        self._own_pending = True
        # Until its first look, what this worker holds may be a previous process's under
        # its name: taken as it is (its idle time kept), see _own.
        self._inherited = True
        # The deliveries whose handling a stopped poll cut short: left to XAUTOCLAIM.
        self._interrupted: set[DeliveryId] = set()
        check_block_fits(client, self.options.block_ms / 1000)
        self._runner = AsyncRunner(
            client, STREAM, Durability(min_replicas, replica_timeout, allow_eviction)
        )

    @property
    def client(self) -> Any:
        """The redis-py client of the stream's server."""
        return self._runner.client

    @classmethod
    def from_urls(
        cls, stream_url: str, progress_url: str, *, consumer: str, **options: Any
    ) -> AsyncStreamConsumer:
        """Connect to the stream's server and the progress server; ``namespace``,
        ``min_replicas``, ``replica_timeout`` and ``allow_eviction`` apply to both, the rest
        to the consumer."""
        shared = {
            k: options[k]
            for k in ("min_replicas", "replica_timeout", "allow_eviction")
            if k in options
        }
        namespace = options.pop("namespace", "default")
        store = AsyncProgressStore.from_url(
            progress_url, consumer=consumer, namespace=namespace, **shared
        )
        return cls(client_from_url(stream_url), store, **options)

    @property
    def dead_letter_key(self) -> str:
        """The key of the stream-side dead-letter stream (on the stream's server): one entry
        (delivery, group, emission, reason, deliveries) per delivery dead-lettered."""
        return StreamKeys(self.stream).dead_letters

    async def aclose(self) -> None:
        """Close both servers' connections (the store's too, even when the stream's
        connections fail to close)."""
        try:
            await self._runner.aclose()
        finally:
            await self.store.aclose()

    # unasync: async-only
    async def close(self) -> None:
        """The same as ``aclose()``."""
        await self.aclose()

    # unasync: end
    async def __aenter__(self) -> AsyncStreamConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _scope(self) -> ProviderScope:
        if self.scope is None:
            raise ProviderReset("the consumer has no scope yet: call start() (poll() does)")
        return self.scope

    async def _started(self) -> ProviderScope:
        return self.scope if self.scope is not None else await self.start()

    async def _command(self, what: str, send: Callable[[Any], Awaitable[Any]], **kw: Any) -> Any:
        """A command (or a pipeline of them) on the scope's stream, which ``send(client)``
        issues on the client the runtime gives it: on a cluster, the client of the node
        that serves the stream's slot, whatever other node hangs."""
        scope = self._scope()
        try:
            return await self._runner.command(what, send, key=scope.stream, **kw)
        except BackendError as exc:
            self.core.raise_stream_failure(exc, scope)

    async def start(self) -> ProviderScope:
        """Ensure the group exists and open the scope of the stream's current incarnation."""
        call = self.core.plan_stream_scope(self.stream, self.group)
        self.scope = self.core.decode_stream_scope(call, await self._runner.run(call))
        self._claim_from = "0-0"  # a new scan of the pending list
        self._own_pending = True  # and a look at what this worker already holds
        return self.scope

    async def poll(self, effect: AsyncEffect) -> PollReport:
        """Reclaim stuck deliveries, read new ones, handle each; then observe the provider.

        Starts the consumer first when ``start()`` was not called. A pending delivery whose
        stream entry was deleted is settled from progress (applied before) or dead-lettered
        with reason ``deleted``; see ``observe()`` for lost deliveries."""
        await self._started()
        report = PollReport()
        current: DeliveryId | None = None  # the delivery being handled
        try:
            claimed, vanished = await self._claim()
            for delivery, count in vanished:
                current = delivery
                report.handled.append(delivery)
                report.receipts.append(await self.vanished(delivery, count))
                current = None
            for entry, count in claimed + await self._read():
                current = entry.delivery
                receipt = await self.handle(entry, count, effect)
                current = None
                report.handled.append(entry.delivery)
                if receipt is not None:
                    report.receipts.append(receipt)
        except BaseException:
            # A lost reply (XREADGROUP is not repeated) or a poll stopped before some
            # deliveries were handled leaves them pending for this worker: the next poll
            # takes them at their delivery count, not one higher after claim_idle. Not the
            # one whose handling stopped: the same stop may come again (a replica down, a
            # cancelled effect), so it goes back to XAUTOCLAIM, which counts the attempt.
            self._own_pending = True
            if current is not None:
                self._interrupted.add(current)
            raise
        progress = await self.observe()
        report.receipts.extend(await self._orphans(progress))
        return report

    async def _read(self) -> list[tuple[StreamEntry, int]]:
        scope = self._scope()
        # Not repeated after a lost reply: the entries it delivered are pending for this
        # worker and come back through XAUTOCLAIM.
        raw = await self._command(
            "XREADGROUP",
            lambda client: client.xreadgroup(
                scope.group,
                self.worker,
                {scope.stream: ">"},
                count=self.options.batch,
                block=self.options.block_ms,
            ),
            repeatable=False,
        )
        entries = self.core.delivered(raw)
        for entry in entries:
            self.store.observer("received", entry.delivery)
        return [(e, 1) for e in entries]

    async def _claim(self) -> tuple[list[tuple[StreamEntry, int]], list[tuple[DeliveryId, int]]]:
        """XAUTOCLAIM from where the last scan stopped (its returned cursor), so entries
        deleted while pending never hide a live stuck one: the deliveries claimed with their
        counts, and the pending deliveries whose entries are gone (Redis 7 lists their ids
        and drops them; Redis 6.2 answers nil, keeps them pending for this worker, and they
        are found with XPENDING)."""
        scope = self._scope()
        start = self._claim_from
        tries = 0

        def autoclaim(client: Any) -> Any:
            nonlocal tries
            tries += 1
            return client.xautoclaim(
                scope.stream,
                scope.group,
                self.worker,
                self.options.claim_idle_ms,
                start,
                self.options.batch,
            )

        # Repeated after a transient failure, like every read of the stream. When the lost
        # try had already claimed entries, the repeat does not return them (they are no
        # longer idle): they are pending for this worker, found by _own.
        raw = await self._command("XAUTOCLAIM", autoclaim)
        self._own_pending = self._own_pending or tries > 1
        self._claim_from, deleted, nils = self.core.autoclaim_scan(raw)
        entries, _ = self.core.claimed(raw, None)
        vanished = [(d, 0) for d in deleted]
        if nils:
            vanished += await self._vanished(scope, start, self._claim_from, entries)
        own, gone = await self._own(scope, {e.delivery for e in entries} | {d for d, _ in vanished})
        vanished += gone
        if not entries:
            return own, vanished
        pending = await self._command(
            "XPENDING",
            lambda client: client.xpending_range(
                scope.stream,
                scope.group,
                min=entries[0].delivery.value,
                max=entries[-1].delivery.value,
                count=len(entries) * 4 + 16,
                consumername=self.worker,
            ),
        )
        _, out = self.core.claimed(raw, pending)
        for entry, _count in out:
            self.store.observer("claimed", entry.delivery)
        return out + own, vanished

    async def _own(
        self, scope: ProviderScope, skip: set[DeliveryId]
    ) -> tuple[list[tuple[StreamEntry, int]], list[tuple[DeliveryId, int]]]:
        """After a start, a stopped poll or a repeated XAUTOCLAIM: the deliveries pending
        for this worker that it never handled (a lost reply handed them over; a poll
        stopped before settling them), each at the delivery count it holds, so that no
        lost reply spends one of ``max_deliveries``; those whose entries are gone go the
        ``deleted`` way. Only those idle less than ``claim_idle``: the others (a released
        delivery among them) are XAUTOCLAIM's. Each is made fresh (``_hold``) so that its
        effect has the whole of ``claim_idle``, except on the first look, which may find a
        previous process's deliveries under this name: made fresh, one that killed that
        process would be taken at its count again and again, never reaching
        ``max_deliveries``."""
        if not self._own_pending:
            return [], []
        rows = await self._command(
            "XPENDING",
            lambda client: client.xpending_range(
                scope.stream,
                scope.group,
                min="-",
                max="+",
                count=self.options.batch,
                consumername=self.worker,
            ),
        )
        listed = monotonic()  # after the listing ran: what elapsed since, it measures short
        inherited, self._inherited = self._inherited, False
        # A full listing may have left some out: look again on the next poll.
        self._own_pending = len(rows or []) >= self.options.batch
        if not self._own_pending:  # forget what this worker no longer holds
            self._interrupted &= self.core.pending_ids(rows)
        rows = self.core.own_pending(rows, skip | self._interrupted, self.options.claim_idle_ms)
        if not rows:
            return [], []
        present = await self._command("XRANGE", lambda client: self._entries(client, scope, rows))
        own, gone = self.core.own_entries(rows, present)
        if own and not inherited:
            held = self.core.own_rows(rows, own)
            kept = await self._hold(scope, held, listed)
            fresh = self.core.still_own(own, kept)
            # One not kept is another worker's now, or this worker's made fresh by a try
            # whose reply was lost (the repeat found it idle too little): look again.
            self._own_pending = self._own_pending or len(fresh) < len(own)
            own = fresh
        for entry, _count in own:
            self.store.observer("claimed", entry.delivery)
        return own, gone

    async def _hold(
        self, scope: ProviderScope, rows: list[Any], listed: float | None = None
    ) -> list[Any]:
        """Make each delivery of ``rows`` fresh for this worker (idle 0, its delivery count
        kept: XCLAIM JUSTID) while it is still as listed (``listed``: ``monotonic()`` when
        the listing's reply came; None: just now): one XCLAIM JUSTID answer per row, empty
        for one not made fresh. The server checks, in the same step as the claim
        (``lua/stream_hold.lua``), that the delivery is still pending to this worker, idle
        at least the idle time listed plus what elapsed here since (short of the server's:
        a delivery no one touched passes). One another worker's XAUTOCLAIM took meanwhile
        stays that worker's, however late the request reaches the server (a slow link, a
        repeat after a lost reply); one a try whose reply was lost made fresh is claimed
        again only when idle that long, else looked for again on the next poll."""
        elapsed = 0 if listed is None else int((monotonic() - listed) * 1000)
        call = self.core.plan_stream_hold(scope, self.worker, rows, elapsed)
        return self.core.decode_stream_hold(call, await self._runner.run(call), scope)

    async def _vanished(
        self, scope: ProviderScope, start: str, stop: str, claimed: list[StreamEntry]
    ) -> list[tuple[DeliveryId, int]]:
        rows = await self._command(
            "XPENDING",
            lambda client: client.xpending_range(
                scope.stream,
                scope.group,
                min=start,
                max="+" if stop == "0-0" else f"({stop}",
                count=self.options.batch * 4 + 16,
                consumername=self.worker,
            ),
        )
        present = await self._command("XRANGE", lambda client: self._entries(client, scope, rows))
        return self.core.vanished(rows, present, claimed)

    async def _entries(self, client: Any, scope: ProviderScope, rows: list[Any]) -> list[Any]:
        async with client.pipeline(transaction=False) as pipe:
            for row in rows:
                pipe.xrange(scope.stream, row["message_id"], row["message_id"])
            return list(await pipe.execute())

    async def vanished(self, delivery: DeliveryId, delivery_count: int) -> SettlementReceipt:
        """Settle a pending delivery whose stream entry was deleted (see ``_step.vanished``)."""
        steps = _step.vanished(self.core, self._scope(), self.worker, delivery, delivery_count)
        return await self.store.drive(steps, stream=self._runner)

    async def handle(
        self, entry: StreamEntry, delivery_count: int, effect: AsyncEffect
    ) -> SettlementReceipt | None:
        """Handle one delivery this worker holds at ``delivery_count``."""
        steps = _step.deliver(
            self.core,
            self._scope(),
            self.worker,
            entry,
            delivery_count,
            emission_field=self.options.emission_field,
            max_deliveries=self.options.max_deliveries,
        )
        return await self.store.drive(steps, effect, self._runner)

    async def settle(
        self,
        authority: SettlementAuthority,
        kind: IntentKind,
        emission: EmissionId | None = None,
        reason: str = "",
        *,
        fenced_count: bool = True,
    ) -> SettlementReceipt:
        """One fenced settlement on the stream's server, then its receipt in progress.
        Durable progress must authorize it first (SPEC 10): an acknowledgement or a
        dead-letter only of a delivery progress covers, a deferral only of one it holds as
        deferred; else :class:`SettlementNotAuthorized`, and nothing is settled."""
        steps = _step.settle(
            self.core,
            self._scope(),
            authority,
            kind,
            emission,
            reason,
            fenced_count=fenced_count,
            authorize=True,
        )
        return await self.store.drive(steps, stream=self._runner)

    async def recover(self) -> list[SettlementReceipt]:
        """Finish the settle intents progress still holds (the "progress recorded,
        acknowledgement lost" cut): an intent whose delivery is no longer pending is closed;
        one this worker owns is settled; one owned by another worker is left to XAUTOCLAIM."""
        progress = await self.store.read(await self._started())
        return [await self._settle_intent(progress, intent) for intent in progress.intents]

    async def _settle_intent(self, progress: Progress, intent: SettleIntent) -> SettlementReceipt:
        """Carry out an open settle intent, authorized by the progress it was read from (one
        read for all of them, not one per intent)."""
        _step.authorized(self.core, progress, intent.delivery, intent.kind)
        authority = SettlementAuthority(self.worker, intent.delivery, 0)
        steps = _step.settle(
            self.core,
            self._scope(),
            authority,
            intent.kind,
            intent.emission,
            intent.reason,
            fenced_count=False,
        )
        return await self.store.drive(steps, stream=self._runner)

    async def observe(self) -> Progress:
        """Read the provider's floor and a listing after the progress floor; record lost
        deliveries (handed out by the group, no longer pending, not covered by progress:
        a gap that holds the floor, and a ``settle.progress.lost`` event); advance the
        floor."""
        scope = await self._started()
        after = (await self.store.read(scope)).floor
        listed, groups, summary, pending = await self._command(
            "XRANGE", lambda client: self._listing(client, scope, after)
        )
        last = self.core.last_delivered(scope, groups)
        candidates = self.core.lost_candidates(listed, last, pending, self.options.listing)
        if candidates:
            self.core.lost(scope, await self._progress(self.core.plan_lost(scope, candidates)))
        call = self.core.plan_observation(
            scope, after, listed, groups, summary, pending, self.options.listing
        )
        return self.core.observed(scope, await self._progress(call))

    async def _progress(self, call: Call) -> ProgressReply:
        """A progress call of this consumer: progress found missing is checked on the
        stream's server (``_step.progress``), so lost progress raises ``ProgressLost``."""
        return await self.store.drive(
            _step.progress(self.core, call, claim=False), stream=self._runner
        )

    async def _listing(
        self, client: Any, scope: ProviderScope, after: DeliveryId | None
    ) -> list[Any]:
        # In this order: the last-delivered id is read before the pending list, so a
        # delivery handed out in between is above it, never taken for lost.
        low = f"({after.value}" if after else "-"
        async with client.pipeline(transaction=False) as pipe:
            pipe.xrange(scope.stream, low, "+", self.options.listing)
            pipe.xinfo_groups(scope.stream)
            pipe.xpending(scope.stream, scope.group)
            pipe.xpending_range(scope.stream, scope.group, low, "+", self.options.listing)
            return list(await pipe.execute())

    async def _orphans(self, progress: Progress) -> list[SettlementReceipt]:
        """Close the settle intents older than ``claim_idle`` whose delivery is pending for
        no worker (its consumer was deleted, or the ack's reply was lost): the provider
        answers ``not_pending`` and the receipt closes the intent."""
        stale = self.core.stale_intents(progress, self.options.claim_idle_ms)
        if not stale:
            return []
        scope = self._scope()
        rows = await self._command(
            "XPENDING", lambda client: self._pending_of(client, scope, stale)
        )
        receipts = []
        for intent, row in zip(stale, rows, strict=True):
            if not row:
                receipts.append(await self._settle_intent(progress, intent))
        return receipts

    async def _pending_of(
        self, client: Any, scope: ProviderScope, intents: list[SettleIntent]
    ) -> list[Any]:
        async with client.pipeline(transaction=False) as pipe:
            for intent in intents:
                d = intent.delivery.value
                pipe.xpending_range(scope.stream, scope.group, d, d, 1)
            return list(await pipe.execute())

    async def run(self, effect: AsyncEffect, *, polls: int | None = None) -> None:
        """Recover, then poll until ``polls`` polls are done (forever when None). A provider
        that lost the group opens a new incarnation scope; a Redis error (either server) is
        logged and the worker starts over after a pause (start, recover, poll): every step
        is safe to repeat."""
        done = 0
        started = False
        while polls is None or done < polls:
            try:
                if not started:
                    await self.start()
                    await self.recover()
                    started = True
                await self.poll(effect)
            except ProviderReset:
                started = False
            except BackendError as exc:
                self.core.log.warning(
                    "settle.progress.backend_error", worker=self.worker, error=type(exc).__name__
                )
                started = False
                await asyncio.sleep(self.options.retry_pause)
            done += 1
