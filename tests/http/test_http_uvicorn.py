"""IdempotencyMiddleware behind a real uvicorn server on a loopback port, with real httpx
clients over sockets: the concurrency and client-disconnect cases."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from settle import AsyncSettler, Settler, State
from settle.asgi.keys import operation_id
from tests.http.apps import Ledger, key_headers, serve, starlette_app

pytestmark = pytest.mark.asyncio


async def test_fifty_concurrent_requests_with_one_key(
    redis_url: str, namespace: str, ledger: Ledger
) -> None:
    app_settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
    with serve(starlette_app(app_settler, ledger), app_settler) as base:
        limits = httpx.Limits(max_connections=50, max_keepalive_connections=50)
        async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:
            # Open 50 connections first, so the 50 POSTs below leave at the same moment.
            await asyncio.gather(*(client.get("/open") for _ in range(50)))

            body = {"amount": 999, "currency": "EUR"}
            posts = [
                asyncio.create_task(client.post("/gated", json=body, headers=key_headers("k-50")))
                for _ in range(50)
            ]
            # The gate stays shut while the first request runs, until the 49 others have
            # their answers (on a loaded machine a fixed delay let them all arrive late).
            pending: set[asyncio.Task[httpx.Response]] = set(posts)
            async with asyncio.timeout(20):
                while len(pending) > 1:
                    _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            ledger.gate.set()
            responses = await asyncio.gather(*posts)
            later = await client.post("/gated", json=body, headers=key_headers("k-50"))

    assert ledger.count("/gated") == 1
    fresh = [
        r for r in responses if r.status_code == 201 and "idempotent-replayed" not in r.headers
    ]
    assert len(fresh) == 1
    first = fresh[0]
    for response in [*responses, later]:
        if response.status_code == 409:
            assert response.headers["retry-after"] == "1"
            assert response.json()["type"] == "urn:settle:problem:request-in-progress"
        else:
            assert response.status_code == 201
            assert response.content == first.content
    assert sum(r.status_code == 409 for r in responses) == 49  # all while the first ran
    assert later.headers["idempotent-replayed"] == "true"


async def test_client_disconnect_mid_handler_stores_nothing_and_the_retry_runs(
    redis_url: str, namespace: str, ledger: Ledger, settler: Settler
) -> None:
    app_settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
    op = operation_id("http", "k-gone", "tenant:acme", "principal")
    with serve(starlette_app(app_settler, ledger), app_settler) as base:
        impatient = httpx.Timeout(10.0, read=0.5)
        async with httpx.AsyncClient(base_url=base, timeout=impatient) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.post("/gated", json={"amount": 5}, headers=key_headers("k-gone"))
        # The client closed its connection: uvicorn reports http.disconnect, the middleware
        # cancels the handler and marks the attempt provisional. Nothing was stored.
        async with asyncio.timeout(10):
            while not ledger.cancelled:  # noqa: ASYNC110 - set from the server's thread
                await asyncio.sleep(0.02)
            record = settler.get(op)
            while record is not None and record.state is State.PENDING:
                await asyncio.sleep(0.02)
                record = settler.get(op)
        assert len(ledger.cancelled) == 1
        assert record is not None
        assert (record.state, record.reason) == (State.PROVISIONAL, "client_disconnect")
        assert record.result is None
        assert ledger.count("/gated") == 0

        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            retried = await client.post("/gated", json={"amount": 5}, headers=key_headers("k-gone"))
            replayed = await client.post(
                "/gated", json={"amount": 5}, headers=key_headers("k-gone")
            )
    assert retried.status_code == 201
    assert "idempotent-replayed" not in retried.headers
    assert retried.json()["generation"] > ledger.cancelled[0]
    assert replayed.content == retried.content
    assert replayed.headers["idempotent-replayed"] == "true"
    assert ledger.count("/gated") == 1
