"""A ``record`` whose reply was lost (a real connection cut by a proxy) is repeated by the
runtime; the repeat finds the delivery applied, by its own first try. ``apply`` reported
``ApplyStatus.COVERED`` ("progress already covered this delivery: no effect ran") and
logged ``settle.progress.covered``, of an effect it had just run: a caller counting the
effects it ran, or acting on ``APPLIED``, missed it. The repeat of the same attempt's
record is its own record: ``APPLIED``, logged ``settle.progress.applied``. Sync and async."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

from settle.embedded import EmbeddedRedis
from settle.progress import (
    ApplyStatus,
    AsyncProgressStore,
    DeliveryId,
    EffectContext,
    EmissionId,
    ProgressStore,
    ProviderScope,
)
from settle.progress._scripts import PROGRESS
from tests.faults.servers import async_client, proxy_to, script_needle, sync_client
from tests.faults.tcp_proxy import FaultyProxy
from tests.integration.conftest import Awaitable
from tests.progress.harness import Names, publish
from tests.progress.test_consumer import make

pytestmark = [pytest.mark.faults]


@pytest.fixture
def progress_proxy(progress_server: EmbeddedRedis) -> Iterator[FaultyProxy]:
    running = proxy_to(progress_server.url, PROGRESS)
    yield running
    running.close()


def through(proxy: FaultyProxy, names: Names, flavour: str) -> Any:
    """A progress store of ``flavour`` whose connections go through ``proxy`` (the sync one
    presented with coroutine methods, so that one test body serves both)."""
    options: dict[str, Any] = {"consumer": names.consumer, "namespace": names.namespace}
    if flavour == "sync":
        return Awaitable(ProgressStore(sync_client(proxy.port), **options))
    return AsyncProgressStore(async_client(proxy.port), **options)


@pytest.mark.asyncio
@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("at", ["after_request", "mid_reply"])
async def test_a_record_repeated_after_its_lost_reply_reports_the_effect_applied(
    flavour: str, at: str, progress_proxy: FaultyProxy, names: Names
) -> None:
    ran: list[str] = []

    def effect(ctx: EffectContext) -> None:
        ran.append(ctx.emission.value)

    async def aeffect(ctx: EffectContext) -> None:
        effect(ctx)

    store = through(progress_proxy, names, flavour)
    scope = ProviderScope(names.stream, names.group, "i1")
    try:
        progress_proxy.cut(script_needle(PROGRESS, "record"), at)  # type: ignore[arg-type]
        with capture_logs() as logs:
            applied = await store.apply(
                scope,
                DeliveryId("1-1"),
                EmissionId("order-1"),
                effect if flavour == "sync" else aeffect,
            )
        assert progress_proxy.fired == [at]
        assert ran == ["order-1"]
        assert applied.status is ApplyStatus.APPLIED
        assert DeliveryId("1-1") in applied.progress.applied_above_floor or (
            applied.progress.floor == DeliveryId("1-1")
        )
        events = [e["event"] for e in logs if e["event"].startswith("settle.progress.")]
        assert "settle.progress.applied" in events
        assert "settle.progress.covered" not in events
        # A later apply of the same delivery is covered, and runs nothing.
        again = await store.apply(
            scope,
            DeliveryId("1-1"),
            EmissionId("order-1"),
            effect if flavour == "sync" else aeffect,
        )
        assert again.status is ApplyStatus.COVERED
        assert ran == ["order-1"]
    finally:
        await store.close()


def test_a_worker_whose_claim_lapsed_reports_the_effect_it_ran(
    names: Names, stream_server: EmbeddedRedis, progress_server: EmbeddedRedis
) -> None:
    """Real threads: worker A's effect outlasts ``claim_idle``, worker B takes the delivery
    over, applies and records it; A's record then finds it applied. A's effect ran (the
    second run, under the same idempotency key): it was logged ``settle.progress.covered``,
    "no effect ran". Both are ``settle.progress.applied`` now; B's acknowledgement
    settles it and A's settles nothing."""
    a = make(names, stream_server, progress_server, worker="A", claim_idle=0.2)
    b = make(names, stream_server, progress_server, worker="B", claim_idle=0.2)
    publish(redis.Redis.from_url(stream_server.url), names, ["slow"])
    ran: list[str] = []
    a_runs, b_done = threading.Event(), threading.Event()

    def effect(ctx: EffectContext) -> None:
        ran.append(threading.current_thread().name)
        if threading.current_thread().name == "A":
            a_runs.set()
            # A's effect lasts until B has taken the delivery over, run, recorded and
            # acknowledged it, so A's record comes after B's: a fixed 0.8 s ended first when
            # a loaded machine started B's poll late (B found it acked).
            assert b_done.wait(30), "worker B's poll never returned"

    def b_poll() -> None:
        try:
            b.poll(effect)
        finally:
            b_done.set()

    with capture_logs() as logs:
        ta = threading.Thread(target=a.poll, args=(effect,), name="A")
        ta.start()
        # B polls once A holds the delivery (a fixed 0.4 s from A's start let B read it
        # first when a loaded machine started A's poll late), and past claim_idle: the
        # sleep is a lower bound of the delivery's idle time, however late B then runs.
        assert a_runs.wait(30), "worker A never ran the delivery"
        time.sleep(0.4)
        tb = threading.Thread(target=b_poll, name="B")
        tb.start()
        ta.join()
        tb.join()
    assert sorted(ran) == ["A", "B"]
    events = [e["event"] for e in logs if e["event"] in PROGRESS_APPLY_EVENTS]
    assert events == ["settle.progress.applied", "settle.progress.applied"]
    settles = {"settle.progress.settled", "settle.progress.settled_already"}
    settles.add("settle.progress.settle_refused")
    settled = {e["worker"]: e["outcome"] for e in logs if e["event"] in settles}
    assert settled["B"] == "acked"
    assert settled["A"] in ("not_pending", "not_owner", "reclaimed")  # A settles nothing
    a.close()
    b.close()


PROGRESS_APPLY_EVENTS = {
    "settle.progress.applied",
    "settle.progress.duplicate",
    "settle.progress.covered",
}


@pytest.mark.asyncio
@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_duplicate_whose_record_reply_was_lost_is_still_a_duplicate(
    flavour: str, progress_proxy: FaultyProxy, names: Names
) -> None:
    """A second delivery of an emission applied under another one runs no effect: its
    ``record`` (reply lost, repeated by the runtime) meets its own first try. It is
    ``DUPLICATE`` (no effect ran, the emission was applied as 1-1), as it is when the reply
    arrives; it was ``COVERED``."""
    ran: list[str] = []

    def effect(ctx: EffectContext) -> None:
        ran.append(ctx.delivery.value)

    async def aeffect(ctx: EffectContext) -> None:
        effect(ctx)

    store = through(progress_proxy, names, flavour)
    scope = ProviderScope(names.stream, names.group, "i1")
    run = effect if flavour == "sync" else aeffect
    try:
        first = await store.apply(scope, DeliveryId("1-1"), EmissionId("order-1"), run)
        assert first.status is ApplyStatus.APPLIED
        progress_proxy.cut(script_needle(PROGRESS, "record"), "mid_reply")  # type: ignore[arg-type]
        with capture_logs() as logs:
            second = await store.apply(scope, DeliveryId("1-2"), EmissionId("order-1"), run)
        assert progress_proxy.fired == ["mid_reply"]
        assert ran == ["1-1"]  # no second effect
        assert second.status is ApplyStatus.DUPLICATE
        events = [e["event"] for e in logs if e["event"] in PROGRESS_APPLY_EVENTS]
        assert events == ["settle.progress.duplicate"]
    finally:
        await store.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_an_effect_whose_delivery_was_dead_lettered_meanwhile_is_covered(
    flavour: str, progress_server: EmbeddedRedis, names: Names
) -> None:
    """The one ``COVERED`` after an effect ran (docs/delivery-progress.md): another worker
    dead-lettered the delivery while the effect ran."""
    options: dict[str, Any] = {"consumer": names.consumer, "namespace": names.namespace}
    other = ProgressStore.from_url(progress_server.url, **options)
    if flavour == "sync":
        store: Any = Awaitable(ProgressStore.from_url(progress_server.url, **options))
    else:
        store = AsyncProgressStore.from_url(progress_server.url, **options)
    scope = ProviderScope(names.stream, names.group, "i1")
    ran: list[str] = []

    def effect(ctx: EffectContext) -> None:
        ran.append(ctx.delivery.value)
        other.dead_letter(
            scope, ctx.delivery, ctx.emission, reason="max_deliveries", delivery_count=3
        )

    async def aeffect(ctx: EffectContext) -> None:
        effect(ctx)

    try:
        with capture_logs() as logs:
            applied = await store.apply(
                scope,
                DeliveryId("1-1"),
                EmissionId("order-1"),
                effect if flavour == "sync" else aeffect,
            )
        assert ran == ["1-1"]
        assert applied.status is ApplyStatus.COVERED
        events = [e["event"] for e in logs if e["event"] in PROGRESS_APPLY_EVENTS]
        assert events == ["settle.progress.covered"]
    finally:
        await store.close()
        other.close()
