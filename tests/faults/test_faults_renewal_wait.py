"""A renewal under ``min_replicas`` waits for its replicas at most a heartbeat (``lease / 3``),
whatever ``replica_timeout`` says. It waited ``replica_timeout``: a heartbeat sends one
renewal at a time, so with a replica stopped (SIGSTOP: its primary still counts it, and WAIT
runs to its timeout) the renewals went ``replica_timeout`` apart, and a lease not much longer
than that lapsed under the running function (another caller could take the key over and
run the paid operation again). Real primaries and replicas, Redis and Valkey; every
surface's heartbeat: the sync and async decorators, the ASGI and WSGI guards."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from settle import AsyncSettler, DurabilityError, Reserved, Settler
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

__all__ = ["pair"]

pytestmark = [pytest.mark.faults]

LEASE = 1.2
# Longer than the lease: a renewal that waited this long let the lease lapse every time.
SLOW_REPLICA = 2.5
HELD = 3.5  # how long the function runs with the replica stopped: several heartbeats


def _durable(kind: type[Settler] | type[AsyncSettler], url: str, namespace: str) -> Any:
    return kind.from_url(
        url, namespace=namespace, shards=4, min_replicas=1, replica_timeout=SLOW_REPLICA
    )


@contextmanager
def _watching(url: str, namespace: str, op: str) -> Iterator[list[str | None]]:
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


def _sync_decorator(primary: EmbeddedRedis, replica: EmbeddedRedis, namespace: str) -> Any:
    with _durable(Settler, primary.url, namespace) as settler:

        @settler.operation(key="charge", principal="tenant:acme", lease=LEASE)
        def charge() -> str:
            with frozen(replica):
                time.sleep(HELD)
            return "ch_1"

        with _watching(primary.url, namespace, "charge") as reasons:
            assert charge() == "ch_1"
    return reasons


def _async_decorator(primary: EmbeddedRedis, replica: EmbeddedRedis, namespace: str) -> Any:
    async def run() -> str:
        settler = _durable(AsyncSettler, primary.url, namespace)
        try:

            @settler.operation(key="charge", principal="tenant:acme", lease=LEASE)
            async def charge() -> str:
                with frozen(replica):
                    await asyncio.sleep(HELD)
                return "ch_1"

            return await charge()
        finally:
            await settler.aclose()

    with _watching(primary.url, namespace, "charge") as reasons:
        assert asyncio.run(run()) == "ch_1"
    return reasons


def _asgi(primary: EmbeddedRedis, replica: EmbeddedRedis, namespace: str) -> Any:
    async def slow(request: Request) -> Response:
        with frozen(replica):
            await asyncio.sleep(HELD)
        return PlainTextResponse("done", status_code=201)

    durable = _durable(AsyncSettler, primary.url, namespace)
    app = AsgiMiddleware(
        Starlette(routes=[Route("/slow", slow, methods=["POST"])]),
        settler=durable,
        principal=principal_from_header,
        lease=LEASE,
    )
    op = operation_id("http", "slow-1", "tenant:acme", "principal")
    with (
        _watching(primary.url, namespace, op) as reasons,
        serve(app, durable) as base,
        httpx.Client(base_url=base, timeout=15) as client,
    ):
        answer = client.post("/slow", content=b"x", headers=key_headers("slow-1"))
    assert answer.status_code == 201, answer.text
    return reasons


def _wsgi(primary: EmbeddedRedis, replica: EmbeddedRedis, namespace: str) -> Any:
    def slow(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        with frozen(replica):
            time.sleep(HELD)
        start_response("201 Created", [("Content-Type", "text/plain")])
        return [b"done"]

    op = operation_id("http", "slow-1", "tenant:acme", "principal")
    with _durable(Settler, primary.url, namespace) as durable:
        app = WsgiMiddleware(slow, settler=durable, principal=principal_from_environ, lease=LEASE)
        with (
            _watching(primary.url, namespace, op) as reasons,
            serve_wsgi(app) as base,
            httpx.Client(base_url=base, timeout=15) as client,
        ):
            answer = client.post("/slow", content=b"x", headers=key_headers("slow-1"))
    assert answer.status_code == 201, answer.text
    return reasons


SURFACES: dict[str, Callable[[EmbeddedRedis, EmbeddedRedis, str], list[str | None]]] = {
    "sync-decorator": _sync_decorator,
    "async-decorator": _async_decorator,
    "asgi": _asgi,
    "wsgi": _wsgi,
}


@pytest.mark.parametrize("surface", list(SURFACES))
def test_a_heartbeat_keeps_the_lease_while_a_replica_is_slower_than_the_lease(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str, surface: str
) -> None:
    """``replica_timeout`` (2.5 s) longer than the lease (1.2 s), the replica stopped while
    the function runs: every renewal goes unacknowledged, yet the lease never lapses on the
    primary (each renewal gives up on its replicas when the next is due). It lapsed at
    about 1.6 s on the code before, the first renewal still waiting."""
    primary, replica = pair
    reasons = SURFACES[surface](primary, replica, namespace)
    assert len(reasons) > 100, reasons
    assert "lease_expired" not in reasons


def test_a_renewal_says_how_long_it_waited_for_its_replicas(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str
) -> None:
    """The renewal's :class:`DurabilityError` names the wait it made (a third of the lease
    it renews), not ``replica_timeout``; the lease is renewed on the primary all the same."""
    primary, replica = pair
    with _durable(Settler, primary.url, namespace) as settler:
        reserved = settler.reserve("charge", {"amount": 1}, principal="tenant:acme", lease=LEASE)
        assert isinstance(reserved, Reserved)
        with frozen(replica), pytest.raises(DurabilityError) as raised:
            settler.renew(reserved.reservation, lease=3.0)
        assert "0 of 1 replicas acknowledged within 1000 ms" in str(raised.value)
        record = settler.get("charge")
        assert record is not None
        assert record.reason is None
