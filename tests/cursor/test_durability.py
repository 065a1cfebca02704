"""Durability and transient faults of cursor checkpoints, on the core's Redis runtime (SPEC 4,
SPEC 11): ``min_replicas`` against a real primary + replica (a step returns once the replica
holds what it wrote; a frozen or killed replica turns the first write into a
``DurabilityError``), and a connection-cutting proxy (a cut call is repeated and the step ends
as it would have without the cut; a server that stays away is a ``BackendError``).

Sync and async shells alike, against the real HTTP provider of ``tests/cursor/provider.py``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis
from structlog.testing import capture_logs

from settle import BackendError, ConfigurationError, DurabilityError, SettleError
from settle._runtime.transient import ATTEMPTS
from settle.cursor import (
    AsyncCursorConsumer,
    AsyncCursorStore,
    CursorConsumer,
    CursorStore,
    ProviderContract,
    StepOutcome,
)
from settle.cursor._keys import stream_keys
from settle.cursor._scripts import SCRIPTS
from settle.cursor.models import Classification, Disposition
from settle.embedded import EmbeddedRedis
from tests.cursor.conftest import Sink
from tests.cursor.provider import ProviderServer, async_fetcher, fetcher
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
from tests.stopwatch import Stopwatch

pytestmark = [pytest.mark.asyncio, pytest.mark.faults]

STREAM = "orders"


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def provider(serve: Callable[..., ProviderServer]) -> ProviderServer:
    server = serve(page_size=3)
    server.provider.append(3)
    return server


@dataclass
class Shell:
    """One flavour's store and consumer, both driven with ``await``."""

    store: Any
    consumer: Any


@asynccontextmanager
async def shell(
    flavour: str,
    target: str | int,
    provider: ProviderServer,
    sink: Sink,
    *,
    socket_timeout: float = UNSTALLED_TIMEOUT,
    **options: Any,
) -> AsyncIterator[Shell]:
    """A store connected with ``from_url`` (``target`` a URL) or through a client with
    redis-py's retries off and ``socket_timeout`` (``target`` a proxy's port), and a
    consumer of ``STREAM``."""
    contract = ProviderContract()
    if flavour == "sync":
        store = (
            CursorStore.from_url(target, **options)
            if isinstance(target, str)
            else CursorStore(sync_client(target, socket_timeout), **options)
        )
        with store, httpx.Client(timeout=5.0) as http:
            fetch = fetcher(provider.url, http)
            consumer = CursorConsumer(fetch, sink, contract, store=store, stream=STREAM)
            yield Shell(Awaitable(store), Awaitable(consumer))
        return

    astore = (
        AsyncCursorStore.from_url(target, **options)
        if isinstance(target, str)
        else AsyncCursorStore(async_client(target, socket_timeout), **options)
    )
    async with astore, httpx.AsyncClient(timeout=5.0) as ahttp:
        afetch = async_fetcher(provider.url, ahttp)
        aconsumer = AsyncCursorConsumer(afetch, sink.handle, contract, store=astore, stream=STREAM)
        yield Shell(astore, aconsumer)


def stored(server: EmbeddedRedis | str, namespace: str) -> dict[str, Any]:
    """Every cursor key of ``STREAM`` as read from ``server`` itself, not through settle."""
    url = server if isinstance(server, str) else server.url
    ckpt, wit, wits, rcpt, rpos = stream_keys(namespace, STREAM)
    with redis.Redis.from_url(url) as raw:
        return {
            "checkpoint": raw.hgetall(ckpt),
            "witnesses": raw.hgetall(wit),
            "witness index": raw.zrange(wits, 0, -1, withscores=True),
            "receipts": raw.hgetall(rcpt),
            "receipt index": raw.zrange(rpos, 0, -1, withscores=True),
        }


def holds(state: dict[str, Any], earlier: dict[str, Any]) -> bool:
    """Whether ``state`` still holds everything of ``earlier`` (later writes may add more)."""
    for name, value in earlier.items():
        if isinstance(value, dict):
            if any(state[name].get(k) != v for k, v in value.items()):
                return False
        elif not set(value) <= set(state[name]):
            return False
    return True


def durable(namespace: str) -> dict[str, Any]:
    return {"namespace": namespace, "min_replicas": 1, "replica_timeout": REPLICA_TIMEOUT}


def backend_events(logs: list[dict[str, Any]]) -> list[str]:
    return [e["event"] for e in logs if e["event"].startswith("settle.backend")]


# -- min_replicas against a real primary + replica ------------------------------------------


async def test_a_step_returns_once_the_replica_holds_what_it_wrote(
    flavour: str,
    primary: EmbeddedRedis,
    replica: EmbeddedRedis,
    provider: ProviderServer,
    sink: Sink,
    namespace: str,
) -> None:
    first = provider.provider.token(0)
    async with shell(flavour, primary.url, provider, sink, **durable(namespace)) as s:
        started_at = await s.store.start(STREAM, first.encode())
        # The replica has the checkpoint the moment start() returned.
        on_replica = stored(replica, namespace)
        assert on_replica["checkpoint"][b"cursor"] == first.encode()
        assert on_replica["checkpoint"][b"gen"] == str(started_at.generation).encode()

        started = time.perf_counter()
        result = await s.consumer.step()
        FIGURES[f"cursor step of 3 events + WAIT 1 replica ({flavour}, loopback)"] = (
            f"{(time.perf_counter() - started) * 1000:.1f} ms"
        )
        assert (result.outcome, result.applied, result.generation) == (
            StepOutcome.PROMOTED,
            3,
            started_at.generation + 1,
        )
        # The witness, the three receipts and the promoted checkpoint: all on the replica when
        # step() returned, exactly as the primary holds them.
        on_replica = stored(replica, namespace)
        assert on_replica == stored(primary, namespace)
        assert on_replica["checkpoint"][b"gen"] == str(result.generation).encode()
        assert on_replica["checkpoint"][b"waid"] == result.attempt_id.encode()
        assert set(on_replica["receipts"]) == {b"e1", b"e2", b"e3"}
        assert on_replica["witnesses"][f"{result.attempt_id}|disp".encode()] == b"promoted"
        assert sink.applied() == ["e1", "e2", "e3"]


@pytest.mark.parametrize("how", ["frozen", "killed"])
async def test_a_replica_that_does_not_acknowledge_turns_the_first_write_into_a_durability_error(
    flavour: str,
    how: str,
    primary: EmbeddedRedis,
    replica: EmbeddedRedis,
    provider: ProviderServer,
    sink: Sink,
    namespace: str,
) -> None:
    p = provider.provider
    async with shell(flavour, primary.url, provider, sink, **durable(namespace)) as s:
        g0 = (await s.store.start(STREAM, p.token(0).encode())).generation
        assert (await s.consumer.step()).generation == g0 + 1
        returned = stored(primary, namespace)
        p.append(3)

        with ExitStack() as stopped:
            if how == "frozen":
                stopped.enter_context(frozen(replica))
            else:
                replica.close()
                wait_replicas(primary, 0)
            clock = Stopwatch()
            with capture_logs() as logs, pytest.raises(DurabilityError) as info:
                await s.consumer.step()
            elapsed = clock.elapsed()
            unloaded = clock.unloaded()  # less the time waiting for a CPU
            # Reading the checkpoint never waits; writing a new stream waits as well.
            assert (await s.store.checkpoint(STREAM)).generation == g0 + 1
            with pytest.raises(DurabilityError):
                await s.store.start("another", b"c0")
        FIGURES[f"cursor step with the replica {how} ({flavour}, replica_timeout=0.3 s)"] = (
            f"{elapsed * 1000:.0f} ms, then DurabilityError"
        )

        err = info.value
        # The first write of the step (its witness) waited replica_timeout, once, and said so.
        # (The upper bound is on the time this test was not kept waiting for a CPU: four
        # tries take 4 x 0.3 s of it, however loaded the machine.)
        assert elapsed >= REPLICA_TIMEOUT
        assert unloaded < REPLICA_TIMEOUT + SLACK
        assert (err.operation_id, err.acknowledged, err.required) == (STREAM, 0, 1)
        assert "witness: 0 of 1 replicas acknowledged within 300 ms" in str(err)
        assert "uncertain" in str(err)
        assert backend_events(logs) == ["settle.backend.durability_failed"]
        # No event was handed over: its witness was not known to be durable.
        assert sink.applied() == ["e1", "e2", "e3"]

        if how == "killed":
            replica = replica_of(primary)
        wait_replicas(primary, 1)
        try:
            # Nothing that returned is lost: the replica holds all of the first step.
            assert holds(stored(replica, namespace), returned)
            # The step is repeated: the witness written on the primary is resumed, and the
            # events are handed over once.
            result = await s.consumer.step()
            assert (result.outcome, result.classification) == (
                StepOutcome.PROMOTED,
                Classification.EXACT_REPLAY,
            )
            assert (result.applied, result.generation) == (3, g0 + 2)
            assert stored(replica, namespace) == stored(primary, namespace)
            assert sink.applied() == [f"e{i}" for i in range(1, 7)]
            assert max(sink.calls.values()) == 1
        finally:
            if how == "killed":
                replica.close()


async def test_from_url_takes_the_durability_options(
    primary: EmbeddedRedis, replica: EmbeddedRedis, namespace: str
) -> None:
    # Both were a TypeError before the cursor ran on the core's runtime.
    with CursorStore.from_url(primary.url, namespace=namespace, min_replicas=1) as store:
        store.start(STREAM, b"c0")
        assert stored(replica, namespace)["checkpoint"][b"cursor"] == b"c0"
    async with AsyncCursorStore.from_url(
        primary.url, namespace=namespace, min_replicas=1, replica_timeout=REPLICA_TIMEOUT
    ) as astore:
        assert (await astore.start(STREAM, b"c1")).cursor == b"c0"  # exists already


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
@pytest.mark.parametrize("store_type", [CursorStore, AsyncCursorStore])
async def test_a_bad_durability_option_is_a_configuration_error(
    store_type: type, option: dict[str, Any], redis_url: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        store_type.from_url(redis_url, **option)
    assert isinstance(info.value, SettleError)
    assert next(iter(option)) in str(info.value)


# -- connections cut by a proxy ---------------------------------------------------------------


@pytest.fixture
def proxy(redis_url: str) -> Iterator[FaultyProxy]:
    running = proxy_to(redis_url, SCRIPTS)
    yield running
    running.close()


def retried(logs: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(e["script"], e["attempt"]) for e in logs if e["event"] == "settle.backend.retrying"]


@pytest.mark.parametrize("at", ["before_request", "after_request", "mid_reply", "stall"])
@pytest.mark.parametrize("script", ["init", "witness", "outcome", "promote"])
async def test_a_cut_write_is_repeated_and_the_step_ends_as_without_the_cut(
    flavour: str,
    script: str,
    at: str,
    proxy: FaultyProxy,
    provider: ProviderServer,
    sink: Sink,
    namespace: str,
    redis_url: str,
) -> None:
    p = provider.provider
    timeout = cut_timeout(at)  # a call of a loaded worker held past 0.5 s was repeated too
    async with shell(
        flavour, proxy.port, provider, sink, socket_timeout=timeout, namespace=namespace
    ) as s:
        first = p.token(0).encode()
        proxy.cut(script_needle(SCRIPTS, script), at)  # type: ignore[arg-type]
        with capture_logs() as logs:
            start = await s.store.start(STREAM, first)
            result = await s.consumer.step()
        assert proxy.fired == [at]
        assert retried(logs) == [(script, 1)]
        assert start.cursor == first
        assert (result.outcome, result.classification) == (
            StepOutcome.PROMOTED,
            Classification.FIRST,
        )
        assert (result.applied, result.skipped, result.generation) == (3, 0, start.generation + 1)
        # Each event handed over once; one witness, promoted; three receipts.
        assert sink.applied() == ["e1", "e2", "e3"]
        assert max(sink.calls.values()) == 1
        [witness] = await s.store.witnesses(STREAM)
        assert (witness.attempt_id, witness.disposition) == (
            result.attempt_id,
            Disposition.PROMOTED,
        )
        assert (await s.store.checkpoint(STREAM)).cursor == witness.successor
        assert set(stored(redis_url, namespace)["receipts"]) == {b"e1", b"e2", b"e3"}


@pytest.mark.parametrize("how", ["every-try-cut", "server-gone"])
async def test_a_server_that_stays_unreachable_is_a_backend_error_after_the_retries(
    flavour: str,
    how: str,
    proxy: FaultyProxy,
    provider: ProviderServer,
    sink: Sink,
    namespace: str,
    redis_url: str,
) -> None:
    p = provider.provider
    async with shell(flavour, proxy.port, provider, sink, namespace=namespace) as s:
        await s.store.start(STREAM, p.token(0).encode())
        if how == "every-try-cut":
            proxy.cut(script_needle(SCRIPTS, "witness"), "after_request", times=ATTEMPTS)
        else:
            proxy.close()  # refused from now on
        with capture_logs() as logs, pytest.raises(BackendError) as info:
            await s.consumer.step()
        err = info.value
        assert len(retried(logs)) == ATTEMPTS - 1
        assert f"after {ATTEMPTS} tries" in str(err)
        assert err.operation_id == STREAM
        assert isinstance(err.__cause__, redis.ConnectionError)  # kept as the cause only
        assert sink.applied() == []

    if how == "every-try-cut":
        # Later, with the server reachable: the step resumes the witness its first try wrote.
        sink_again = Sink()
        async with shell(flavour, redis_url, provider, sink_again, namespace=namespace) as s:
            result = await s.consumer.step()
            assert (result.outcome, result.classification, result.applied) == (
                StepOutcome.PROMOTED,
                Classification.EXACT_REPLAY,
                3,
            )
            assert len(await s.store.witnesses(STREAM)) == 1
        assert sink_again.applied() == ["e1", "e2", "e3"]


async def test_a_cut_on_the_durable_path_is_repeated_and_acknowledged(
    flavour: str,
    primary: EmbeddedRedis,
    replica: EmbeddedRedis,
    provider: ProviderServer,
    sink: Sink,
    namespace: str,
) -> None:
    """The script and its WAIT travel in one pipeline: a cut of that pipeline is repeated
    like any other, and the step returns once the replica holds it."""
    proxy = proxy_to(primary.url, SCRIPTS)
    try:
        async with shell(flavour, proxy.port, provider, sink, **durable(namespace)) as s:
            g0 = (await s.store.start(STREAM, provider.provider.token(0).encode())).generation
            proxy.cut(script_needle(SCRIPTS, "promote"), "after_request")
            with capture_logs() as logs:
                result = await s.consumer.step()
            assert proxy.fired == ["after_request"]
            assert retried(logs) == [("promote", 1)]
            assert (result.outcome, result.generation) == (StepOutcome.PROMOTED, g0 + 1)
            assert stored(replica, namespace) == stored(primary, namespace)
            assert stored(replica, namespace)["checkpoint"][b"gen"] == str(g0 + 1).encode()
    finally:
        proxy.close()
