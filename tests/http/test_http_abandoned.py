"""A handler that takes a while to stop after a timeout keeps its key: the client gets its
504 at the timeout, and a retry meanwhile gets 409, never a second run of the handler beside
the first (found in review: the lease used to lapse while the handler was still stopping)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from settle import AsyncSettler
from settle.asgi import IdempotencyMiddleware
from settle.asgi.keys import operation_id

pytestmark = pytest.mark.asyncio


async def test_a_stopping_handler_keeps_its_key_and_the_timeout_is_answered_on_time(
    async_settler: AsyncSettler,
) -> None:
    running = 0
    overlap = 0
    runs = 0

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal running, overlap, runs
        await receive()
        runs += 1
        running += 1
        overlap = max(overlap, running)
        try:
            try:
                await asyncio.sleep(10)  # the downstream call
            except asyncio.CancelledError:
                await asyncio.sleep(1.5)  # cleanup that must finish, then stop
                raise
        finally:
            running -= 1

    mw = IdempotencyMiddleware(
        app, settler=async_settler, principal=lambda scope: "tenant:a", timeout=0.3, lease=0.6
    )
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def request() -> tuple[int, float]:
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/pay",
            "query_string": b"",
            "headers": [(b"idempotency-key", b"k1")],
        }
        sent = False
        status: list[int] = []

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": b"x", "more_body": False}
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
                answered.append(loop.time() - started)

        answered: list[float] = []
        await mw(scope, receive, send)
        return status[0], answered[0]

    first = asyncio.create_task(request())
    await asyncio.sleep(1.0)  # past the timeout and past one lease: the handler still stops
    retry_status, _ = await request()
    first_status, first_answered_at = await first
    assert first_status == 504
    assert first_answered_at < 1.0  # answered at the timeout, not after the cleanup
    assert retry_status == 409  # the key was still held while the handler stopped
    assert (runs, overlap) == (1, 1)
    record = await async_settler.get(operation_id("http", "k1", "tenant:a", "principal"))
    assert record is not None
    assert record.reason == "timeout"
