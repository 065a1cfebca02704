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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from structlog.testing import capture_logs

from settle import AsyncSettler, Settler
from settle._log import operation_digest
from tests.faults.test_faults_renewal_wait import watching

# (Twice the 3 s, 2.5 s and 1 s first written: beside busy CI workers a process held 0.5 s
# lapsed the lease on the primary with nothing wrong in settle.)
LEASE = 6.0
# Longer than a heartbeat (2 s) and shorter than the lease: a first renewal counted from the
# end of the block (5 + 2 s) comes 1 s after the lease ended (6 s); one sent when the loop
# is free comes 1 s before it.
BLOCK = 5.0
# The function awaits this long after the block: the renewal's lease holds it. Longer than a
# heartbeat, so that a late first renewal (at 7 s) is sent while the function still runs and
# the primary refuses it (lease_expired); at 2 s it went as the call completed (not_pending)
# and only the reader's reads, whose count is no longer asserted, could see the lapse.
AFTER = 3.0


@contextmanager
def lease_held(redis_url: str, namespace: str, op: str, renewed: int) -> Iterator[list[str | None]]:
    """The reasons a reader of ``op``'s record saw while the block ran; and, on the
    primary's clock, at least ``renewed`` renewals of ``op``'s lease granted
    (``settle.renew.renewed``) and none refused for a lease that had ended
    (``lease_expired``, rule N5) or passed to another generation: that does not depend on
    how often the reader got a CPU, as a count of its reads did, nor on the reader at all
    (a heartbeat that sends no renewal is refused nothing: only the reader saw its lease
    lapse). (A renewal sent as the call completed finds it not pending: no lapse, that.)"""
    logs: list[dict[str, Any]]
    with capture_logs() as logs, watching(redis_url, namespace, op) as reasons:
        yield reasons
    lost = [e for e in logs if e["event"] == "settle.renew.lost" and e["reason"] != "not_pending"]
    assert not lost, lost
    digest = operation_digest(op)
    granted = [
        e for e in logs if e["event"] == "settle.renew.renewed" and e["operation_digest"] == digest
    ]
    assert len(granted) >= renewed, (len(granted), renewed)
    assert reasons, "the reader never saw the record"
    assert "lease_expired" not in reasons


def test_an_async_function_that_holds_the_loop_first_keeps_its_lease(
    redis_url: str, namespace: str
) -> None:
    """The function blocks the loop 5 s before its first ``await``: its heartbeat renews
    at once when the loop is free (its first renewal was due at 2 s), and the 6 s lease
    never lapses. On the code before, the first renewal came at 7 s, the lease lapsed
    at 6 s, and the primary refused that renewal (lease_expired)."""

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

    # Renewed when the loop is free (5 s) and a heartbeat later (7 s).
    with lease_held(redis_url, namespace, "charge", renewed=2):
        assert asyncio.run(run()) == "ch_1"


def test_a_sync_function_that_blocks_keeps_its_lease(redis_url: str, namespace: str) -> None:
    """The sync decorator's neighbour: its heartbeat threads renew while the function
    blocks, the first renewal a heartbeat after the reservation was sent. The primary grants
    them: with the heartbeat's renewals disabled this passed on the reader's reads alone
    (nothing sent, nothing refused), and a starved reader would have missed the lapse."""
    with Settler.from_url(redis_url, namespace=namespace, shards=4) as settler:

        @settler.operation(key="charge", principal="tenant:acme", lease=LEASE)
        def charge() -> str:
            time.sleep(BLOCK + AFTER)
            return "ch_1"

        assert settler.get("charge") is None
        # Renewals at 2, 4 and 6 s of the 8 s call: two at least, beside a loaded machine.
        with lease_held(redis_url, namespace, "charge", renewed=2):
            assert charge() == "ch_1"


def test_a_nearer_renewal_wakes_a_heartbeat_waiting_for_a_later_one(
    redis_url: str, namespace: str
) -> None:
    """One heartbeat serves every sync attempt of a settler. It waits for a long lease's
    first renewal (4 s away) when a call with a 2 s lease starts: that call's add must wake
    it (its Condition notified, the lock held) or the short lease lapses under its running
    function. The short call runs past that wake-up (5 s), so an unwoken heartbeat sends
    its overdue renewal while the call runs and the primary refuses it (lease_expired):
    with the long lease's renewal 20 s away, nothing was sent before the call ended and
    only the reader's reads could see the lapse."""
    with Settler.from_url(redis_url, namespace=namespace, shards=4) as settler:
        started, release = threading.Event(), threading.Event()

        @settler.operation(key="slow", principal="tenant:acme", lease=12.0)
        def slow() -> str:
            started.set()
            release.wait(30)
            return "slow"

        @settler.operation(key="short", principal="tenant:acme", lease=2.0)
        def short() -> str:
            time.sleep(5.0)
            return "short"

        results: list[str] = []
        holder = threading.Thread(target=lambda: results.append(slow()))
        holder.start()
        try:
            assert started.wait(10)
            time.sleep(0.2)  # the heartbeat is waiting for the slow lease's renewal
            # A renewal every 0.67 s of the 5 s call: three at least, beside a loaded machine.
            with lease_held(redis_url, namespace, "short", renewed=3):
                assert short() == "short"
        finally:
            release.set()
            holder.join()
    assert results == ["slow"]
