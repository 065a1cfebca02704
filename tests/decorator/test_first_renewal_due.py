"""An attempt's first renewal is due a heartbeat (``lease / 3``) after its reservation was
sent, on every surface, whenever its heartbeat gets to run. The async decorator counted it
from when its heartbeat task first ran: a function that holds the event loop before its
first ``await`` (a blocking call, CPU work) pushed the first renewal back by that long, and
a lease that should have been renewed at once lapsed under the running function (another
caller could take the key over and run it again). Real Redis, real threads."""

from __future__ import annotations

import asyncio
import threading
import time

from settle import AsyncSettler, Settler
from tests.faults.test_faults_renewal_wait import watching

LEASE = 3.0
# Longer than a heartbeat (1 s) and shorter than the lease: a first renewal counted from the
# end of the block (2.5 + 1 s) comes 0.5 s after the lease ended (3 s); one sent when the
# loop is free comes 0.5 s before it.
BLOCK = 2.5
AFTER = 1.0  # the function awaits this long after the block: the renewal's lease holds it


def test_an_async_function_that_holds_the_loop_first_keeps_its_lease(
    redis_url: str, namespace: str
) -> None:
    """The function blocks the loop 2.5 s before its first ``await``: its heartbeat renews
    at once when the loop is free (its first renewal was due at 1 s), and the 3 s lease
    never lapses. On the code before, the first renewal came at 3.5 s, the lease lapsed
    at 3 s."""

    async def run() -> str:
        settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
        try:

            @settler.operation(key="charge", principal="tenant:acme", lease=LEASE)
            async def charge() -> str:
                time.sleep(BLOCK)  # noqa: ASYNC251  # the loop held, as a blocking call does
                await asyncio.sleep(AFTER)
                return "ch_1"

            assert await settler.get("charge") is None  # its first call's checks
            return await charge()
        finally:
            await settler.aclose()

    with watching(redis_url, namespace, "charge") as reasons:
        assert asyncio.run(run()) == "ch_1"
    assert len(reasons) > 50, reasons
    assert "lease_expired" not in reasons


def test_a_sync_function_that_blocks_keeps_its_lease(redis_url: str, namespace: str) -> None:
    """The sync decorator's neighbour: its heartbeat threads renew while the function
    blocks, the first renewal a heartbeat after the reservation was sent."""
    with Settler.from_url(redis_url, namespace=namespace, shards=4) as settler:

        @settler.operation(key="charge", principal="tenant:acme", lease=LEASE)
        def charge() -> str:
            time.sleep(BLOCK + AFTER)
            return "ch_1"

        assert settler.get("charge") is None
        with watching(redis_url, namespace, "charge") as reasons:
            assert charge() == "ch_1"
    assert len(reasons) > 50, reasons
    assert "lease_expired" not in reasons


def test_a_nearer_renewal_wakes_a_heartbeat_waiting_for_a_later_one(
    redis_url: str, namespace: str
) -> None:
    """One heartbeat serves every sync attempt of a settler. It waits for a long lease's
    first renewal (20 s away) when a call with a 1 s lease starts: that call's add must wake
    it (its Condition notified, the lock held) or the short lease lapses under its running
    function."""
    with Settler.from_url(redis_url, namespace=namespace, shards=4) as settler:
        started, release = threading.Event(), threading.Event()

        @settler.operation(key="slow", principal="tenant:acme", lease=60.0)
        def slow() -> str:
            started.set()
            release.wait(30)
            return "slow"

        @settler.operation(key="short", principal="tenant:acme", lease=1.0)
        def short() -> str:
            time.sleep(2.0)
            return "short"

        results: list[str] = []
        holder = threading.Thread(target=lambda: results.append(slow()))
        holder.start()
        try:
            assert started.wait(10)
            time.sleep(0.2)  # the heartbeat is waiting for the slow lease's renewal
            with watching(redis_url, namespace, "short") as reasons:
                assert short() == "short"
        finally:
            release.set()
            holder.join()
    assert results == ["slow"]
    assert len(reasons) > 30, reasons
    assert "lease_expired" not in reasons
