"""``min_replicas`` seen through settle's surfaces (the decorator, the HTTP guards) while a
replica is down: a ``reserve`` that raises ``DurabilityError``, on a key already completed
(a replay, which writes nothing but the probe) and on a new key (whose reservation the
primary holds). Real primaries and replicas, Redis and Valkey, a replica frozen with
SIGSTOP."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from settle import AsyncSettler, DurabilityError, Settler, State
from settle._core.scripts import SCRIPTS
from settle.asgi import IdempotencyMiddleware
from settle.embedded import EmbeddedRedis
from settle.http.keys import operation_id
from tests.faults.servers import REPLICA_TIMEOUT, frozen, script_needle
from tests.faults.tcp_proxy import FaultyProxy
from tests.faults.test_faults_durable_reads import pair
from tests.http.apps import (
    Ledger,
    key_headers,
    principal_from_header,
    serve,
    serve_wsgi,
    starlette_app,
    wsgi_app,
)
from tests.log_sink import logs_behind_a_failing_sink

__all__ = ["pair"]

pytestmark = [pytest.mark.faults]


def _options() -> dict[str, Any]:
    return {"shards": 4, "min_replicas": 1, "replica_timeout": REPLICA_TIMEOUT}


def _lease_held(logs: list[dict[str, Any]], reasons: list[str | None]) -> None:
    """The lease never lapsed under a function that ran 3.5 s on a 1.2 s lease while every
    renewal waited 0.9 s for a frozen replica, judged on the primary's clock: Redis wrote at
    least three renewals (each then failed its WAIT: ``durability_failed``) and refused none
    for a lease that had ended (``lease_expired``, rule N5) or passed on. A count of the
    reader's reads (> 100 was asserted) measured how often a busy CI worker gave it a CPU."""
    sent = [
        e
        for e in logs
        if e["event"] == "settle.backend.durability_failed" and e["script"] == "renew"
    ]
    assert len(sent) >= 3, logs
    # (A renewal sent as the operation completed finds it not pending: no lapse, that.)
    lost = [e for e in logs if e["event"] == "settle.renew.lost" and e["reason"] != "not_pending"]
    assert not lost, lost
    assert reasons, "the reader never saw the record"
    assert "lease_expired" not in reasons


def test_a_decorated_call_whose_reservation_was_not_acknowledged_runs_once_the_replica_is_back(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str
) -> None:
    """The reservation of a new key is on the primary when ``reserve`` raises
    ``DurabilityError`` and the function does not run. It used to hold the key for the whole
    lease: once the replica was back, the caller's next call waited ``wait`` and got
    ``OperationInProgress`` ("being run by attempt ..."), though nothing ran it. The call
    releases its own reservation: the next call runs the function, once."""
    primary, replica = pair
    runs: list[str] = []
    with Settler.from_url(primary.url, namespace=namespace, **_options()) as settler:

        @settler.operation(key="charge:{order}", principal="tenant:acme", wait=1.0)
        def charge(order: str) -> dict[str, str]:
            runs.append(order)
            return {"charge": f"ch_{order}"}

        assert charge("1") == {"charge": "ch_1"}
        with frozen(replica):
            with pytest.raises(DurabilityError):  # a replay: the function does not run again
                charge("1")
            with pytest.raises(DurabilityError):  # a new key: it does not run either
                charge("2")
        assert runs == ["1"]
        record = settler.get("charge:2")
        assert record is not None
        assert record.state is State.PROVISIONAL
        assert charge("1") == {"charge": "ch_1"}
        assert charge("2") == {"charge": "ch_2"}
        assert runs == ["1", "2"]


@pytest.mark.asyncio
@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_decorated_call_raises_the_reserves_durability_error_when_the_release_cannot_read(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str, flavour: str
) -> None:
    """The release reads the record before it marks its reservation provisional; a read
    that fails (here a proxy drops every ``get``: the primary out of reach for reads) must
    not replace what the caller is told, the ``DurabilityError`` of its ``reserve`` (a
    caller that catches it to retry later got a ``BackendError`` instead)."""
    primary, replica = pair
    proxy = FaultyProxy(primary.port).start()
    runs: list[str] = []
    try:
        if flavour == "sync":
            with Settler.from_url(proxy.url, namespace=namespace, **_options()) as settler:

                @settler.operation(key="charge:{order}", principal="tenant:acme", wait=1.0)
                def charge(order: str) -> str:
                    runs.append(order)
                    return order

                charge("0")
                proxy.cut(script_needle(SCRIPTS, "get"), "before_request", times=100)
                with frozen(replica), pytest.raises(DurabilityError):
                    charge("1")
        else:
            async with AsyncSettler.from_url(proxy.url, namespace=namespace, **_options()) as a:

                @a.operation(key="charge:{order}", principal="tenant:acme", wait=1.0)
                async def acharge(order: str) -> str:
                    runs.append(order)
                    return order

                await acharge("0")
                proxy.cut(script_needle(SCRIPTS, "get"), "before_request", times=100)
                with frozen(replica), pytest.raises(DurabilityError):
                    await acharge("1")
        assert runs == ["0"]
        assert "before_request" in proxy.fired  # the release's read was cut indeed
    finally:
        proxy.close()


@pytest.mark.asyncio
async def test_an_async_decorated_call_whose_reservation_was_not_acknowledged_runs_once_back(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str
) -> None:
    primary, replica = pair
    runs: list[str] = []
    settler = AsyncSettler.from_url(primary.url, namespace=namespace, **_options())
    try:

        @settler.operation(key="charge:{order}", principal="tenant:acme", wait=1.0)
        async def charge(order: str) -> dict[str, str]:
            runs.append(order)
            return {"charge": f"ch_{order}"}

        assert await charge("1") == {"charge": "ch_1"}  # the namespace is written
        with frozen(replica), pytest.raises(DurabilityError):
            await charge("2")
        assert runs == ["1"]
        assert await charge("2") == {"charge": "ch_2"}
        assert runs == ["1", "2"]
    finally:
        await settler.aclose()


def _guarded_calls(base: str, path: str, ledger: Ledger, replica: EmbeddedRedis) -> None:
    """A request run once, then while the replica is down its replay and a new key's
    request, then both again once the replica is back: what each client sees."""
    body = {"amount": 1000}
    with httpx.Client(base_url=base, timeout=10) as client:
        first = client.post(path, json=body, headers=key_headers("paid"))
        assert first.status_code == 201
        with frozen(replica):
            for key in ("paid", "new"):
                answer = client.post(path, json=body, headers=key_headers(key))
                assert answer.status_code == 503, (key, answer.text)
                assert answer.headers["retry-after"] == "1"
                detail = answer.json()["detail"]
                # It was reached and answered: no replica confirmed the record, so the
                # handler did not run for this request (the replay's had, before).
                assert "cannot be reached" not in detail, detail
                assert "replicas" in detail, detail
        assert ledger.count(path) == 1
        replayed = client.post(path, json=body, headers=key_headers("paid"))
        assert (replayed.status_code, replayed.content) == (201, first.content)
        # The new key's reservation, written while the replica was down, is not left to
        # answer "still being processed" (409) until its lease ends: the retry runs it.
        retried = client.post(path, json=body, headers=key_headers("new"))
        assert retried.status_code == 201, retried.text
        assert ledger.count(path) == 2


@pytest.mark.parametrize("shell", ["wsgi", "asgi"])
def test_a_request_whose_reservation_was_not_acknowledged_runs_on_its_retry(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str, shell: str
) -> None:
    """The sync shell (WSGI, and the Django and Flask integrations on it) and the ASGI one
    (Starlette under uvicorn)."""
    primary, replica = pair
    ledger = Ledger()
    if shell == "wsgi":
        settler = Settler.from_url(primary.url, namespace=namespace, **_options())
        with settler, serve_wsgi(wsgi_app(settler, ledger)) as base:
            _guarded_calls(base, "/payments", ledger, replica)
        return
    durable = AsyncSettler.from_url(primary.url, namespace=namespace, **_options())
    with serve(starlette_app(durable, ledger), durable) as base:
        _guarded_calls(base, "/payments", ledger, replica)


@pytest.mark.asyncio
@pytest.mark.parametrize("failing_sink", [False, True], ids=["", "a-log-sink-that-raises"])
async def test_an_async_heartbeat_whose_renewals_wait_for_a_replica_keeps_the_lease(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str, failing_sink: bool
) -> None:
    """With ``min_replicas`` a renewal waits up to ``replica_timeout`` for the replica. The
    async heartbeat slept ``lease / 3`` after each renewal returned, so a renewal that
    waited pushed every later one back: with a 0.9 s wait on a 1.2 s lease, renewals went
    1.3 s apart and the lease lapsed between them under the running function (another
    caller could take the key over). The sync heartbeat sends the next one ``lease / 3``
    after the last was sent; so does the async one now. Its log line of a failed renewal
    (``heartbeat_failed``) is dropped when it cannot be written, as the sync one's: a
    processor that raised ended the heartbeat at the first failed renewal."""
    primary, replica = pair
    settler = AsyncSettler.from_url(
        primary.url, namespace=namespace, shards=4, min_replicas=1, replica_timeout=0.9
    )
    reasons: list[str | None] = []  # of every read of the record while the function ran
    try:
        assert await settler.get("charge") is None  # the namespace is written, acknowledged

        @settler.operation(key="charge", principal="tenant:acme", lease=1.2)
        async def charge() -> str:
            with frozen(replica):  # every renewal waits replica_timeout, then raises
                await asyncio.sleep(3.5)
            return "ch_1"

        async def watch() -> None:
            while True:
                record = await settler.get("charge")  # a read: it never waits
                if record is not None:
                    reasons.append(record.reason)
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch())
        try:
            refused = ("settle.operation.",) if failing_sink else ()
            with logs_behind_a_failing_sink(refused) as logs:
                assert await charge() == "ch_1"
        finally:
            watcher.cancel()
        _lease_held(logs, reasons)
    finally:
        await settler.aclose()


@pytest.mark.parametrize("failing_sink", [False, True], ids=["", "a-log-sink-that-raises"])
def test_an_asgi_request_whose_renewals_wait_for_a_replica_keeps_its_lease(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str, failing_sink: bool
) -> None:
    """The ASGI guard's heartbeat, as the async decorator's: it slept ``lease / 3`` after
    each renewal returned, so renewals that waited 0.9 s for a stopped replica went 1.3 s
    apart on a 1.2 s lease, which lapsed under the running handler. Its log lines of a
    failed or lapsed renewal are dropped when they cannot be written, as the sync guard's
    and the async decorator's: a processor that raised ended the heartbeat task at the first
    failed renewal, and the lease lapsed under the handler."""
    primary, replica = pair
    reasons: list[str | None] = []

    async def slow(request: Request) -> Response:
        with frozen(replica):  # every renewal waits replica_timeout, then raises
            await asyncio.sleep(3.5)
        return PlainTextResponse("done", status_code=201)

    durable = AsyncSettler.from_url(
        primary.url, namespace=namespace, shards=4, min_replicas=1, replica_timeout=0.9
    )
    app = IdempotencyMiddleware(
        Starlette(routes=[Route("/slow", slow, methods=["POST"])]),
        settler=durable,
        principal=principal_from_header,
        lease=1.2,
    )
    op = operation_id("http", "slow-1", "tenant:acme", "principal")
    stop = threading.Event()
    with Settler.from_url(primary.url, namespace=namespace, shards=4) as reader:

        def watch() -> None:
            while not stop.is_set():
                record = reader.get(op)  # a read on the primary: it never waits
                if record is not None:
                    reasons.append(record.reason)
                time.sleep(0.01)

        with serve(app, durable) as base, httpx.Client(base_url=base, timeout=10) as client:
            assert reader.get(op) is None  # the namespace, written and acknowledged
            watcher = threading.Thread(target=watch)
            watcher.start()
            try:
                refused = ("settle.http.renew_failed", "settle.http.lease_lapsed")
                with logs_behind_a_failing_sink(refused if failing_sink else ()) as logs:
                    answer = client.post("/slow", content=b"x", headers=key_headers("slow-1"))
            finally:
                stop.set()
                watcher.join()
    assert answer.status_code == 201, answer.text
    _lease_held(logs, reasons)
