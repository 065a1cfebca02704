"""Evidence of lost data in the companions makes the server checks due at once, as the core's
``unclaimed`` reply does (docs/operations.md, "When it is checked again"): a checkpoint whose
keys vanished while a step ran (a FLUSHALL, a restart without persistence, a DEL) is such
evidence. Without it, a FLUSHALL together with ``CONFIG SET maxmemory-policy allkeys-lru``
(a server repurposed as a cache) let the cursor re-create its checkpoint, and run on, on an
evicting server for up to ``recheck_interval`` (30 s), while the core refuses its first
write after the same FLUSHALL."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis

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
