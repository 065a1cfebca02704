"""A renewal under ``min_replicas`` waits for its replicas at most a heartbeat (``lease / 3``),
whatever ``replica_timeout`` says. It waited ``replica_timeout``: a heartbeat sends one
renewal at a time, so with a replica stopped (SIGSTOP: its primary still counts it, and WAIT
runs to its timeout) the renewals went ``replica_timeout`` apart, and a lease not much longer
than that lapsed under the running function (another caller could take the key over and
run the paid operation again). Real primaries and replicas, Redis and Valkey; every
surface's heartbeat: the sync and async decorators, the ASGI and WSGI guards."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from structlog.testing import capture_logs

from settle import AsyncSettler, DurabilityError, Reserved, Settler, StaleAttempt
from settle.asgi import IdempotencyMiddleware as AsgiMiddleware
from settle.embedded import EmbeddedRedis
from settle.http.keys import operation_id
from settle.wsgi import IdempotencyMiddleware as WsgiMiddleware
from tests.faults.servers import frozen
from tests.faults.test_faults_durable_reads import pair
from tests.http.apps import (
    key_headers,
    principal_from_environ,
    principal_from_header,
    serve,
    serve_wsgi,
)
from tests.stopwatch import Stopwatch

__all__ = ["pair"]

pytestmark = [pytest.mark.faults]

LEASE = 1.2
# Longer than the lease: a renewal that waited this long let the lease lapse every time.
SLOW_REPLICA = 2.5
HELD = 3.5  # how long the function runs with the replica stopped: several heartbeats
# The heartbeat test's: as above, twice as long. A 1.2 s lease renewed every 0.4 s lapsed
# on the primary beside busy CI workers that held the process 0.8 s (its reader too, which
# saw nothing); 2.4 s is renewed every 0.8 s. The renewal that waited 5 s came after the
# lease ended, within HEARTBEAT_HELD.
HEARTBEAT_LEASE = 2.4
HEARTBEAT_REPLICA = 5.0
HEARTBEAT_HELD = 7.0


# The reservation's replica acknowledges it LATE_ACK after it was written: under LATE_LEASE,
# later than two thirds of it (a first renewal due a heartbeat after reserve returned comes
# LATE_ACK + LATE_LEASE / 3 after the write, after the lease ended) yet before its end.
# (Twice the 3 s, 2.4 s, 4 s first written: a loaded machine's holds of 0.8 s lapsed those.)
LATE_LEASE = 6.0
LATE_ACK = 4.8
LATE_REPLICA = 8.0  # replica_timeout: the reservation waits for its late acknowledgement
LATE_HELD = 3.0  # how long the function runs after it: a few heartbeats


@dataclass(frozen=True)
class Case:
    """What a surface runs: ``lease``, ``replica_timeout``; ``around(replica)`` holds the
    call (the reservation included), ``during(replica)`` the function or handler, which
    runs ``held`` seconds."""

    lease: float
    replica_timeout: float
    held: float
    around: Callable[[EmbeddedRedis], AbstractContextManager[object]]
    during: Callable[[EmbeddedRedis], AbstractContextManager[object]]
    after: float = 0.0
    """How long a decorator's settler stays open after the call returned."""


def _untouched(replica: EmbeddedRedis) -> AbstractContextManager[object]:
    return nullcontext()


@contextmanager
def _acknowledging_late(replica: EmbeddedRedis) -> Iterator[None]:
    """Stop ``replica`` now and let it go on LATE_ACK later, the block still running: it
    acknowledges the reservation late, but within ``replica_timeout``."""
    assert replica.process is not None
    pid = replica.process.pid
    os.kill(pid, signal.SIGSTOP)
    thaw = threading.Timer(LATE_ACK, os.kill, (pid, signal.SIGCONT))
    thaw.start()
    try:
        yield
    finally:
        thaw.cancel()
        thaw.join()
        os.kill(pid, signal.SIGCONT)


#: The replica stopped while the function runs: every renewal goes unacknowledged.
STOPPED_WHILE_RUNNING = Case(LEASE, SLOW_REPLICA, HELD, _untouched, frozen)
#: As above, with a lease a loaded machine does not lapse (HEARTBEAT_LEASE).
STOPPED_UNDER_A_LONGER_LEASE = Case(
    HEARTBEAT_LEASE, HEARTBEAT_REPLICA, HEARTBEAT_HELD, _untouched, frozen
)
#: The replica acknowledges the reservation late: its first renewal is due early.
LATE_RESERVATION = Case(LATE_LEASE, LATE_REPLICA, LATE_HELD, _acknowledging_late, _untouched)


def _durable(kind: type[Settler] | type[AsyncSettler], url: str, namespace: str, case: Case) -> Any:
    return kind.from_url(
        url, namespace=namespace, shards=4, min_replicas=1, replica_timeout=case.replica_timeout
    )


@contextmanager
def watching(url: str, namespace: str, op: str) -> Iterator[list[str | None]]:
    """The reason of every read of ``op``'s record (on the primary: a read never waits)
    while the block runs."""
    reasons: list[str | None] = []
    stop = threading.Event()
    with Settler.from_url(url, namespace=namespace, shards=4) as reader:
        assert reader.get(op) is None  # the namespace, written and acknowledged

        def watch() -> None:
            while not stop.is_set():
                record = reader.get(op)
                if record is not None:
                    reasons.append(record.reason)
                time.sleep(0.01)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            yield reasons
        finally:
            stop.set()
            watcher.join()


def _warm(client: httpx.Client) -> None:
    """A guarded request that returns at once, before the replica stops: the settler's first
    call makes its checks of the server, which the reservation under test must not wait for."""
    answer = client.post("/warm", content=b"x", headers=key_headers("warm-1"))
    assert answer.status_code == 201, answer.text


#: The operation the guards' POST /slow (key ``slow-1``) runs.
HTTP_OP = operation_id("http", "slow-1", "tenant:acme", "principal")

Surface = Callable[[EmbeddedRedis, EmbeddedRedis, str, Case], list[str | None]]


def _lease_held_throughout(
    surface: str, pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str, case: Case
) -> list[str | None]:
    """Run ``surface`` as ``case`` says and check, on the primary's clock, that the lease
    never lapsed under it: no renewal was refused for a lease that had ended
    (``lease_expired``, rule N5: the primary compares the lease with its own time) or passed
    to another generation. That does not depend on how often the reader of ``watching`` was
    given a CPU, as a count of its reads did (77 beside busy CI workers, where > 100 was
    asserted). The reasons that reader saw are returned."""
    primary, replica = pair
    with capture_logs() as logs:
        reasons = SURFACES[surface](primary, replica, namespace, case)
    # (A renewal sent as the operation completed finds it not pending: no lapse, that.)
    lost = [e for e in logs if e["event"] == "settle.renew.lost" and e["reason"] != "not_pending"]
    assert not lost, lost
    assert reasons, "the reader never saw the record"
    return reasons


def _sync_decorator(
    primary: EmbeddedRedis, replica: EmbeddedRedis, namespace: str, case: Case
) -> list[str | None]:
    with _durable(Settler, primary.url, namespace, case) as settler:

        @settler.operation(key="charge", principal="tenant:acme", lease=case.lease)
        def charge() -> str:
            with case.during(replica):
                time.sleep(case.held)
            return "ch_1"

        assert settler.get("charge") is None  # its first call's checks, before the replica stops
        with watching(primary.url, namespace, "charge") as reasons, case.around(replica):
            assert charge() == "ch_1"
        time.sleep(case.after)
    return reasons


def _async_decorator(
    primary: EmbeddedRedis, replica: EmbeddedRedis, namespace: str, case: Case
) -> list[str | None]:
    async def run() -> str:
        settler = _durable(AsyncSettler, primary.url, namespace, case)
        try:

            @settler.operation(key="charge", principal="tenant:acme", lease=case.lease)
            async def charge() -> str:
                with case.during(replica):
                    await asyncio.sleep(case.held)
                return "ch_1"

            assert await settler.get("charge") is None  # its first call's checks, as above
            with case.around(replica):
                done = await charge()
            await asyncio.sleep(case.after)
            return done
        finally:
            await settler.aclose()

    with watching(primary.url, namespace, "charge") as reasons:
        assert asyncio.run(run()) == "ch_1"
    return reasons


def _asgi(
    primary: EmbeddedRedis, replica: EmbeddedRedis, namespace: str, case: Case
) -> list[str | None]:
    async def slow(request: Request) -> Response:
        if request.url.path == "/warm":
            return PlainTextResponse("warm", status_code=201)
        with case.during(replica):
            await asyncio.sleep(case.held)
        return PlainTextResponse("done", status_code=201)

    durable = _durable(AsyncSettler, primary.url, namespace, case)
    app = AsgiMiddleware(
        Starlette(routes=[Route(path, slow, methods=["POST"]) for path in ("/slow", "/warm")]),
        settler=durable,
        principal=principal_from_header,
        lease=case.lease,
    )
    return _guarded_post(primary, replica, namespace, case, serve(app, durable))


def _wsgi(
    primary: EmbeddedRedis, replica: EmbeddedRedis, namespace: str, case: Case
) -> list[str | None]:
    def slow(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        if environ["PATH_INFO"] == "/warm":
            start_response("201 Created", [("Content-Type", "text/plain")])
            return [b"warm"]
        with case.during(replica):
            time.sleep(case.held)
        start_response("201 Created", [("Content-Type", "text/plain")])
        return [b"done"]

    with _durable(Settler, primary.url, namespace, case) as durable:
        app = WsgiMiddleware(
            slow, settler=durable, principal=principal_from_environ, lease=case.lease
        )
        return _guarded_post(primary, replica, namespace, case, serve_wsgi(app))


def _guarded_post(
    primary: EmbeddedRedis,
    replica: EmbeddedRedis,
    namespace: str,
    case: Case,
    server: AbstractContextManager[str],
) -> list[str | None]:
    """POST /slow (key ``slow-1``) to the guarded app ``server`` runs, after a warm-up
    request, the replica handled as ``case`` says; the reasons a reader saw meanwhile."""
    op = HTTP_OP
    with (
        watching(primary.url, namespace, op) as reasons,
        server as base,
        httpx.Client(base_url=base, timeout=15) as client,
    ):
        _warm(client)
        with case.around(replica):
            answer = client.post("/slow", content=b"x", headers=key_headers("slow-1"))
    assert answer.status_code == 201, answer.text
    return reasons


SURFACES: dict[str, Surface] = {
    "sync-decorator": _sync_decorator,
    "async-decorator": _async_decorator,
    "asgi": _asgi,
    "wsgi": _wsgi,
}


@pytest.mark.parametrize("surface", list(SURFACES))
def test_a_heartbeat_keeps_the_lease_while_a_replica_is_slower_than_the_lease(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str, surface: str
) -> None:
    """``replica_timeout`` (5 s) longer than the lease (2.4 s), the replica stopped while
    the function runs: every renewal goes unacknowledged, yet the lease never lapses on the
    primary (each renewal gives up on its replicas when the next is due). It lapsed at
    about 3.2 s on the code before, the first renewal still waiting."""
    reasons = _lease_held_throughout(surface, pair, namespace, STOPPED_UNDER_A_LONGER_LEASE)
    assert "lease_expired" not in reasons


@pytest.mark.parametrize("surface", list(SURFACES))
def test_a_late_acknowledged_reservation_is_renewed_before_its_lease_ends(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str, surface: str
) -> None:
    """The replica acknowledges the reservation 4.8 s after it was written, within
    ``replica_timeout`` (8 s) and the lease (6 s): the first renewal is due a heartbeat
    after the reservation was sent (at once, here), as each later one is due after the one
    before was sent, and the lease never lapses. It was due a heartbeat after ``reserve``
    returned, 6.8 s after the write: the lease lapsed for 0.8 s before the function had
    begun, and another caller could take the key over and run it again (the primary
    refuses that renewal: ``lease_expired``)."""
    reasons = _lease_held_throughout(surface, pair, namespace, LATE_RESERVATION)
    assert "lease_expired" not in reasons


@pytest.mark.parametrize(
    ("lease", "waited_ms"),
    [(3.0, 1000), (30.0, 2500)],
    ids=["a-third-of-the-lease", "replica-timeout"],
)
def test_a_renewal_says_how_long_it_waited_for_its_replicas(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str, lease: float, waited_ms: int
) -> None:
    """The renewal's :class:`DurabilityError` names the wait it made: a third of the lease
    it renews, or ``replica_timeout`` (2.5 s) when that is shorter (a renewal of a 30 s
    lease waits no longer than any other transition). The lease is renewed on the primary
    all the same: it holds past the end of the one it renewed."""
    primary, replica = pair
    with _durable(Settler, primary.url, namespace, STOPPED_WHILE_RUNNING) as settler:
        reserved = settler.reserve("charge", {"amount": 1}, principal="tenant:acme", lease=LEASE)
        assert isinstance(reserved, Reserved)
        ends = time.monotonic() + LEASE
        clock = Stopwatch()
        with frozen(replica), pytest.raises(DurabilityError) as raised:
            settler.renew(reserved.reservation, lease=lease)
        assert f"0 of 1 replicas acknowledged within {waited_ms} ms;" in str(raised.value)
        # The wait it names is the wait it made (Redis checks WAIT timeouts at hz: + 0.1 s).
        # The upper bound is on the time this test was not kept waiting for a CPU (a loaded
        # machine holds it past 0.6 s); the primary's own waits overlap the test's, and are
        # not taken off (tests/stopwatch.py).
        assert waited_ms / 1000 - 0.05 < clock.elapsed()
        assert clock.unloaded() < waited_ms / 1000 + 0.6
        time.sleep(max(0.0, ends + 0.3 - time.monotonic()))
        record = settler.get("charge")
        assert record is not None
        assert record.reason is None


#: The replica stopped while the function runs (1.5 s) and let go as it returns: the first
#: renewal, sent a heartbeat (1 s) after the reservation, still waits for it (up to 1 s).
#: The settler stays open a heartbeat and a half after the call: the renewal comes back, and
#: a next one would be due.
IN_FLIGHT_AT_THE_END = Case(3.0, SLOW_REPLICA, 1.5, _untouched, frozen, after=1.5)


@pytest.mark.parametrize("surface", ["sync-decorator", "async-decorator"])
def test_a_renewal_on_its_way_as_the_function_returns_is_logged(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str, surface: str
) -> None:
    """A renewal sent while the replica was stopped still waits for it when the function
    returns (and lets the replica go on): the primary extended the lease, the replica
    acknowledges it, and the heartbeat logs it (``settle.renew.renewed``) on both decorators,
    and sends nothing after it. The async one cancelled it as the function returned: the
    renewal, written on the primary, had no event at all, where the sync one's had."""
    primary, replica = pair
    with capture_logs() as logs:
        SURFACES[surface](primary, replica, namespace, IN_FLIGHT_AT_THE_END)
    events = [e["event"] for e in logs]
    # Renewed, and no other renewal was sent: before it (none failed) or after it (the
    # completed record's renewal would be refused: not_pending).
    assert events.count("settle.renew.renewed") == 1, events
    assert "settle.operation.heartbeat_failed" not in events, events
    assert "settle.renew.lost" not in events, events


def test_a_renewal_that_comes_back_lost_after_the_call_stops_nothing(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str
) -> None:
    """The async decorator's renewal on its way as the function returns comes back lost
    (another worker took the key over and completed it): the call has ended, so it stops
    nothing, as the sync heartbeat's does. Marking the ended attempt lost and expiring its
    timeout scope, long exited, raised RuntimeError in the heartbeat task, left to the loop
    as an exception nobody retrieved. The function holds the loop past its lease (the other
    worker takes over meanwhile), then awaits with the replica stopped: the overdue renewal
    is refused at once, and its reply waits for the replica until after the function ended."""
    primary, replica = pair
    unhandled: list[dict[str, Any]] = []
    started, done = threading.Event(), threading.Event()

    def take_over() -> None:
        with Settler.from_url(primary.url, namespace=namespace, shards=4) as other:

            @other.operation(key="job", principal="tenant:acme", name="job", wait=30)
            def job() -> str:
                return "second"

            started.wait(10)
            try:
                assert job() == "second"
            finally:
                done.set()

    async def run() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, c: unhandled.append(c))
        settler = AsyncSettler.from_url(
            primary.url, namespace=namespace, shards=4, min_replicas=1, replica_timeout=2.0
        )
        try:

            @settler.operation(key="job", principal="tenant:acme", name="job", lease=0.6)
            async def job() -> str:
                started.set()
                assert done.wait(10)  # holds the loop: the lease lapses, the key is taken over
                with frozen(replica):
                    await asyncio.sleep(0.05)  # the overdue renewal is sent, and waits
                return "first"

            with pytest.raises(StaleAttempt):
                await job()
            await asyncio.sleep(0.5)  # the renewal has come back
            gc.collect()  # an exception nobody retrieved is reported as its task is freed
            await asyncio.sleep(0.05)
        finally:
            await settler.aclose()

    worker = threading.Thread(target=take_over)
    worker.start()
    try:
        with capture_logs() as logs:
            asyncio.run(run())
    finally:
        worker.join()
    assert ("settle.renew.lost", "stale_generation") in [
        (e["event"], e.get("reason")) for e in logs
    ], logs
    assert not unhandled, unhandled
