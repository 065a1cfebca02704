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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import redis
import redis.asyncio as aioredis

from settle import AsyncSettler, BackendError, Reserved, Settler
from settle._core.scripts import SCRIPTS
from settle.embedded import EmbeddedRedis
from settle.models import State
from tests.faults.servers import (
    STALL_TIMEOUT,
    async_client,
    proxy_to,
    script_needle,
    sync_client,
)
from tests.faults.tcp_proxy import FaultyProxy

#: Whose repeat: settle's (redis-py's own retries off), or the connection's own retry policy
#: (redis-py's default, on a client an application makes), which sends the call again on the
#: same lane before settle sees the lost reply.
RETRIES = pytest.mark.parametrize("connection_retries", [False, True], ids=["settle", "redis-py"])

pytestmark = [pytest.mark.faults]


def _fill_once_completed(
    server: EmbeddedRedis, namespace: str, ops: list[str], stop: threading.Event
) -> None:
    """Once the first tries have completed every operation of ``ops`` on the server (their
    replies withheld), the server refuses every write: maxmemory below what it uses, under
    noeviction. It must do so before the client's socket timeout ends the stall and the call
    is repeated: the clients wait ``STALL_TIMEOUT`` (2 s), not 0.5 s, which a watcher thread
    of a loaded worker could take to notice."""
    with Settler.from_url(server.url, namespace=namespace, shards=2) as observer:
        while not stop.is_set():
            records = [observer.get(op) for op in ops]
            if all(r is not None and r.state is State.COMPLETED for r in records):
                with redis.Redis(port=server.port) as raw:
                    raw.config_set("maxmemory", 1)
                return
            time.sleep(0.002)


@dataclass
class _LostReplies:
    """The fault of these tests: the replies of ``complete``'s sends through ``proxy`` are
    withheld (the client times out and the call is sent again), and ``watcher`` fills the
    server once the withheld sends have completed their records."""

    server: EmbeddedRedis
    proxy: FaultyProxy
    namespace: str
    watcher: threading.Thread

    def strike(self, sends: int = 1) -> None:
        """The next ``sends`` sends of ``complete`` lose their replies."""
        self.watcher.start()
        self.proxy.cut(script_needle(SCRIPTS, "complete"), "stall", times=sends)

    def check(self, refusals: Sequence[object], sends: int = 1) -> None:
        """The fault struck ``sends`` times, and each refusal of a repeat (the server full)
        says the earlier try's outcome is unknown, not that nothing was written."""
        assert self.proxy.fired == ["stall"] * sends
        for refusal in refusals:
            assert isinstance(refusal, BackendError)
            assert refusal.code == "OOM"
            text = str(refusal)
            assert "Nothing was written" not in text
            assert "whether that one ran is unknown" in text

    def free(self) -> None:
        """The server takes writes again."""
        with redis.Redis(port=self.server.port) as raw:
            raw.config_set("maxmemory", 0)


@contextmanager
def _lost_replies(server: EmbeddedRedis, ops: list[str]) -> Iterator[_LostReplies]:
    """:class:`_LostReplies` on ``server`` for the operations ``ops``, in a namespace of its
    own; the proxy closed and the watcher stopped at the end."""
    namespace = f"n{uuid.uuid4().hex[:8]}"
    proxy = proxy_to(server.url, SCRIPTS)
    stop = threading.Event()
    watcher = threading.Thread(target=_fill_once_completed, args=(server, namespace, ops, stop))
    try:
        yield _LostReplies(server, proxy, namespace, watcher)
    finally:
        stop.set()
        proxy.close()


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
    with _lost_replies(server, ["op-1"]) as fault:
        client = (
            redis.Redis(port=fault.proxy.port, socket_timeout=STALL_TIMEOUT)
            if connection_retries
            else sync_client(fault.proxy.port, STALL_TIMEOUT)
        )
        with Settler(client, namespace=fault.namespace, shards=2) as settler:
            held = settler.reserve("op-1", {"amount": 1}, principal="tenant:a")
            assert isinstance(held, Reserved)
            fault.strike()
            with pytest.raises(BackendError) as info:
                settler.complete(held.reservation, {"charge": "ch_1"})
            fault.watcher.join(10)
            fault.check([info.value])
            fault.free()
            record = settler.get("op-1")
            assert record is not None
            assert record.state is State.COMPLETED  # the lost try had run
            again = settler.complete(held.reservation, {"charge": "ch_1"})  # still safe
            assert again.record is not None
            assert again.record.state is State.COMPLETED


@pytest.mark.asyncio
@RETRIES
async def test_a_refused_repeat_after_a_lost_reply_says_so_on_asyncio(
    server: EmbeddedRedis, connection_retries: bool
) -> None:
    """The asyncio runner (its own source: the sync one is generated from it) and its
    pipelined lane: the same call, the same truth about the earlier try."""
    with _lost_replies(server, ["op-1"]) as fault:
        client = (
            aioredis.Redis(port=fault.proxy.port, socket_timeout=STALL_TIMEOUT)
            if connection_retries
            else async_client(fault.proxy.port, STALL_TIMEOUT)
        )
        async with AsyncSettler(client, namespace=fault.namespace, shards=2) as settler:
            held = await settler.reserve("op-1", {"amount": 1}, principal="tenant:a")
            assert isinstance(held, Reserved)
            fault.strike()
            with pytest.raises(BackendError) as info:
                await settler.complete(held.reservation, {"charge": "ch_1"})
            await asyncio.to_thread(fault.watcher.join, 10)
            fault.check([info.value])
            fault.free()
            record = await settler.get("op-1")
            assert record is not None
            assert record.state is State.COMPLETED  # the lost try had run


@pytest.mark.asyncio
async def test_a_pipelined_batch_sent_again_by_the_connection_says_so(
    server: EmbeddedRedis,
) -> None:
    """Concurrent calls on asyncio go out in one pipelined batch; the connection's own retry
    sends the whole batch again after its replies were lost: each call's refusal says the
    earlier send's outcome is unknown."""
    ops = [f"op-{n}" for n in range(4)]
    with _lost_replies(server, ops) as fault:
        client = aioredis.Redis(port=fault.proxy.port, socket_timeout=STALL_TIMEOUT)
        async with AsyncSettler(client, namespace=fault.namespace, shards=2) as settler:
            held = [await settler.reserve(op, {"amount": 1}, principal="tenant:a") for op in ops]
            assert all(isinstance(one, Reserved) for one in held)
            fault.strike(sends=2)  # the first call's send, then the batch's
            outcomes = await asyncio.gather(
                *(settler.complete(one.reservation, {"charge": "ch"}) for one in held),  # type: ignore[union-attr]
                return_exceptions=True,
            )
            await asyncio.to_thread(fault.watcher.join, 10)
            fault.check(outcomes, sends=2)
