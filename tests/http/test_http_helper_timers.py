"""The ASGI runner times its two helpers with one timer: the listener for the client leaving
is due ``LISTEN_AFTER`` (0.1 s) into the handler, the heartbeat ``lease / 3`` in, and the
first of the two moments starts its helper and times the other. Whichever comes first, a
client that leaves after 0.1 s is heard, the lease is renewed from ``lease / 3`` on, and
nothing is left to fire after the request ends (a helper started then would hold the
server's ``receive`` and the request's memory, or renew a lease nobody owns)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from settle import AsyncSettler, State
from settle.asgi import IdempotencyMiddleware
from settle.asgi.keys import operation_id
from settle.asgi.runner import LISTEN_AFTER
from tests.http.apps import post_scope as _scope

pytestmark = pytest.mark.asyncio

#: Leases whose first renewal is due after the listener (30 s: at 10 s; 0.6 s: at 0.2 s)
#: and before it (0.15 s: at 0.05 s; 0.27 s: at 0.09 s, a lease that outlasts a late loop).
_LISTENER_FIRST = (30.0, 0.6)
_HEARTBEAT_FIRST = 0.15
_HELPERS = ("AttemptRunner._listen", "AttemptRunner._renew_lease")


async def _state(settler: AsyncSettler, key: str) -> tuple[State, str | None]:
    """The state and reason of the key's record (it must exist)."""
    record = await settler.get(operation_id("http", key, "tenant:a", "principal"))
    assert record is not None
    return record.state, record.reason


class _Client:
    """A server's receive and send for one request: the body, then ``http.disconnect``
    once ``leave`` is set. Counts the calls of ``receive``."""

    def __init__(self) -> None:
        self.leave = asyncio.Event()
        self.receives = 0
        self.statuses: list[int] = []

    async def receive(self) -> dict[str, Any]:
        self.receives += 1
        if self.receives == 1:
            return {"type": "http.request", "body": b"x", "more_body": False}
        await self.leave.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.statuses.append(message["status"])


class _Handler:
    """Waits ``seconds`` (10: until stopped), then answers 201; counts its runs."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.runs = 0
        self.stopped = 0
        self.entered = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await receive()
        self.runs += 1
        self.entered.set()
        try:
            await asyncio.sleep(self.seconds)
        except asyncio.CancelledError:
            self.stopped += 1
            raise
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})


@pytest.fixture
def started() -> Iterator[list[tuple[str, float]]]:
    """Every task created on the loop meanwhile: (its coroutine's name, the loop time)."""
    loop = asyncio.get_event_loop_policy().get_event_loop()
    created: list[tuple[str, float]] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **options: Any) -> asyncio.Task[Any]:
        created.append((getattr(coro, "__qualname__", ""), loop.time()))
        return asyncio.Task(coro, loop=loop, **options)

    old = loop.get_task_factory()
    loop.set_task_factory(factory)
    yield created
    loop.set_task_factory(old)


def _middleware(settler: AsyncSettler, app: Any, lease: float) -> IdempotencyMiddleware:
    return IdempotencyMiddleware(
        app, settler=settler, principal=lambda scope: "tenant:a", lease=lease
    )


def _helpers_running() -> list[str]:
    return [
        name
        for task in asyncio.all_tasks()
        if (name := getattr(task.get_coro(), "__qualname__", "")) in _HELPERS
    ]


@pytest.mark.parametrize("lease", [*_LISTENER_FIRST, _HEARTBEAT_FIRST])
async def test_a_client_that_leaves_after_the_listener_is_due_is_heard(
    async_settler: AsyncSettler, lease: float
) -> None:
    """The client leaves 0.25 s in, whichever helper was timed first: the handler is
    stopped at once and the attempt is provisional, so the retry runs it again."""
    handler = _Handler(10)
    client = _Client()
    task = asyncio.create_task(
        _middleware(async_settler, handler, lease)(_scope(b"k-left"), client.receive, client.send)
    )
    await handler.entered.wait()
    await asyncio.sleep(LISTEN_AFTER + 0.15)
    client.leave.set()
    async with asyncio.timeout(2):  # not at a heartbeat's moment, not after 10 s
        await task
    assert handler.stopped == 1
    assert await _state(async_settler, "k-left") == (State.PROVISIONAL, "client_disconnect")
    assert _helpers_running() == []


@pytest.mark.parametrize("lease", [0.6, 0.27])
async def test_the_lease_is_renewed_whichever_helper_is_due_first(
    async_settler: AsyncSettler, lease: float
) -> None:
    """A handler that runs for several leases keeps its key: a retry in its second lease
    is told 409, never given a second run beside the first."""
    handler = _Handler(4 * lease)
    first = _Client()
    mw = _middleware(async_settler, handler, lease)
    task = asyncio.create_task(mw(_scope(b"k-long"), first.receive, first.send))
    await handler.entered.wait()
    await asyncio.sleep(2 * lease)
    retry = _Client()
    await mw(_scope(b"k-long"), retry.receive, retry.send)
    async with asyncio.timeout(5):
        await task
    assert (first.statuses, retry.statuses, handler.runs) == ([201], [409], 1)
    assert (await _state(async_settler, "k-long"))[0] is State.COMPLETED


async def test_a_renewal_due_before_the_listener_is_not_put_off_until_it(
    async_settler: AsyncSettler,
) -> None:
    """A lease of 0.15 s is first renewed 0.05 s in, before the listener's moment: a
    renewal put off to 0.1 s would leave a lease shorter than 0.1 s lapsing each time.
    Read on the server's clock: the renewal moved the lease's end by the time between the
    reservation and the renewal."""
    handler = _Handler(10)
    client = _Client()
    task = asyncio.create_task(
        _middleware(async_settler, handler, _HEARTBEAT_FIRST)(
            _scope(b"k-early"), client.receive, client.send
        )
    )
    await handler.entered.wait()
    op = operation_id("http", "k-early", "tenant:a", "principal")
    ends = []
    async with asyncio.timeout(2):
        while len(set(ends)) < 2:
            record = await async_settler.get(op)
            assert record is not None
            ends.append(record.lease_expires_at)
            await asyncio.sleep(0.005)
    client.leave.set()
    async with asyncio.timeout(2):
        await task
    reserved, renewed = ends[0], ends[-1]
    assert reserved is not None
    assert renewed is not None
    assert (renewed - reserved).total_seconds() < LISTEN_AFTER


@pytest.mark.parametrize(
    ("lease", "ends_after"),
    [
        (0.6, 0.05),  # before either moment
        (0.6, 0.15),  # after the listener's, before the heartbeat's
        (_HEARTBEAT_FIRST, 0.07),  # after the heartbeat's, before the listener's
    ],
)
async def test_no_helper_starts_after_the_request_ended(
    async_settler: AsyncSettler, started: list[tuple[str, float]], lease: float, ends_after: float
) -> None:
    """A handler that ends before or between the two moments: the moment still to come
    starts nothing (no listener calling the server's receive after the response, no
    heartbeat), and no helper is left running."""
    loop = asyncio.get_running_loop()
    handler = _Handler(ends_after)
    client = _Client()
    await _middleware(async_settler, handler, lease)(_scope(b"k-end"), client.receive, client.send)
    ended, receives = loop.time(), client.receives
    assert _helpers_running() == []
    await asyncio.sleep(max(LISTEN_AFTER, lease / 3) + 0.1)  # past both moments
    assert [name for name, at in started if at >= ended and name in _HELPERS] == []
    assert client.receives == receives
    assert client.statuses == [201]


@pytest.mark.parametrize(("lease", "cancelled_after"), [(0.6, 0.15), (_HEARTBEAT_FIRST, 0.07)])
async def test_a_request_the_server_cancels_between_the_moments_leaves_no_helper(
    async_settler: AsyncSettler,
    started: list[tuple[str, float]],
    lease: float,
    cancelled_after: float,
) -> None:
    """The server cancels the request after the first moment and before the second: the
    attempt is provisional, the helper that ran is stopped and the other never starts."""
    loop = asyncio.get_running_loop()
    handler = _Handler(10)
    client = _Client()
    task = asyncio.create_task(
        _middleware(async_settler, handler, lease)(_scope(b"k-cancel"), client.receive, client.send)
    )
    await handler.entered.wait()
    await asyncio.sleep(cancelled_after)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    ended, receives = loop.time(), client.receives
    assert _helpers_running() == []
    await asyncio.sleep(max(LISTEN_AFTER, lease / 3) + 0.1)
    assert [name for name, at in started if at >= ended and name in _HELPERS] == []
    assert client.receives == receives
    assert await _state(async_settler, "k-cancel") == (State.PROVISIONAL, "cancelled")
