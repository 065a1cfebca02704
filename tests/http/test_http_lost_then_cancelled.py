"""A request whose lease was lost while its stop was put off (the handler's own
``asyncio.timeout`` was cancelling it), and which the server then cancels (its shutdown):
reported as every other way out of a lost lease is (``settle.http.abandoned``,
``lease_lost``; outcome ``superseded``), and it settles nothing. A real Redis; the
middleware called directly."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from structlog.testing import capture_logs

from settle import AsyncSettler
from settle.asgi import IdempotencyMiddleware
from tests.http.apps import post_scope
from tests.http.test_http_abandoned import (
    _Client,
    _OutlastsItsLease,
    _settled_by_the_retry_alone,
    _takes_over,
)

pytestmark = pytest.mark.asyncio


async def test_the_servers_cancellation_after_a_lost_lease_is_reported_abandoned(
    async_settler: AsyncSettler,
) -> None:
    async def still_cleaning() -> None:
        await asyncio.sleep(10)  # when the server cancels

    cleanup = _OutlastsItsLease(still_cleaning)
    entered = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        entered.set()
        async with asyncio.timeout(0.05):
            try:
                await asyncio.sleep(10)  # the downstream call
            except asyncio.CancelledError:
                await cleanup()
                raise

    first = _Client()
    mw = IdempotencyMiddleware(
        app, settler=async_settler, principal=lambda s: "tenant:a", lease=0.3
    )
    with capture_logs() as logs:
        task = asyncio.create_task(mw(post_scope(b"k-lost-cancelled"), first.receive, first.send))
        await entered.wait()
        await cleanup.cleaning.wait()
        retry = await _takes_over(async_settler, b"k-lost-cancelled")
        cleanup.retried.set()
        await cleanup.lost.wait()  # the loss is found; its stop is put off for a while
        task.cancel()  # the server's shutdown, within that while
        with pytest.raises(asyncio.CancelledError):
            await task
    assert retry.status == 201
    lost = [e for e in logs if e["event"] == "settle.http.lease_lost"]
    assert lost, "the heartbeat found the lease lost before the server cancelled"
    abandoned = [e["reason"] for e in logs if e["event"] == "settle.http.abandoned"]
    assert abandoned == ["lease_lost"]
    await _settled_by_the_retry_alone(async_settler, "k-lost-cancelled")
