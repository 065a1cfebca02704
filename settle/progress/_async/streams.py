"""``AsyncStreamConsumer``: a Redis Streams consumer-group worker with durable progress.

Per delivery: XREADGROUP (or XAUTOCLAIM of a stuck one) -> consult progress -> apply the
effect -> record progress durably -> fenced XACK -> record the receipt. The stream lives on
one Redis, progress on another (``AsyncProgressStore``); nothing is acknowledged before the
progress that covers it is durable, and a worker that no longer owns a delivery cannot
acknowledge it (the ownership check runs in the same Lua call as the XACK).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis, RedisCluster

from settle._runtime import Durability
from settle._runtime._async import AsyncRunner, client_from_url
from settle.errors import BackendError
from settle.progress._async.store import AsyncEffect, AsyncProgressStore
from settle.progress.core import Disposition, StreamEntry, parse_entries
from settle.progress.errors import DeferDelivery, ProviderReset
from settle.progress.identity import (
    AttemptId,
    DeliveryId,
    EmissionId,
    ProviderScope,
    SettlementAuthority,
)
from settle.progress.model import IntentKind, Progress, SettlementReceipt
from settle.progress.planning import authorize_individual
from settle.progress.scripts import STREAM

__all__ = ["AsyncStreamConsumer", "PollReport"]

_RELEASE_IDLE_MS = 10 * 365 * 86_400 * 1000  # released: looks idle "forever", reclaimable now


@dataclass
class PollReport:
    """What one poll did: deliveries handled, and the receipts the provider gave."""

    handled: list[DeliveryId] = field(default_factory=list)
    receipts: list[SettlementReceipt] = field(default_factory=list)


class AsyncStreamConsumer:
    """One worker of a consumer group; ``store`` holds the consumer's progress elsewhere."""

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
        self.store = store
        self.stream = stream
        self.group = group
        self.worker = worker or f"{store.consumer}-{uuid.uuid4().hex[:12]}"
        self.emission_field = emission_field
        self.max_deliveries = max_deliveries
        self.claim_idle_ms = max(1, round(claim_idle * 1000))
        self.batch = batch
        self.block_ms = max(1, round(block * 1000))
        self.listing = listing
        self.retry_pause = retry_pause
        self.core = store.core
        self.scope: ProviderScope | None = None
        #: ``min_replicas`` / ``replica_timeout`` apply to the stream's server (the store
        #: has its own for the progress server).
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
        namespace = options.pop("namespace", "default")
        store = AsyncProgressStore.from_url(progress_url, consumer=consumer, namespace=namespace)
        return cls(client_from_url(stream_url), store, **options)

    async def aclose(self) -> None:
        await self._runner.aclose()
        await self.store.aclose()

    def _scope(self) -> ProviderScope:
        if self.scope is None:
            raise ProviderReset("call start() first: the consumer has no scope yet")
        return self.scope

    async def start(self) -> ProviderScope:
        """Ensure the group exists and open the scope of the stream's current incarnation."""
        call = self.core.plan_stream_scope(self.stream, self.group)
        self.scope = self.core.decode_stream_scope(call, await self._runner.run(call))
        return self.scope

    async def poll(self, effect: AsyncEffect) -> PollReport:
        """Reclaim stuck deliveries, read new ones, handle each; then observe the provider."""
        report = PollReport()
        for entry, count in await self._claim() + await self._read():
            receipt = await self.handle(entry, count, effect)
            report.handled.append(entry.delivery)
            if receipt is not None:
                report.receipts.append(receipt)
        await self.observe()
        return report

    async def _read(self) -> list[tuple[StreamEntry, int]]:
        scope = self._scope()
        try:
            # Not repeated after a lost reply: the entries it delivered are pending for this
            # worker and come back through XAUTOCLAIM.
            raw = await self._runner.command(
                "XREADGROUP",
                lambda: self.client.xreadgroup(
                    scope.group,
                    self.worker,
                    {scope.stream: ">"},
                    count=self.batch,
                    block=self.block_ms,
                ),
                repeatable=False,
            )
        except BackendError as exc:
            raise self.core.stream_failure(exc, scope) from exc
        streams: list[Any] = list(raw or [])
        entries = [e for _, batch in streams for e in parse_entries(batch)]
        for entry in entries:
            self.store.observer("received", entry.delivery)
        return [(e, 1) for e in entries]

    async def _claim(self) -> list[tuple[StreamEntry, int]]:
        scope = self._scope()
        try:
            raw = await self._runner.command(
                "XAUTOCLAIM",
                lambda: self.client.xautoclaim(
                    scope.stream, scope.group, self.worker, self.claim_idle_ms, "0-0", self.batch
                ),
            )
            entries = parse_entries(raw[1])
            if not entries:
                return []
            pending = await self._runner.command(
                "XPENDING",
                lambda: self.client.xpending_range(
                    scope.stream,
                    scope.group,
                    min=entries[0].delivery.value,
                    max=entries[-1].delivery.value,
                    count=len(entries) * 4 + 16,
                    consumername=self.worker,
                ),
            )
        except BackendError as exc:
            raise self.core.stream_failure(exc, scope) from exc
        counts = {DeliveryId(_s(p["message_id"])): int(p["times_delivered"]) for p in pending}
        out = [(e, counts.get(e.delivery, 0)) for e in entries if e.delivery in counts]
        for entry, _ in out:
            self.store.observer("claimed", entry.delivery)
        return out

    async def handle(
        self, entry: StreamEntry, delivery_count: int, effect: AsyncEffect
    ) -> SettlementReceipt | None:
        """Handle one delivery this worker holds at ``delivery_count``."""
        scope = self._scope()
        delivery = entry.delivery
        authority = SettlementAuthority(self.worker, delivery, delivery_count)
        disposition, emission = self.core.disposition(
            entry, delivery_count, self.emission_field, self.max_deliveries
        )
        if disposition is not Disposition.APPLY or emission is None:
            reason = "malformed" if disposition is Disposition.MALFORMED else "delivery_limit"
            reply = await self.store.dead_letter(
                scope, delivery, emission, reason=reason, delivery_count=delivery_count
            )
            if reply.code == "dead_lettered":
                return await self.settle(authority, IntentKind.DEAD_LETTER, emission, reason)
            # Progress already covers it (applied before it went bad): settle it as applied.
            authorize_individual(reply.progress, delivery)
            return await self.settle(authority, IntentKind.ACK, emission)
        attempt = AttemptId.new()
        try:
            applied = await self.store.apply(
                scope, delivery, emission, effect, attempt=attempt, fields=entry.fields
            )
        except DeferDelivery as signal:
            reply = await self.store.defer(scope, delivery, emission, reason=signal.reason)
            if reply.code != "deferred":
                return None
            return await self.settle(authority, IntentKind.DEFER, emission, signal.reason)
        except ProviderReset:
            raise
        except Exception as exc:  # noqa: BLE001 - the effect failed: negative settlement
            self.core.log.warning(
                "settle.progress.effect_failed",
                delivery=delivery.value,
                emission=emission.value,
                error_type=type(exc).__name__,
                delivery_count=delivery_count,
            )
            return await self.settle(authority, IntentKind.RELEASE, emission, "effect_failed")
        if applied.dead_lettered:
            return await self.settle(authority, IntentKind.DEAD_LETTER, emission, "dead_letter")
        authorize_individual(applied.progress, delivery)
        return await self.settle(authority, IntentKind.ACK, emission)

    async def settle(
        self,
        authority: SettlementAuthority,
        kind: IntentKind,
        emission: EmissionId | None = None,
        reason: str = "",
        *,
        fenced_count: bool = True,
    ) -> SettlementReceipt:
        """One fenced settlement on the stream's server, then its receipt in progress."""
        scope = self._scope()
        call = self.core.plan_stream_settle(
            scope,
            authority,
            kind,
            fenced_count=fenced_count,
            emission=emission,
            reason=reason,
            release_idle_ms=_RELEASE_IDLE_MS,
        )
        verdict = self.core.decode_stream_settle(call, await self._runner.run(call))
        self.store.observer("provider_answered", authority.delivery)
        receipt = await self.store.record_receipt(
            scope, authority.delivery, kind, verdict, self.worker
        )
        self.core.check_group(verdict, scope)
        return receipt

    async def recover(self) -> list[SettlementReceipt]:
        """Finish the settle intents progress still holds (the "progress recorded,
        acknowledgement lost" cut): an intent whose delivery is no longer pending is closed;
        one this worker owns is settled; one owned by another worker is left to XAUTOCLAIM."""
        progress = await self.store.read(self._scope())
        receipts = []
        for intent in progress.intents:
            authority = SettlementAuthority(self.worker, intent.delivery, 0)
            receipts.append(
                await self.settle(authority, intent.kind, intent.emission, fenced_count=False)
            )
        return receipts

    async def observe(self) -> Progress:
        """Read the provider's floor and a listing after the progress floor; advance it."""
        scope = self._scope()
        progress = await self.store.read(scope)
        after = progress.floor
        try:
            listed, groups, summary = await self._runner.command(
                "XRANGE", lambda: self._listing(scope, after)
            )
        except BackendError as exc:
            raise self.core.stream_failure(exc, scope) from exc
        info = next((g for g in groups if _s(g["name"]) == scope.group), None)
        last = _s(info["last-delivered-id"]) if info else ""
        oldest = _s(summary.get("min") or "")
        return await self.store.observe(
            scope,
            after,
            [e.delivery for e in parse_entries(listed)],
            last_delivered=DeliveryId(last) if last and last != "0-0" else None,
            oldest_pending=DeliveryId(oldest) if oldest else None,
            pending=int(summary.get("pending") or 0),
        )

    async def _listing(self, scope: ProviderScope, after: DeliveryId | None) -> list[Any]:
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.xrange(scope.stream, f"({after.value}" if after else "-", "+", self.listing)
            pipe.xinfo_groups(scope.stream)
            pipe.xpending(scope.stream, scope.group)
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
                    "settle.progress.backend_error", worker=self.worker, error=str(exc)[:200]
                )
                started = False
                await asyncio.sleep(self.retry_pause)
            done += 1


def _s(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
