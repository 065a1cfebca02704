"""A delivery another worker dead-letters while this worker's effect for it runs: ``apply``
returns ``COVERED`` (the delivery is resolved as dead-lettered, not applied) and must say so
with ``Applied.dead_lettered``, as it does when ``begin`` finds the dead letter (found in a
hunt: ``record`` finding the dead letter left ``dead_lettered`` False, so a caller that
settles from ``apply``'s answer acknowledged a dead-lettered delivery as applied)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from settle.embedded import EmbeddedRedis
from settle.progress import (
    ApplyStatus,
    AsyncProgressStore,
    DeliveryId,
    EmissionId,
    ProgressStore,
    ProviderScope,
    StreamConsumer,
)
from settle.progress.models import SettlementOutcome
from tests.progress.harness import dead_letters_on_stream, pending_ids, publish


def _scope(names: Any) -> ProviderScope:
    return ProviderScope(names.stream, names.group, "inc1")


def test_dead_lettered_meanwhile_is_reported(progress_server: EmbeddedRedis, names: Any) -> None:
    a = ProgressStore.from_url(progress_server.url, consumer=names.consumer, namespace="t")
    b = ProgressStore.from_url(progress_server.url, consumer=names.consumer, namespace="t")
    scope, delivery, emission = _scope(names), DeliveryId("5-1"), EmissionId("e1")
    ran: list[str] = []

    def effect(ctx: Any) -> None:
        # While this effect runs, another worker dead-letters the delivery (over its limit).
        b.dead_letter(scope, delivery, emission, reason="delivery_limit", delivery_count=6)
        ran.append(ctx.emission.value)

    with a, b:
        applied = a.apply(scope, delivery, emission, effect)
        assert ran == ["e1"]
        assert applied.status is ApplyStatus.COVERED
        assert applied.dead_lettered is True
        assert delivery in applied.progress.dead_lettered_above_floor
        # The answer agrees with a second apply, which finds the dead letter at begin.
        again = a.apply(scope, delivery, emission, lambda ctx: ran.append("again"))
        assert (again.status, again.dead_lettered) == (ApplyStatus.COVERED, True)
        assert ran == ["e1"]


@pytest.mark.asyncio
async def test_dead_lettered_meanwhile_is_reported_async(
    progress_server: EmbeddedRedis, names: Any
) -> None:
    a = AsyncProgressStore(
        aioredis.Redis.from_url(progress_server.url), consumer=names.consumer, namespace="t"
    )
    b = redis.Redis.from_url(progress_server.url)
    other = ProgressStore(b, consumer=names.consumer, namespace="t")
    scope, delivery, emission = _scope(names), DeliveryId("5-1"), EmissionId("e1")
    ran: list[str] = []

    async def effect(ctx: Any) -> None:
        other.dead_letter(scope, delivery, emission, reason="delivery_limit", delivery_count=6)
        ran.append(ctx.emission.value)

    try:
        applied = await a.apply(scope, delivery, emission, effect)
        assert ran == ["e1"]
        assert (applied.status, applied.dead_lettered) == (ApplyStatus.COVERED, True)
    finally:
        await a.aclose()
        other.close()


@pytest.mark.parametrize("when", ["during_the_effect", "before_the_poll"])
def test_a_worker_that_still_owns_it_settles_it_as_a_dead_letter(
    when: str,
    stream_server: EmbeddedRedis,
    progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    names: Any,
) -> None:
    """Dead-lettered by hand (``store.dead_letter``) while the owning worker's effect runs,
    or before the worker consults progress: the worker tells the provider a dead letter with
    the reason progress recorded (the stream-side dead-letter stream gets it, and the
    dead-letter intent is closed), not an acknowledgement of an applied one."""
    [delivery] = publish(stream_client, names, ["e1"])
    operator = ProgressStore.from_url(
        progress_server.url, consumer=names.consumer, namespace=names.namespace
    )
    worker = StreamConsumer(
        redis.Redis.from_url(stream_server.url),
        ProgressStore.from_url(
            progress_server.url, consumer=names.consumer, namespace=names.namespace
        ),
        stream=names.stream,
        group=names.group,
        worker="w1",
        block=0.01,
    )
    worker.start()
    scope = worker.scope
    assert scope is not None

    def by_hand() -> None:
        operator.dead_letter(
            scope, DeliveryId(delivery), EmissionId("e1"), reason="by_hand", delivery_count=1
        )

    ran: list[str] = []

    def effect(ctx: Any) -> None:
        ran.append(ctx.emission.value)
        if when == "during_the_effect":
            by_hand()

    if when == "before_the_poll":
        by_hand()

    with operator, worker:
        report = worker.poll(effect)
        assert [r.outcome for r in report.receipts] == [SettlementOutcome.ACKED]
        [dead] = dead_letters_on_stream(stream_client, names)
        # The stream-side entry names the delivery and the reason progress recorded.
        assert (dead["delivery"], dead["reason"]) == (delivery, "by_hand")
        progress = worker.store.read(scope)
        assert progress.intents == ()
        assert pending_ids(stream_client, names) == {}
    assert ran == ([] if when == "before_the_poll" else ["e1"])


def test_a_delivery_dead_lettered_by_hand_then_over_the_limit_keeps_its_reason(
    stream_server: EmbeddedRedis,
    progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    names: Any,
) -> None:
    """Dead-lettered by hand while its worker was gone; the worker that reclaims it finds it
    over ``max_deliveries``: the stream-side entry carries the reason progress recorded
    (``by_hand``, what ``recover()`` would write), not ``delivery_limit`` (reviewed: only
    the apply path had been made to write the recorded reason)."""
    [delivery] = publish(stream_client, names, ["e1"])
    own = {"consumer": names.consumer, "namespace": names.namespace}
    worker = StreamConsumer(
        redis.Redis.from_url(stream_server.url),
        ProgressStore.from_url(progress_server.url, **own),
        stream=names.stream,
        group=names.group,
        worker="w1",
        block=0.01,
        claim_idle=0.2,
        max_deliveries=1,
    )
    operator = ProgressStore.from_url(progress_server.url, **own)
    with operator, worker:
        scope = worker.start()
        stream_client.xreadgroup(names.group, "w0", {names.stream: ">"})  # w0 dies with it
        operator.dead_letter(
            scope, DeliveryId(delivery), EmissionId("e1"), reason="by_hand", delivery_count=1
        )
        time.sleep(0.3)
        report = worker.poll(lambda ctx: None)
        assert [r.outcome for r in report.receipts] == [SettlementOutcome.ACKED]
        [dead] = dead_letters_on_stream(stream_client, names)
        assert (dead["delivery"], dead["reason"], dead["deliveries"]) == (delivery, "by_hand", "2")
        assert worker.store.read(scope).intents == ()
