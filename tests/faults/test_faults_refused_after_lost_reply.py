"""A refusal of a repeat says nothing of the try whose reply was lost.

A settlement's first try ran and its reply was lost on the way back (a partition: the
reply withheld until the client's socket timeout); settle repeated the call, and by then
the server refused writes (full, ``OOM``). The error said "Nothing was written" while the
record was completed: true of the refused try, not of the call. It says now that this try
wrote nothing and that an earlier try's outcome is unknown (read the record back), and the
repeat is still safe.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aioredis

from settle import AsyncSettler, BackendError, Reserved, Settler
from settle._core.scripts import SCRIPTS
from settle.embedded import EmbeddedRedis
from settle.models import State
from tests.faults.servers import (
    SOCKET_TIMEOUT,
    async_client,
    proxy_to,
    script_needle,
    sync_client,
)

#: Whose repeat: settle's (redis-py's own retries off), or the connection's own retry policy
#: (redis-py's default, on a client an application makes), which sends the call again on the
#: same lane before settle sees the lost reply.
RETRIES = pytest.mark.parametrize("connection_retries", [False, True], ids=["settle", "redis-py"])

pytestmark = [pytest.mark.faults]


def _fill_once_completed(server: EmbeddedRedis, namespace: str, stop: threading.Event) -> None:
    """Once the first try has completed the record on the server (its reply withheld), the
    server refuses every write: maxmemory below what it uses, under noeviction."""
    with Settler.from_url(server.url, namespace=namespace, shards=2) as observer:
        while not stop.is_set():
            record = observer.get("op-1")
            if record is not None and record.state is State.COMPLETED:
                with redis.Redis(port=server.port) as raw:
                    raw.config_set("maxmemory", 1)
                return
            time.sleep(0.002)


@pytest.fixture(params=["default", "valkey"])
def server(request: pytest.FixtureRequest) -> Iterator[EmbeddedRedis]:
    """The session's server kind (EVALSHA on 6.2) and Valkey (FCALL)."""
    if request.param == "valkey":
        yield request.getfixturevalue("valkey")
        return
    with EmbeddedRedis() as started:
        yield started


@RETRIES
def test_a_refused_repeat_after_a_lost_reply_does_not_say_nothing_was_written(
    server: EmbeddedRedis, connection_retries: bool
) -> None:
    namespace = f"n{uuid.uuid4().hex[:8]}"
    proxy = proxy_to(server.url, SCRIPTS)
    stop = threading.Event()
    try:
        client = (
            redis.Redis(port=proxy.port, socket_timeout=SOCKET_TIMEOUT)
            if connection_retries
            else sync_client(proxy.port)
        )
        with Settler(client, namespace=namespace, shards=2) as settler:
            held = settler.reserve("op-1", {"amount": 1}, principal="tenant:a")
            assert isinstance(held, Reserved)
            watcher = threading.Thread(target=_fill_once_completed, args=(server, namespace, stop))
            watcher.start()
            proxy.cut(script_needle(SCRIPTS, "complete"), "stall")
            with pytest.raises(BackendError) as info:
                settler.complete(held.reservation, {"charge": "ch_1"})
            watcher.join(10)
            assert proxy.fired == ["stall"]
            assert info.value.code == "OOM"
            text = str(info.value)
            assert "Nothing was written" not in text
            assert "whether that one ran is unknown" in text
            with redis.Redis(port=server.port) as raw:
                raw.config_set("maxmemory", 0)
            record = settler.get("op-1")
            assert record is not None
            assert record.state is State.COMPLETED  # the lost try had run
            again = settler.complete(held.reservation, {"charge": "ch_1"})  # still safe
            assert again.record is not None
            assert again.record.state is State.COMPLETED
    finally:
        stop.set()
        proxy.close()


@pytest.mark.asyncio
@RETRIES
async def test_a_refused_repeat_after_a_lost_reply_says_so_on_asyncio(
    server: EmbeddedRedis, connection_retries: bool
) -> None:
    """The asyncio runner (its own source: the sync one is generated from it) and its
    pipelined lane: the same call, the same truth about the earlier try."""
    namespace = f"n{uuid.uuid4().hex[:8]}"
    proxy = proxy_to(server.url, SCRIPTS)
    stop = threading.Event()
    watcher = threading.Thread(target=_fill_once_completed, args=(server, namespace, stop))
    try:
        client = (
            aioredis.Redis(port=proxy.port, socket_timeout=SOCKET_TIMEOUT)
            if connection_retries
            else async_client(proxy.port)
        )
        async with AsyncSettler(client, namespace=namespace, shards=2) as settler:
            held = await settler.reserve("op-1", {"amount": 1}, principal="tenant:a")
            assert isinstance(held, Reserved)
            watcher.start()
            proxy.cut(script_needle(SCRIPTS, "complete"), "stall")
            with pytest.raises(BackendError) as info:
                await settler.complete(held.reservation, {"charge": "ch_1"})
            await asyncio.to_thread(watcher.join, 10)
            assert proxy.fired == ["stall"]
            assert info.value.code == "OOM"
            text = str(info.value)
            assert "Nothing was written" not in text
            assert "whether that one ran is unknown" in text
            with redis.Redis(port=server.port) as raw:
                raw.config_set("maxmemory", 0)
            record = await settler.get("op-1")
            assert record is not None
            assert record.state is State.COMPLETED  # the lost try had run
    finally:
        stop.set()
        proxy.close()


def _fill_once_all_completed(
    server: EmbeddedRedis, namespace: str, ops: list[str], stop: threading.Event
) -> None:
    """:func:`_fill_once_completed` for several operations: once all are completed."""
    with Settler.from_url(server.url, namespace=namespace, shards=2) as observer:
        while not stop.is_set():
            records = [observer.get(op) for op in ops]
            if all(r is not None and r.state is State.COMPLETED for r in records):
                with redis.Redis(port=server.port) as raw:
                    raw.config_set("maxmemory", 1)
                return
            time.sleep(0.002)


@pytest.mark.asyncio
async def test_a_pipelined_batch_sent_again_by_the_connection_says_so(
    server: EmbeddedRedis,
) -> None:
    """Concurrent calls on asyncio go out in one pipelined batch; the connection's own retry
    sends the whole batch again after its replies were lost: each call's refusal says the
    earlier send's outcome is unknown."""
    namespace = f"n{uuid.uuid4().hex[:8]}"
    proxy = proxy_to(server.url, SCRIPTS)
    stop = threading.Event()
    ops = [f"op-{n}" for n in range(4)]
    watcher = threading.Thread(target=_fill_once_all_completed, args=(server, namespace, ops, stop))
    try:
        client = aioredis.Redis(port=proxy.port, socket_timeout=SOCKET_TIMEOUT)
        async with AsyncSettler(client, namespace=namespace, shards=2) as settler:
            held = [await settler.reserve(op, {"amount": 1}, principal="tenant:a") for op in ops]
            assert all(isinstance(one, Reserved) for one in held)
            watcher.start()
            proxy.cut(script_needle(SCRIPTS, "complete"), "stall", times=2)
            outcomes = await asyncio.gather(
                *(settler.complete(one.reservation, {"charge": "ch"}) for one in held),  # type: ignore[union-attr]
                return_exceptions=True,
            )
            await asyncio.to_thread(watcher.join, 10)
            assert proxy.fired == ["stall", "stall"]  # the first call's send, then the batch's
            for outcome in outcomes:
                assert isinstance(outcome, BackendError)
                assert outcome.code == "OOM"
                assert "Nothing was written" not in str(outcome)
                assert "whether that one ran is unknown" in str(outcome)
    finally:
        stop.set()
        proxy.close()
