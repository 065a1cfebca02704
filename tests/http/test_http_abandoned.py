"""A handler that takes a while to stop after a timeout keeps its key: the client gets its
504 at the timeout, and a retry meanwhile gets 409, never a second run of the handler beside
the first (found in review: the lease used to lapse while the handler was still stopping)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from structlog.testing import capture_logs

from settle import AsyncSettler, Reserved, Settler, State
from settle.asgi import IdempotencyMiddleware
from settle.asgi.keys import operation_id
from settle.http.stored import StoredResponse
from tests.http.apps import post_scope as _scope
from tests.log_sink import logs_behind_a_failing_sink

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


# -- the handler runs in the request's own task: every way it is stopped -----------------------


class _Client:
    """One request's receive and send: the body, then (if ``leaves``) an immediate
    ``http.disconnect``, else nothing more."""

    def __init__(self, *, leaves: bool = False) -> None:
        self.leaves = leaves
        self.messages: list[dict[str, Any]] = []
        self._sent = False

    async def receive(self) -> dict[str, Any]:
        if not self._sent:
            self._sent = True
            return {"type": "http.request", "body": b"x", "more_body": False}
        if self.leaves:
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int | None:
        starts = [m["status"] for m in self.messages if m["type"] == "http.response.start"]
        return starts[0] if starts else None


def _op(key: str) -> str:
    return operation_id("http", key, "tenant:a", "principal")


async def _state(settler: AsyncSettler, key: str) -> tuple[State, str | None]:
    """The record's state and reason (it must exist)."""
    record = await settler.get(_op(key))
    assert record is not None
    return record.state, record.reason


class _Waits:
    """An app that waits (a slow downstream call) until it is cancelled, then runs
    ``cleanup()`` before it stops; ``entered`` is set once it waits."""

    def __init__(self, cleanup: Callable[[], Awaitable[None]]) -> None:
        self.cleanup = cleanup
        self.entered = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await receive()
        self.entered.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await self.cleanup()
            raise


class _AnswersOnRetry:
    """An app whose first run does ``first()`` before it answers; every run answers 201
    with its run number (a first run stopped on the way never answers)."""

    def __init__(self, first: Callable[[], Awaitable[None]]) -> None:
        self.first = first
        self.runs = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await receive()
        self.runs += 1
        if self.runs == 1:
            await self.first()
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": f"run {self.runs}".encode()})


class _OutlastsItsLease:
    """A handler's cleanup that blocks the loop past a 0.3 s lease (nothing renews it),
    waits for the retry that took the key over meanwhile, then gives the heartbeat time to
    find the lease lost, and then runs ``then()``."""

    def __init__(self, then: Callable[[], Awaitable[None]] | None = None) -> None:
        self.then = then
        self.cleaning = asyncio.Event()
        self.retried = asyncio.Event()
        self.lost = asyncio.Event()

    async def __call__(self) -> None:
        time.sleep(0.45)  # noqa: ASYNC251  # blocks the loop past the lease: no renewal
        self.cleaning.set()
        await self.retried.wait()
        await asyncio.sleep(0.3)  # the heartbeat runs meanwhile and finds the lease lost
        self.lost.set()
        if self.then is not None:
            await self.then()


async def _takes_over(settler: AsyncSettler, key: bytes) -> _Client:
    """A retry of ``key`` by another process (its own middleware): it takes the key over
    once the lease has run out and completes at once."""
    answers = IdempotencyMiddleware(
        _AnswersOnRetry(lambda: asyncio.sleep(0)),
        settler=settler,
        principal=lambda scope: "tenant:a",
    )
    retry = _Client()
    await answers(_scope(key), retry.receive, retry.send)
    return retry


async def _settled_by_the_retry_alone(settler: AsyncSettler, key: str) -> None:
    record = await settler.get(_op(key))
    assert record is not None
    assert record.state is State.COMPLETED
    assert await settler.quarantine.list(operation_id=_op(key)) == []


@pytest.mark.parametrize("then", ["answers", "raises"])
async def test_a_handler_that_ignores_its_timeout_is_not_stored_and_runs_again(
    async_settler: AsyncSettler, then: str
) -> None:
    """The handler swallows the cancellation of its timeout and answers 201 anyway (or
    raises something else): its client got 504 at the timeout, the late answer is not
    stored, the settlement is not hit by the cancellation, and a retry runs the handler
    again. The request's task ends with no cancellation left pending on it."""

    async def ignore_the_timeout() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            if then == "raises":
                raise RuntimeError("cleanup failed") from None

    app = _AnswersOnRetry(ignore_the_timeout)

    mw = IdempotencyMiddleware(
        app, settler=async_settler, principal=lambda scope: "tenant:a", timeout=0.2
    )

    async def request() -> tuple[_Client, int]:
        client = _Client()
        async with asyncio.timeout(10):  # an outer deadline, as a server or framework keeps
            await mw(_scope(b"k-ignore"), client.receive, client.send)
        await asyncio.sleep(0)  # a cancellation left pending would land here
        task = asyncio.current_task()
        assert task is not None
        return client, task.cancelling()

    first, pending = await asyncio.create_task(request())
    assert (first.status, pending) == (504, 0)
    assert [m for m in first.messages if m.get("body") == b"run 1"] == []
    assert await _state(async_settler, "k-ignore") == (State.PROVISIONAL, "timeout")

    retry, pending = await asyncio.create_task(request())
    assert (retry.status, pending) == (201, 0)
    assert app.runs == 2
    record = await async_settler.get(_op("k-ignore"))
    assert record is not None
    assert record.state is State.COMPLETED


async def test_a_client_gone_before_the_handler_starts_stops_it(
    async_settler: AsyncSettler,
) -> None:
    """The client disconnects right after its body, before the middleware listens (it
    starts listening once the handler has run for a moment): the handler is stopped all the
    same and the attempt is left provisional."""
    stopped = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            stopped.set()
            raise

    mw = IdempotencyMiddleware(app, settler=async_settler, principal=lambda scope: "tenant:a")
    client = _Client(leaves=True)
    async with asyncio.timeout(5):
        await mw(_scope(b"k-gone"), client.receive, client.send)
    assert stopped.is_set()
    assert client.status is None  # nobody to answer
    assert await _state(async_settler, "k-gone") == (State.PROVISIONAL, "client_disconnect")


@pytest.mark.parametrize("when", ["running", "stopping after its timeout"])
async def test_the_server_cancelling_the_request_leaves_it_provisional(
    async_settler: AsyncSettler, when: str
) -> None:
    """The server cancels the request's task (a shutdown, a server that cancels on
    disconnect): the handler stops, the attempt is left provisional, and the cancellation
    reaches the server. Cancelled while the handler still cleans up after its timeout, the
    504 is out and the attempt is provisional for the timeout."""
    cleaning = asyncio.Event()

    async def cleanup() -> None:
        cleaning.set()
        if timeout is not None:
            await asyncio.sleep(10)  # cleanup the server's own cancellation cuts short

    app = _Waits(cleanup)
    entered = app.entered

    timeout = 0.2 if when != "running" else None
    mw = IdempotencyMiddleware(
        app, settler=async_settler, principal=lambda scope: "tenant:a", timeout=timeout
    )
    client = _Client()
    key = b"k-cancel-" + when.split(maxsplit=1)[0].encode()
    task = asyncio.create_task(mw(_scope(key), client.receive, client.send))
    await (entered if when == "running" else cleaning).wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    record = await async_settler.get(_op(key.decode()))
    assert record is not None
    if when == "running":
        assert (record.state, record.reason) == (State.PROVISIONAL, "cancelled")
        assert client.status is None
    else:
        assert (record.state, record.reason) == (State.PROVISIONAL, "timeout")
        assert client.status == 504


async def test_a_handler_raising_a_cancellation_of_its_own_is_provisional(
    async_settler: AsyncSettler,
) -> None:
    """A handler that raises CancelledError when nobody cancelled the request (a task it
    awaited was cancelled) ends without an answer: the attempt is provisional, the request
    itself is not taken for cancelled, and a retry runs the handler again."""

    async def await_a_cancelled_task() -> None:
        helper = asyncio.create_task(asyncio.sleep(10))
        helper.cancel()
        await helper  # raises CancelledError into the handler

    app = _AnswersOnRetry(await_a_cancelled_task)

    mw = IdempotencyMiddleware(app, settler=async_settler, principal=lambda scope: "tenant:a")
    first = _Client()
    await mw(_scope(b"k-own"), first.receive, first.send)
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0
    assert await _state(async_settler, "k-own") == (State.PROVISIONAL, "no_response")
    retry = _Client()
    await mw(_scope(b"k-own"), retry.receive, retry.send)
    assert (retry.status, app.runs) == (201, 2)


async def test_the_server_cancelling_while_the_outcome_is_stored_still_stores_it(
    async_settler: AsyncSettler, redis_url: str
) -> None:
    """The server cancels the request (its shutdown) while the handler's finished response
    is being stored, on a Redis slow to answer: the settlement is finished all the same, so
    the record is completed and a retry gets the stored response, never a second run."""
    admin = aioredis.Redis.from_url(redis_url)
    request: list[asyncio.Task[None]] = []

    async def slow_store_then_cancel() -> None:
        await admin.execute_command("CLIENT", "PAUSE", "300", "WRITE")  # complete waits
        asyncio.get_running_loop().call_later(0.1, request[0].cancel)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        runs.append(1)
        await send({"type": "http.response.start", "status": 201, "headers": []})
        if len(runs) == 1:
            await slow_store_then_cancel()
        await send({"type": "http.response.body", "body": b"charged"})

    runs: list[int] = []
    first = _Client()
    mw = IdempotencyMiddleware(app, settler=async_settler, principal=lambda scope: "tenant:a")
    try:
        request.append(asyncio.create_task(mw(_scope(b"k-shutdown"), first.receive, first.send)))
        with pytest.raises(asyncio.CancelledError):
            await request[0]
    finally:
        await admin.aclose()
    record = await async_settler.get(_op("k-shutdown"))
    assert record is not None
    assert record.state is State.COMPLETED
    retry = _Client()
    await mw(_scope(b"k-shutdown"), retry.receive, retry.send)
    assert retry.status == 201
    assert [m.get("body") for m in retry.messages if "body" in m] == [b"charged"]
    assert len(runs) == 1


async def test_a_timeout_during_the_servers_cancellation_does_not_cut_the_cleanup_short(
    async_settler: AsyncSettler,
) -> None:
    """The server cancels the request and the handler cleans up past its timeout: the
    timeout neither answers through a request being torn down nor cancels the cleanup; the
    attempt is provisional as cancelled."""
    log: list[str] = []

    async def cleanup() -> None:
        try:
            await asyncio.sleep(0.5)  # rolls back what it started
            log.append("cleanup finished")
        except asyncio.CancelledError:
            log.append("cleanup cut short")

    app = _Waits(cleanup)

    mw = IdempotencyMiddleware(
        app, settler=async_settler, principal=lambda scope: "tenant:a", timeout=0.3
    )
    client = _Client()
    task = asyncio.create_task(mw(_scope(b"k-teardown"), client.receive, client.send))
    await app.entered.wait()
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == ["cleanup finished"]
    assert client.status is None
    assert await _state(async_settler, "k-teardown") == (State.PROVISIONAL, "cancelled")


async def test_a_lease_lost_during_the_servers_cancellation_settles_nothing(
    async_settler: AsyncSettler,
) -> None:
    """The server cancels a request; while the handler cleans up, its lease runs out, a
    retry takes the key over and completes, and the heartbeat finds the lease lost. The
    first attempt is superseded: it settles nothing (no stale settlement in quarantine) and
    the retry's completion stands."""
    cleanup = _OutlastsItsLease()
    app = _Waits(cleanup)
    first = _Client()
    mw = IdempotencyMiddleware(
        app, settler=async_settler, principal=lambda scope: "tenant:a", lease=0.3
    )
    task = asyncio.create_task(mw(_scope(b"k-taken"), first.receive, first.send))
    await app.entered.wait()
    await asyncio.sleep(0.05)
    task.cancel()
    await cleanup.cleaning.wait()
    retry = await _takes_over(async_settler, b"k-taken")
    cleanup.retried.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert retry.status == 201
    await _settled_by_the_retry_alone(async_settler, "k-taken")


async def test_a_handler_that_swallows_the_servers_cancellation_still_times_out(
    async_settler: AsyncSettler,
) -> None:
    """The handler catches the server's cancellation and works on: once the stop has waited
    its while for that cancellation to end, the timeout stops the handler all the same, and
    the attempt is provisional for the timeout."""
    entered = asyncio.Event()
    stopped: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        entered.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(10)  # the server's cancellation, swallowed
        try:
            await asyncio.sleep(10)  # works on, far past its timeout
        except asyncio.CancelledError:
            stopped.append("stopped")
            raise
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"late"})

    mw = IdempotencyMiddleware(
        app, settler=async_settler, principal=lambda scope: "tenant:a", timeout=0.3
    )
    client = _Client()
    task = asyncio.create_task(mw(_scope(b"k-deaf"), client.receive, client.send))
    await entered.wait()
    task.cancel()
    async with asyncio.timeout(5):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert stopped == ["stopped"]
    assert client.status == 504
    assert await _state(async_settler, "k-deaf") == (State.PROVISIONAL, "timeout")


@pytest.mark.parametrize("then", ["stops", "is cancelled by the server"])
async def test_a_lease_lost_while_a_timed_out_handler_stops_settles_nothing(
    async_settler: AsyncSettler, then: str
) -> None:
    """The timeout stops the handler (504); its cleanup outlasts the lease, a retry takes
    the key over and completes, and the heartbeat finds the lease lost. The timed-out
    attempt then settles nothing, whether it ends its cleanup or the server cancels it
    meanwhile: no stale settlement lands in quarantine beside the retry's completion."""

    async def still_cleaning() -> None:
        await asyncio.sleep(10)  # when the server cancels

    cleanup = _OutlastsItsLease(None if then == "stops" else still_cleaning)
    app = _Waits(cleanup)
    first = _Client()
    mw = IdempotencyMiddleware(
        app, settler=async_settler, principal=lambda scope: "tenant:a", lease=0.3, timeout=0.2
    )
    task = asyncio.create_task(mw(_scope(b"k-lost-stopping"), first.receive, first.send))
    await cleanup.cleaning.wait()
    retry = await _takes_over(async_settler, b"k-lost-stopping")
    cleanup.retried.set()
    if then != "stops":
        await cleanup.lost.wait()
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    else:
        await task
    assert (first.status, retry.status) == (504, 201)
    await _settled_by_the_retry_alone(async_settler, "k-lost-stopping")


@pytest.mark.parametrize("starts", ["after its cleanup", "before its cleanup"])
async def test_a_lease_lost_before_an_unstored_answer_marks_nothing(
    async_settler: AsyncSettler, starts: str
) -> None:
    """The server cancels a request; the handler catches it, cleans up past its lease (a
    retry takes the key over and completes, the heartbeat finds the lease lost) and then
    answers 503. A 503 is not stored, and the attempt no longer owns the key: it marks
    nothing, so no stale settlement lands in quarantine; its client gets 409
    ``attempt-superseded`` in place of the stale 503, as under WSGI. A 503 started before
    the cleanup has its status line out when the loss is found: nothing else can be said to
    its client, which gets the 503 as sent. Either way the attempt is reported superseded
    (``settle.http.abandoned``, ``lease_lost``)."""
    cleanup = _OutlastsItsLease()
    entered = asyncio.Event()
    start = {"type": "http.response.start", "status": 503, "headers": []}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        entered.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            if starts == "before its cleanup":
                await send(start)
            await cleanup()
        if starts == "after its cleanup":
            await send(start)
        await send({"type": "http.response.body", "body": b"shutting down"})

    first = _Client()
    mw = IdempotencyMiddleware(
        app, settler=async_settler, principal=lambda scope: "tenant:a", lease=0.3
    )
    key = "k-unstored-" + starts.split(maxsplit=1)[0]
    with capture_logs() as logs:
        task = asyncio.create_task(mw(_scope(key.encode()), first.receive, first.send))
        # The cancellation must reach the handler, not the reservation before it (a loaded
        # machine can take longer than any fixed pause to reserve).
        await entered.wait()
        task.cancel()
        await cleanup.cleaning.wait()
        retry = await _takes_over(async_settler, key.encode())
        cleanup.retried.set()
        await task  # the handler swallowed the server's cancellation and answered
    if starts == "after its cleanup":
        assert (first.status, retry.status) == (409, 201)
        assert b"shutting down" not in b"".join(m.get("body", b"") for m in first.messages)
    else:
        assert (first.status, retry.status) == (503, 201)
        assert first.messages[-1] == {"type": "http.response.body", "body": b"shutting down"}
    abandoned = [e["reason"] for e in logs if e["event"] == "settle.http.abandoned"]
    assert abandoned == ["lease_lost"]
    await _settled_by_the_retry_alone(async_settler, key)


#: How a handler ends after its own timeout, once its lease is lost: see
#: :func:`lose_the_lease_in_a_timeout_of_its_own`.
ENDINGS = ["answers 503", "raises", "answers 500 and raises"]


async def lose_the_lease_in_a_timeout_of_its_own(
    settler: AsyncSettler, then: str
) -> tuple[_Client, _Client, str]:
    """The handler's own ``asyncio.timeout`` cancels its downstream call; its cleanup
    outlasts the lease, a retry takes the key over and completes, and the heartbeat finds the
    lease lost while that cancellation is still in flight, so the stop is put off. Then the
    timeout surfaces as TimeoutError and the handler answers 503, or raises (after a 500, as
    Starlette's error middleware sends one). The first client, the retry, the key."""
    cleanup = _OutlastsItsLease()
    entered = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        entered.set()
        try:
            async with asyncio.timeout(0.05):
                try:
                    await asyncio.sleep(10)  # the downstream call
                except asyncio.CancelledError:
                    await cleanup()
                    raise
        except TimeoutError:
            if then != "raises":
                status = 503 if then == "answers 503" else 500
                await send({"type": "http.response.start", "status": status, "headers": []})
                await send({"type": "http.response.body", "body": b"downstream timed out"})
            if then != "answers 503":
                raise RuntimeError("downstream timed out") from None

    first = _Client()
    mw = IdempotencyMiddleware(app, settler=settler, principal=lambda scope: "tenant:a", lease=0.3)
    key = "k-put-off-" + then.replace(" ", "-")
    task = asyncio.create_task(mw(_scope(key.encode()), first.receive, first.send))
    await entered.wait()
    await cleanup.cleaning.wait()
    retry = await _takes_over(settler, key.encode())
    cleanup.retried.set()
    with contextlib.suppress(RuntimeError):  # the handler's own, if it goes on
        await task
    return first, retry, key


@pytest.mark.parametrize("then", ENDINGS)
async def test_a_lease_lost_while_a_timeout_of_the_handlers_own_ran_answers_409(
    async_settler: AsyncSettler, then: str
) -> None:
    """The stop on the lost lease is put off while the handler's own timeout runs, and the
    handler then answers its error (:func:`lose_the_lease_in_a_timeout_of_its_own`): the
    client gets 409 ``attempt-superseded``, never the stale attempt's error, as under WSGI;
    the loss is logged (``settle.http.abandoned``, ``lease_lost``) and the attempt settles
    nothing: the retry's record and response stand."""
    with capture_logs() as logs:
        first, retry, key = await lose_the_lease_in_a_timeout_of_its_own(async_settler, then)
    assert (first.status, retry.status) == (409, 201)
    body = b"".join(m.get("body", b"") for m in first.messages)
    assert b"attempt-superseded" in body
    assert b"downstream timed out" not in body
    abandoned = [e for e in logs if e["event"] == "settle.http.abandoned"]
    assert [e["reason"] for e in abandoned] == ["lease_lost"]
    await _settled_by_the_retry_alone(async_settler, key)
    again = await _takes_over(async_settler, key.encode())  # the retry's response, untouched
    assert (again.status, again.messages[-1]["body"]) == (201, b"run 1")


async def test_a_stored_response_sent_slowly_keeps_its_lease_quiet(
    async_settler: AsyncSettler,
) -> None:
    """A handler that ran past its first renewal is completed, then its buffered response
    goes out to a slow client: the heartbeat stops at the completion, so it neither reports
    the finished operation's lease as lost nor marks the attempt lost."""
    attempts: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        attempts.append(scope["settle"])
        await asyncio.sleep(0.15)  # past lease / 3: the heartbeat runs
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"charged"})

    class SlowClient(_Client):
        async def send(self, message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                await asyncio.sleep(0.5)  # several renewals' worth
            await super().send(message)

    client = SlowClient()
    mw = IdempotencyMiddleware(
        app, settler=async_settler, principal=lambda scope: "tenant:a", lease=0.3
    )
    with capture_logs() as logs:
        await mw(_scope(b"k-slow-client"), client.receive, client.send)
    assert client.status == 201
    assert [e for e in logs if e["event"] == "settle.http.lease_lost"] == []
    assert attempts[0].lost is False
    record = await async_settler.get(_op("k-slow-client"))
    assert record is not None
    assert record.state is State.COMPLETED


# -- a lease that lapsed: no newer attempt, nothing to stop -------------------------------------


class _Lapses:
    """An app that holds the loop past its 0.3 s lease (blocking work, a GC pause: nothing
    renews it), then works on while the heartbeat finds the lease lapsed, ``then()``, and
    answers 201 ``charged`` (``runs`` counts its runs, ``attempts`` keeps its attempts)."""

    def __init__(self, then: Callable[[], Awaitable[None]] | None = None) -> None:
        self.then = then
        self.runs = 0
        self.attempts: list[Any] = []
        self.lapsed = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await receive()
        self.runs += 1
        self.attempts.append(scope["settle"])
        time.sleep(0.45)  # noqa: ASYNC251  # blocks the loop past the lease: no renewal
        await asyncio.sleep(0.3)  # the heartbeat runs meanwhile and finds the lease lapsed
        self.lapsed.set()
        if self.then is not None:
            await self.then()
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"charged"})


async def test_a_handler_whose_lease_only_lapsed_finishes_and_is_stored(
    async_settler: AsyncSettler,
) -> None:
    """Found in review: a handler that held the loop past its lease was stopped by the
    heartbeat, which found the lease lapsed though nobody had taken the key over: a payment
    stopped half-way, 409 to its client, and the retry ran the handler again. Its
    ``complete`` is accepted at its own generation (SPEC 2), as the renewal before a large
    response already held: the handler now runs on, and its response is stored and sent."""
    app = _Lapses()
    mw = IdempotencyMiddleware(
        app, settler=async_settler, principal=lambda scope: "tenant:a", lease=0.3
    )
    first = _Client()
    with capture_logs() as logs:
        await mw(_scope(b"k-lapsed"), first.receive, first.send)
    retry = _Client()
    await mw(_scope(b"k-lapsed"), retry.receive, retry.send)

    assert (first.status, first.messages[-1]["body"]) == (201, b"charged")
    assert (retry.status, retry.messages[-1]["body"]) == (201, b"charged")
    assert (b"idempotent-replayed", b"true") in retry.messages[0]["headers"]
    assert app.runs == 1
    assert app.attempts[0].lost is False
    events = [e["event"] for e in logs]
    assert "settle.http.lease_lapsed" in events
    assert "settle.http.lease_lost" not in events
    assert "settle.http.abandoned" not in events
    record = await async_settler.get(_op("k-lapsed"))
    assert record is not None
    assert (record.state, record.reservations) == (State.COMPLETED, 1)
    assert await async_settler.quarantine.list(operation_id=_op("k-lapsed")) == []


@pytest.mark.parametrize("failing_sink", [False, True], ids=["", "a-log-sink-that-raises"])
async def test_a_takeover_after_the_lease_lapsed_still_stops_the_handler(
    async_settler: AsyncSettler, failing_sink: bool
) -> None:
    """The heartbeat finds the lease lapsed and lets the handler run on; then a retry takes
    the key over and completes it. The next renewal finds the takeover: the handler is
    stopped and its client answered 409 ``attempt-superseded``, as for any lost lease; the
    retry's completion stands. Its ``lease_lapsed`` and ``lease_lost`` lines are dropped
    when they cannot be written (a processor that raises), as the sync guard's: raised,
    one ended the heartbeat task, and the handler was never stopped."""
    stopped: list[bool] = []

    async def works_on() -> None:
        try:
            await asyncio.sleep(10)  # the retry takes the key over meanwhile
        except asyncio.CancelledError:
            stopped.append(True)
            raise

    app = _Lapses(works_on)
    mw = IdempotencyMiddleware(
        app, settler=async_settler, principal=lambda scope: "tenant:a", lease=0.3
    )
    first = _Client()
    refused = ("settle.http.lease_lapsed", "settle.http.lease_lost") if failing_sink else ()
    with logs_behind_a_failing_sink(refused) as logs:
        task = asyncio.create_task(mw(_scope(b"k-lapsed-taken"), first.receive, first.send))
        lapsed = asyncio.create_task(app.lapsed.wait())
        await asyncio.wait({task, lapsed}, timeout=5, return_when=asyncio.FIRST_COMPLETED)
        lapsed.cancel()
        assert app.lapsed.is_set(), "the heartbeat stopped the handler at the lapse"
        retry = await _takes_over(async_settler, b"k-lapsed-taken")
        async with asyncio.timeout(5):
            await task

    assert stopped == [True]
    assert app.attempts[0].lost is True
    assert (first.status, retry.status) == (409, 201)
    events = [e["event"] for e in logs]
    assert events.index("settle.http.lease_lapsed") < events.index("settle.http.lease_lost")
    await _settled_by_the_retry_alone(async_settler, "k-lapsed-taken")


async def test_a_late_answer_after_the_lease_lapsed_and_was_taken_over_is_quarantined(
    async_settler: AsyncSettler, settler: Settler
) -> None:
    """The heartbeat finds the lease lapsed and lets the handler run on; another worker
    takes the key over and stores its response before the next renewal, and the handler
    answers: its late settlement is quarantined and its client gets the stored response."""

    async def taken_over() -> None:
        # Blocks the loop: no renewal finds the takeover before the handler answers.
        op = _op("k-lapsed-late")
        record = settler.get(op)
        assert record is not None
        newer = settler.reserve(op, principal="tenant:a", fingerprint=record.fingerprint)
        assert isinstance(newer, Reserved)
        assert newer.takeover == "lease_expired"
        stored = StoredResponse.capture(200, [(b"content-type", b"text/plain")], b"newer", [])
        settler.complete(newer.reservation, stored)

    app = _Lapses(taken_over)
    mw = IdempotencyMiddleware(
        app, settler=async_settler, principal=lambda scope: "tenant:a", lease=0.3
    )
    first = _Client()
    with capture_logs() as logs:
        await mw(_scope(b"k-lapsed-late"), first.receive, first.send)

    assert (first.status, first.messages[-1]["body"]) == (200, b"newer")
    assert "settle.http.lease_lapsed" in [e["event"] for e in logs]
    [entry] = await async_settler.quarantine.list(operation_id=_op("k-lapsed-late"))
    assert entry.kind.value == "stale_generation"
    record = await async_settler.get(_op("k-lapsed-late"))
    assert record is not None
    assert record.state is State.COMPLETED
