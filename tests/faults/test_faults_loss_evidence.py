"""Evidence of lost data in the companions makes the server checks due at once, as the core's
``unclaimed`` reply does (docs/operations.md, "When it is checked again"): a checkpoint whose
keys vanished while a step ran (a FLUSHALL, a restart without persistence, a DEL), and a
stream consumer group settle made answering NOGROUP, are such evidence. Without it, a
FLUSHALL together with ``CONFIG SET maxmemory-policy allkeys-lru`` (a server repurposed as a
cache) let the cursor re-create its checkpoint, and the stream consumer its group, and run
on, on an evicting server for up to ``recheck_interval`` (30 s), while the core refuses its
first write after the same FLUSHALL."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from settle import ConfigurationError
from settle.cursor import (
    AsyncCursorConsumer,
    AsyncCursorStore,
    CursorConsumer,
    CursorStore,
    Event,
    Page,
    ProviderContract,
)
from settle.cursor.errors import CheckpointMissing
from settle.embedded import EmbeddedRedis
from settle.progress import (
    AsyncProgressStore,
    AsyncStreamConsumer,
    ProgressStore,
    StreamConsumer,
)
from settle.progress.errors import ProviderReset

pytestmark = [pytest.mark.faults]

LOG = [Event(f"evt-{i}", i, {"amount": i}) for i in range(1, 10)]


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    running = EmbeddedRedis(extra_args=["--maxmemory-policy", "noeviction"]).start()
    yield running
    running.close()


def _page(cursor: bytes) -> Page:
    after = int(cursor.decode().split(":")[1])
    events = [e for e in LOG if e.position > after][:3]
    return Page(events, successor=f"after:{events[-1].position if events else after}".encode())


def _flush_into_a_cache(server: EmbeddedRedis) -> None:
    with redis.Redis.from_url(server.url) as raw:
        raw.flushall()
        raw.config_set("maxmemory-policy", "allkeys-lru")


def _keys(server: EmbeddedRedis) -> int:
    with redis.Redis.from_url(server.url) as raw:
        return int(raw.dbsize())


def test_a_checkpoint_lost_during_a_step_checks_the_server_before_start_writes(
    server: EmbeddedRedis,
) -> None:
    store = CursorStore.from_url(server.url, namespace="evidence")
    handled: list[str] = []

    def handle(event: Event, ctx: Any) -> None:
        handled.append(event.id)
        if event.id == "evt-5":
            _flush_into_a_cache(server)

    try:
        store.start("ledger", b"after:0")
        consumer = CursorConsumer(_page, handle, ProviderContract(), store=store, stream="ledger")
        consumer.step()
        with pytest.raises(CheckpointMissing, match="deleted while this step ran"):
            consumer.step()
        assert _keys(server) == 0
        with pytest.raises(ConfigurationError, match="allkeys-lru"):
            store.start("ledger", b"after:0")  # what the error tells the caller to do
        assert _keys(server) == 0  # nothing written on the evicting server
    finally:
        store.close()


def test_a_checkpoint_lost_during_a_step_checks_the_server_before_start_writes_async(
    server: EmbeddedRedis,
) -> None:
    async def main() -> None:
        store = AsyncCursorStore.from_url(server.url, namespace="evidence")

        async def handle(event: Event, ctx: Any) -> None:
            if event.id == "evt-5":
                await asyncio.to_thread(_flush_into_a_cache, server)

        async def fetch(cursor: bytes) -> Page:
            return _page(cursor)

        try:
            await store.start("ledger", b"after:0")
            consumer = AsyncCursorConsumer(
                fetch, handle, ProviderContract(), store=store, stream="ledger"
            )
            await consumer.step()
            with pytest.raises(CheckpointMissing, match="deleted while this step ran"):
                await consumer.step()
            with pytest.raises(ConfigurationError, match="allkeys-lru"):
                await store.start("ledger", b"after:0")
            assert _keys(server) == 0
        finally:
            await store.aclose()

    asyncio.run(main())


def _flush_stream_server(server: EmbeddedRedis) -> None:
    _flush_into_a_cache(server)
    with redis.Redis.from_url(server.url) as raw:
        raw.xadd("orders", {"emission_id": "e1"})  # the producer carries on


@contextmanager
def _consumer_of_one_entry() -> Iterator[tuple[EmbeddedRedis, StreamConsumer]]:
    """A stream server holding one entry of ``orders``, and a consumer of it whose progress
    is on a server of its own (both noeviction until a test says otherwise)."""
    stream = EmbeddedRedis(extra_args=["--maxmemory-policy", "noeviction"]).start()
    progress = EmbeddedRedis(extra_args=["--maxmemory-policy", "noeviction"]).start()
    try:
        with redis.Redis.from_url(stream.url) as raw:
            raw.xadd("orders", {"emission_id": "e0"})
        store = ProgressStore.from_url(progress.url, consumer="billing")
        with StreamConsumer(
            redis.Redis.from_url(stream.url), store, stream="orders", group="billing", block=0.01
        ) as consumer:
            yield stream, consumer
    finally:
        stream.close()
        progress.close()


def _refused_on_the_cache(stream: EmbeddedRedis, consumer: StreamConsumer) -> None:
    """What ProviderReset (and run()) does next, start(), is refused on the evicting server,
    and no incarnation is made there."""
    with pytest.raises(ConfigurationError, match="allkeys-lru"):
        consumer.start()
    with redis.Redis.from_url(stream.url) as raw:
        assert raw.keys("settle:*") == []


def test_a_consumer_group_lost_checks_the_stream_server_before_it_is_made_again() -> None:
    """NOGROUP for the group settle made is the stream server's evidence of lost data: the
    consumer's start() that opens the new incarnation is refused on an evicting server, as
    the core's first write after a FLUSHALL is, instead of re-creating the group there."""
    with _consumer_of_one_entry() as (stream, consumer):
        assert len(consumer.poll(lambda ctx: None).handled) == 1
        _flush_stream_server(stream)
        with pytest.raises(ProviderReset):
            consumer.poll(lambda ctx: None)
        _refused_on_the_cache(stream, consumer)


def test_a_consumer_group_lost_checks_the_stream_server_before_it_is_made_again_async() -> None:
    async def main() -> None:
        stream = EmbeddedRedis(extra_args=["--maxmemory-policy", "noeviction"]).start()
        progress = EmbeddedRedis(extra_args=["--maxmemory-policy", "noeviction"]).start()

        async def effect(ctx: Any) -> None:
            return None

        try:
            with redis.Redis.from_url(stream.url) as raw:
                raw.xadd("orders", {"emission_id": "e0"})
            store = AsyncProgressStore.from_url(progress.url, consumer="billing")
            async with AsyncStreamConsumer(
                aioredis.Redis.from_url(stream.url),
                store,
                stream="orders",
                group="billing",
                block=0.01,
            ) as consumer:
                assert len((await consumer.poll(effect)).handled) == 1
                await asyncio.to_thread(_flush_stream_server, stream)
                with pytest.raises(ProviderReset):
                    await consumer.poll(effect)
                with pytest.raises(ConfigurationError, match="allkeys-lru"):
                    await consumer.start()
                with redis.Redis.from_url(stream.url) as raw:
                    assert raw.keys("settle:*") == []
        finally:
            stream.close()
            progress.close()

    asyncio.run(main())


def test_a_consumer_group_lost_while_a_delivery_ran_checks_the_stream_server_first() -> None:
    """The stream server loses its data while the effect of a delivery runs (between
    XREADGROUP and the settlement): the settlement's ``no_group`` reply is the same evidence
    of lost data as a NOGROUP, so the start() that ProviderReset asks for is refused on the
    evicting server instead of re-creating the group and its incarnation there."""
    with _consumer_of_one_entry() as (stream, consumer):
        with pytest.raises(ProviderReset):
            consumer.poll(lambda ctx: _flush_stream_server(stream))
        _refused_on_the_cache(stream, consumer)
