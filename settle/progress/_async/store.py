"""``AsyncProgressStore``: durable delivery progress of one consumer on its own Redis.

Each method plans a call in :class:`~settle.progress.core.ProgressCore`, runs it and lets
the core decode the reply; ``apply`` adds the one ordering rule: consult progress, run the
effect, record progress, in that order."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis, RedisCluster

from settle._runtime import Call, Durability
from settle._runtime._async import AsyncConnectable, AsyncRunner
from settle.progress.core import ProgressCore, ProgressReply, StreamVerdict
from settle.progress.identity import AttemptId, DeliveryId, EmissionId, ProviderScope
from settle.progress.model import (
    Applied,
    ApplyStatus,
    EffectContext,
    IntentKind,
    Progress,
    SettlementReceipt,
)
from settle.progress.scripts import PROGRESS

__all__ = ["AsyncEffect", "AsyncProgressStore", "Observer"]

AsyncEffect = Callable[[EffectContext], Awaitable[None]]
#: Called at each step of a delivery (``effect_applied``, ``progress_recorded``, ...): for
#: metrics and tracing, and for tests that cut a worker at an exact step.
Observer = Callable[[str, DeliveryId], None]


def _noop(_step: str, _delivery: DeliveryId) -> None:
    return None


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
        self.core = ProgressCore(namespace, consumer, receipts_cap)
        self.consumer = consumer
        self.observer = observer or _noop
        self._runner = AsyncRunner(
            client, PROGRESS, Durability(min_replicas, replica_timeout, allow_eviction)
        )

    async def _progress(self, call: Call) -> ProgressReply:
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
        intent). Only the returned progress authorizes settling the delivery."""
        attempt = attempt or AttemptId.new()
        begun = await self._progress(self.core.plan_begin(scope, delivery, emission, attempt))
        log = self.core.log.bind(delivery=delivery.value, emission=emission.value)
        if begun.code == "covered":
            log.info("settle.progress.covered", by=begun.detail)
            return Applied(
                ApplyStatus.COVERED,
                delivery,
                emission,
                attempt,
                begun.progress,
                dead_lettered=begun.detail == "dead_lettered",
            )
        if begun.code == "fresh":
            context = EffectContext(self.consumer, emission, delivery, attempt, dict(fields or {}))
            await effect(context)
            self.observer("effect_applied", delivery)
        recorded = await self._progress(self.core.plan_record(scope, delivery, emission, attempt))
        self.observer("progress_recorded", delivery)
        status = ApplyStatus.APPLIED if recorded.detail == "applied" else ApplyStatus.DUPLICATE
        if recorded.code == "covered":
            status = ApplyStatus.COVERED
        log.info(f"settle.progress.{status.value}", attempt=attempt.value)
        return Applied(status, delivery, emission, attempt, recorded.progress)

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
        call = self.core.plan_dead_letter(scope, delivery, emission, reason, delivery_count)
        reply = await self._progress(call)
        self.core.log.warning(
            "settle.progress.dead_lettered",
            delivery=delivery.value,
            emission=emission.value if emission else None,
            reason=reason,
            delivery_count=delivery_count,
            outcome=reply.code,
        )
        self.observer("dead_letter_recorded", delivery)
        return reply

    async def defer(
        self, scope: ProviderScope, delivery: DeliveryId, emission: EmissionId, *, reason: str
    ) -> ProgressReply:
        """Set a delivery aside durably (unapplied) before the provider stops redelivering it."""
        reply = await self._progress(self.core.plan_defer(scope, delivery, emission, reason))
        self.core.log.info(
            "settle.progress.deferred",
            delivery=delivery.value,
            emission=emission.value,
            reason=reason,
            outcome=reply.code,
        )
        self.observer("defer_recorded", delivery)
        return reply

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
        reply = await self._progress(call)
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
        """Store the provider floor as observed; advance the floor along ``listing``."""
        call = self.core.plan_observe(
            scope,
            after,
            listing,
            last_delivered=last_delivered,
            oldest_pending=oldest_pending,
            pending=pending,
        )
        reply = await self._progress(call)
        if reply.code == "advanced":
            self.core.log.info(
                "settle.progress.floor_advanced", stream=scope.stream, floor=reply.detail
            )
        return reply.progress

    async def read(self, scope: ProviderScope) -> Progress:
        return (await self._progress(self.core.plan_read(scope))).progress

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
