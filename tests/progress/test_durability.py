"""Durability and transient faults of delivery progress, on the core's Redis runtime (SPEC 4,
SPEC 11): ``min_replicas`` against a real primary + replica (an apply and its stream
settlement return once the replica holds them; a frozen or killed replica turns the first
write into a ``DurabilityError`` before any effect runs), and connection-cutting proxies in
front of the progress server and the stream server (a cut call is repeated and the poll ends
as it would have without the cut; a server that stays away is a ``BackendError``).

Sync and async shells alike.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from structlog.testing import capture_logs

from settle import BackendError, ConfigurationError, DurabilityError, SettleError
from settle._runtime.transient import ATTEMPTS
from settle.embedded import EmbeddedRedis
from settle.progress import (
    ApplyStatus,
    AsyncProgressStore,
    AsyncStreamConsumer,
    DeliveryId,
    EffectContext,
    EmissionId,
    PollReport,
    ProgressStore,
    StreamConsumer,
)
from settle.progress._keys import StreamKeys
from settle.progress._scripts import PROGRESS, STREAM
from settle.progress.models import SettlementOutcome
from tests.faults.figures import FIGURES
from tests.faults.servers import (
    REPLICA_TIMEOUT,
    SLACK,
    UNSTALLED_TIMEOUT,
    async_client,
    cut_timeout,
    frozen,
    proxy_to,
    replica_of,
    script_needle,
    sync_client,
    wait_replicas,
)
from tests.faults.tcp_proxy import FaultyProxy
from tests.integration.conftest import Awaitable
from tests.progress.harness import (
    Names,
    assert_nothing_acked_uncovered,
    pending_ids,
    progress_covers,
    publish,
    receipts,
)
from tests.stopwatch import Stopwatch

pytestmark = [pytest.mark.asyncio, pytest.mark.faults]


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Shell:
    """One flavour's store and stream consumer, both driven with ``await``; the effect
    records each emission it is run for."""

    def __init__(self, flavour: str, store: Any, consumer: Any) -> None:
        self.flavour = flavour
        self.store = store if flavour == "async" else Awaitable(store)
        self.consumer = consumer if flavour == "async" else Awaitable(consumer)
        self.effects: list[str] = []

    def effect(self) -> Any:
        def run(ctx: EffectContext) -> None:
            self.effects.append(ctx.emission.value)

        async def arun(ctx: EffectContext) -> None:
            run(ctx)

        return run if self.flavour == "sync" else arun

    async def poll(self) -> PollReport:
        report: PollReport = await self.consumer.poll(self.effect())
        return report


@asynccontextmanager
async def shell(
    flavour: str,
    stream: str | int,
    progress: str | int,
    names: Names,
    *,
    stream_waits: bool = True,
    socket_timeout: float = UNSTALLED_TIMEOUT,
    **durability: Any,
) -> AsyncIterator[Shell]:
    """A store and a consumer connected with ``from_url`` (a URL) or through clients with
    redis-py's retries off and ``socket_timeout`` (a proxy's port); ``durability`` goes to
    the store, and to the consumer (the stream's server) too unless ``stream_waits`` is
    false."""
    options: dict[str, Any] = {"consumer": names.consumer, "namespace": names.namespace}
    worker: dict[str, Any] = {
        "stream": names.stream,
        "group": names.group,
        "worker": "w1",
        "block": 0.01,
        "claim_idle": 0.05,
        **(durability if stream_waits else {}),
    }
    if flavour == "sync":
        store = (
            ProgressStore.from_url(progress, **options, **durability)
            if isinstance(progress, str)
            else ProgressStore(sync_client(progress, socket_timeout), **options, **durability)
        )
        client = (
            redis.Redis.from_url(stream)
            if isinstance(stream, str)
            else sync_client(stream, socket_timeout)
        )
        consumer = StreamConsumer(client, store, **worker)
        try:
            yield Shell(flavour, store, consumer)
        finally:
            consumer.close()  # and its store
        return
    astore = (
        AsyncProgressStore.from_url(progress, **options, **durability)
        if isinstance(progress, str)
        else AsyncProgressStore(async_client(progress, socket_timeout), **options, **durability)
    )
    aclient = (
        aioredis.Redis.from_url(stream)
        if isinstance(stream, str)
        else async_client(stream, socket_timeout)
    )
    aconsumer = AsyncStreamConsumer(aclient, astore, **worker)
    try:
        yield Shell(flavour, astore, aconsumer)
    finally:
        await aconsumer.aclose()  # and its store


def stored(server: EmbeddedRedis, names: Names) -> dict[bytes, Any]:
    """Every key of the consumer's progress and of the stream's settlement, read from
    ``server`` itself (not through settle)."""
    with redis.Redis.from_url(server.url) as raw:
        keys = [
            *raw.scan_iter(match=f"settle:{{{names.namespace}:progress:{names.consumer}}}*"),
            *(k.encode() for k in (StreamKeys(names.stream).incarnation, names.stream)),
        ]
        out: dict[bytes, Any] = {}
        for key in keys:
            kind = raw.type(key)
            if kind == b"hash":
                out[key] = raw.hgetall(key)
            elif kind == b"stream":
                out[key] = raw.xrange(key)
            elif kind == b"string":
                out[key] = raw.get(key)
            else:
                out[key] = kind
        out[b"pending"] = pending_ids(raw, names)
        return out


def holds(state: dict[bytes, Any], earlier: dict[bytes, Any]) -> bool:
    """Whether ``state`` still holds everything of ``earlier`` (later writes may add more:
    hashes gain fields, streams entries; a pending entry may have been settled since)."""
    for key, value in earlier.items():
        if key == b"pending":
            continue
        if isinstance(value, dict):
            if any(
                state[key].get(k) != v
                for k, v in value.items()
                if k not in (b"ver", b"updated", b"pf_at")
            ):
                return False
        elif isinstance(value, list):
            if not set(map(str, value)) <= set(map(str, state[key])):
                return False
        elif state.get(key) != value:
            return False
    return True


def durable() -> dict[str, Any]:
    return {"min_replicas": 1, "replica_timeout": REPLICA_TIMEOUT}


def backend_events(logs: list[dict[str, Any]]) -> list[str]:
    return [e["event"] for e in logs if e["event"].startswith("settle.backend")]


# -- min_replicas against a real primary + replica ------------------------------------------


async def test_an_apply_and_its_settlement_return_once_the_replica_holds_them(
    flavour: str, primary: EmbeddedRedis, replica: EmbeddedRedis, names: Names
) -> None:
    with redis.Redis.from_url(primary.url) as producer, redis.Redis.from_url(replica.url) as rep:
        async with shell(flavour, primary.url, primary.url, names, **durable()) as s:
            scope = await s.consumer.start()
            [first, *_] = publish(producer, names, ["e1", "e2", "e3"])

            # An apply on its own: its progress is on the replica when it returns.
            applied = await s.store.apply(scope, DeliveryId(first), EmissionId("e1"), s.effect())
            assert applied.status is ApplyStatus.APPLIED
            assert progress_covers(rep, names, first)
            assert s.effects == ["e1"]

            started = time.perf_counter()
            report = await s.poll()
            FIGURES[f"progress poll of 3 deliveries + WAIT 1 replica ({flavour}, loopback)"] = (
                f"{(time.perf_counter() - started) * 1000:.1f} ms"
            )
            assert [r.outcome for r in report.receipts] == [SettlementOutcome.ACKED] * 3
            assert s.effects == ["e1", "e2", "e3"]  # e1 covered already: not run again
            # Progress, the receipts and the acknowledgements: all on the replica when poll()
            # returned, exactly as the primary holds them.
            assert stored(replica, names) == stored(primary, names)
            assert pending_ids(rep, names) == {}
            assert_nothing_acked_uncovered(rep, rep, names)


@pytest.mark.parametrize("how", ["frozen", "killed"])
async def test_a_replica_that_does_not_acknowledge_turns_the_first_write_into_a_durability_error(
    flavour: str, how: str, primary: EmbeddedRedis, replica: EmbeddedRedis, names: Names
) -> None:
    with redis.Redis.from_url(primary.url) as producer:
        async with shell(flavour, primary.url, primary.url, names, **durable()) as s:
            await s.consumer.start()
            publish(producer, names, ["e1", "e2", "e3"])
            await s.poll()
            returned = stored(primary, names)
            [late] = publish(producer, names, ["e4"])

            with ExitStack() as stopped:
                if how == "frozen":
                    stopped.enter_context(frozen(replica))
                else:
                    replica.close()
                    wait_replicas(primary, 0)
                clock = Stopwatch()
                with capture_logs() as logs, pytest.raises(DurabilityError) as info:
                    await s.poll()
                elapsed = clock.elapsed()
                unloaded = clock.unloaded()  # less the time waiting for a CPU
                # Reading progress never waits.
                assert not (await s.store.read(s.consumer.scope)).covers(DeliveryId(late))
            FIGURES[f"progress apply with the replica {how} ({flavour}, replica_timeout=0.3 s)"] = (
                f"{elapsed * 1000:.0f} ms, then DurabilityError"
            )

            err = info.value
            # The first write of the delivery (consulting progress) waited replica_timeout,
            # once, and said so; the effect did not run.
            # (The upper bound is on the time this test was not kept waiting for a CPU: four
            # tries take 4 x 0.3 s of it, however loaded the machine.)
            assert elapsed >= REPLICA_TIMEOUT
            assert unloaded < REPLICA_TIMEOUT + SLACK
            assert (err.operation_id, err.acknowledged, err.required) == (names.consumer, 0, 1)
            assert "begin: 0 of 1 replicas acknowledged within 300 ms" in str(err)
            assert "uncertain" in str(err)
            assert backend_events(logs) == ["settle.backend.durability_failed"]
            assert s.effects == ["e1", "e2", "e3"]

            if how == "killed":
                replica = replica_of(primary)
            wait_replicas(primary, 1)
            try:
                # Nothing that returned is lost: the replica holds all of the first poll.
                assert holds(stored(replica, names), returned)
                # The next poll reclaims the delivery, runs its effect once and settles it.
                await asyncio.sleep(0.1)  # past claim_idle
                report = await s.poll()
                assert [(r.delivery.value, r.outcome) for r in report.receipts] == [
                    (late, SettlementOutcome.ACKED)
                ]
                assert s.effects == ["e1", "e2", "e3", "e4"]
                assert stored(replica, names) == stored(primary, names)
                with redis.Redis.from_url(replica.url) as rep:
                    assert pending_ids(rep, names) == {}
                    assert_nothing_acked_uncovered(rep, rep, names)
            finally:
                if how == "killed":
                    replica.close()


async def test_a_progress_durability_error_is_not_taken_for_a_failed_effect(
    flavour: str,
    primary: EmbeddedRedis,
    replica: EmbeddedRedis,
    stream_server: EmbeddedRedis,
    stream_client: redis.Redis,
    names: Names,
) -> None:
    """Progress on a replicated server, the stream on another without replicas (so only the
    store waits): a progress write that is not acknowledged reaches the caller. It was once
    logged as the effect's failure and the delivery released on the stream, and poll()
    returned as if nothing had happened."""
    async with shell(
        flavour, stream_server.url, primary.url, names, stream_waits=False, **durable()
    ) as s:
        await s.consumer.start()
        [delivery] = publish(stream_client, names, ["e1"])
        with frozen(replica), capture_logs() as logs, pytest.raises(DurabilityError) as info:
            await s.poll()
        assert "begin: 0 of 1 replicas acknowledged" in str(info.value)
        assert s.effects == []
        assert "settle.progress.effect_failed" not in [e["event"] for e in logs]
        # Still pending for this worker, as handed: neither released nor settled.
        assert pending_ids(stream_client, names) == {delivery: ("w1", 1)}
        assert [e["event"] for e in logs if e["event"].startswith("settle.progress.settle")] == []
        # The worker loop starts over after a BackendError, not after a DurabilityError.
        await asyncio.sleep(0.1)  # past claim_idle
        with frozen(replica), pytest.raises(DurabilityError):
            await s.consumer.run(s.effect(), polls=3)
        assert s.effects == []
        wait_replicas(primary, 1)
        await asyncio.sleep(0.1)  # past claim_idle
        report = await s.poll()
        assert [r.outcome for r in report.receipts] == [SettlementOutcome.ACKED]
        assert s.effects == ["e1"]


async def test_from_urls_gives_both_servers_the_durability_options(
    flavour: str, primary: EmbeddedRedis, replica: EmbeddedRedis, names: Names
) -> None:
    """``from_urls`` builds the store with ``ProgressStore.from_url``: ``min_replicas`` must
    reach it too, or progress (the write that authorizes every acknowledgement) would be the
    one write that is not waited for."""
    consumer_type = StreamConsumer if flavour == "sync" else AsyncStreamConsumer
    consumer = consumer_type.from_urls(
        primary.url,
        primary.url,
        consumer=names.consumer,
        namespace=names.namespace,
        stream=names.stream,
        group=names.group,
        **durable(),
    )
    api = consumer if flavour == "async" else Awaitable(consumer)
    ran: list[str] = []

    def effect(ctx: EffectContext) -> None:
        ran.append(ctx.emission.value)

    async def aeffect(ctx: EffectContext) -> None:
        effect(ctx)

    try:
        scope = await api.start()
        with redis.Redis.from_url(primary.url) as producer:
            [delivery] = publish(producer, names, ["x"])
        with frozen(replica), pytest.raises(DurabilityError) as info:
            await api.store.apply(
                scope,
                DeliveryId(delivery),
                EmissionId("x"),
                effect if flavour == "sync" else aeffect,
            )
        assert info.value.operation_id == names.consumer
        assert ran == []  # progress was not known to be durable: the effect never ran
    finally:
        await (api.aclose() if flavour == "async" else api.close())


@pytest.mark.parametrize(
    "option",
    [
        {"min_replicas": -1},
        {"min_replicas": 1.5},
        {"min_replicas": True},
        {"replica_timeout": 0},
        {"replica_timeout": -1.0},
        {"replica_timeout": "1"},
    ],
)
async def test_a_bad_durability_option_is_a_configuration_error(
    option: dict[str, Any], progress_server: EmbeddedRedis, names: Names
) -> None:
    for store_type in (ProgressStore, AsyncProgressStore):
        with pytest.raises(ConfigurationError) as info:
            store_type.from_url(progress_server.url, consumer=names.consumer, **option)
        assert isinstance(info.value, SettleError)
        assert next(iter(option)) in str(info.value)
    with (
        ProgressStore.from_url(progress_server.url, consumer=names.consumer) as store,
        redis.Redis.from_url(progress_server.url) as client,
        pytest.raises(ConfigurationError),
    ):
        StreamConsumer(client, store, stream=names.stream, group=names.group, **option)


# -- connections cut by proxies in front of both servers ---------------------------------------


@pytest.fixture
def stream_proxy(stream_server: EmbeddedRedis) -> Iterator[FaultyProxy]:
    running = proxy_to(stream_server.url, STREAM)
    yield running
    running.close()


@pytest.fixture
def progress_proxy(progress_server: EmbeddedRedis) -> Iterator[FaultyProxy]:
    running = proxy_to(progress_server.url, PROGRESS)
    yield running
    running.close()


def retried(logs: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(e["script"], e["attempt"]) for e in logs if e["event"] == "settle.backend.retrying"]


@pytest.mark.parametrize("at", ["before_request", "after_request", "mid_reply", "stall"])
@pytest.mark.parametrize(
    "script", ["begin", "record", "receipt", "observe", "stream_scope", "stream_settle"]
)
async def test_a_cut_write_is_repeated_and_the_poll_ends_as_without_the_cut(
    flavour: str,
    script: str,
    at: str,
    stream_proxy: FaultyProxy,
    progress_proxy: FaultyProxy,
    stream_client: redis.Redis,
    progress_client: redis.Redis,
    names: Names,
) -> None:
    scripts, proxy = (STREAM, stream_proxy) if script in STREAM else (PROGRESS, progress_proxy)
    timeout = cut_timeout(at)  # a call of a loaded worker held past 0.5 s was repeated too
    async with shell(
        flavour, stream_proxy.port, progress_proxy.port, names, socket_timeout=timeout
    ) as s:
        proxy.cut(script_needle(scripts, script), at)  # type: ignore[arg-type]
        with capture_logs() as logs:
            scope = await s.consumer.start()
            ids = publish(stream_client, names, ["e1", "e2", "e3"])
            report = await s.poll()
        assert proxy.fired == [at]
        # Which call met which error, should another call than the cut one be retried.
        why = [(e["script"], e["error"], e["sleep"]) for e in logs if "error" in e]
        assert retried(logs) == [(script, 1)], why
        # Each effect ran once, each delivery is acknowledged and covered by progress, no
        # settle intent is left open, and the floor passed all three.
        assert s.effects == ["e1", "e2", "e3"]
        assert [d.value for d in report.handled] == ids
        outcomes = [r.outcome for r in report.receipts]
        if script == "stream_settle" and at != "before_request":
            # The lost first try acknowledged e1; the repeat finds it no longer pending
            # (conclusive: the intent is closed all the same).
            assert outcomes == [SettlementOutcome.NOT_PENDING] + [SettlementOutcome.ACKED] * 2
        else:
            assert outcomes == [SettlementOutcome.ACKED] * 3
        assert pending_ids(stream_client, names) == {}
        assert assert_nothing_acked_uncovered(stream_client, progress_client, names) == set(ids)
        progress = await s.store.read(scope)
        assert (progress.floor, progress.intents, progress.gaps) == (DeliveryId(ids[-1]), (), ())
        # A receipt whose reply was lost is recorded twice (the repeat is evidence, no state).
        doubled = script == "receipt" and at != "before_request"
        assert len(receipts(progress_client, names)) == (4 if doubled else 3)


@pytest.mark.parametrize("how", ["every-try-cut", "progress-gone", "stream-gone"])
async def test_a_server_that_stays_unreachable_is_a_backend_error_after_the_retries(
    flavour: str,
    how: str,
    stream_proxy: FaultyProxy,
    progress_proxy: FaultyProxy,
    stream_server: EmbeddedRedis,
    progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    progress_client: redis.Redis,
    names: Names,
) -> None:
    async with shell(flavour, stream_proxy.port, progress_proxy.port, names) as s:
        await s.consumer.start()
        [delivery] = publish(stream_client, names, ["e1"])
        if how == "every-try-cut":
            progress_proxy.cut(script_needle(PROGRESS, "record"), "after_request", times=ATTEMPTS)
        else:
            (progress_proxy if how == "progress-gone" else stream_proxy).close()
        with capture_logs() as logs, pytest.raises(BackendError) as info:
            await s.poll()
        err = info.value
        assert len(retried(logs)) == ATTEMPTS - 1
        assert f"after {ATTEMPTS} tries" in str(err)
        if how == "every-try-cut":
            assert err.operation_id == names.consumer
        assert isinstance(err.__cause__, redis.ConnectionError)  # kept as the cause only
        assert pending_ids(stream_client, names) == (
            {delivery: ("w1", 1)} if how != "stream-gone" else {}
        )
        effects = list(s.effects)

    if how == "every-try-cut":
        assert effects == ["e1"]  # the effect ran; recording its progress was cut every time
        # Later, with the server reachable: the delivery is reclaimed, progress (the first
        # try did record it) covers it, the effect is not run again, and it is acknowledged.
        await asyncio.sleep(0.1)  # past claim_idle
        async with shell(flavour, stream_server.url, progress_server.url, names) as again:
            await again.consumer.start()
            report = await again.poll()
        assert again.effects == []
        assert [r.outcome for r in report.receipts] == [SettlementOutcome.ACKED]
        assert assert_nothing_acked_uncovered(stream_client, progress_client, names) == {delivery}
