"""Running the handler under a reservation, and settling the reservation from its response.

The handler runs in its own task while a heartbeat renews the lease and a watcher listens
for the client going away. The response is captured through ``send``:

* a finished response (:meth:`Guard.keeps`) is buffered; when its last byte arrives it
  is stored with ``complete`` and only then sent, so a client that saw the whole response
  always finds it stored;
* a response over ``max_response_bytes`` is sent on as it streams; when it ends the
  operation is completed with a "not stored" marker (a retry gets 410, never a re-run);
* any other status (1xx, 304, 5xx, 408, 409, 429) is sent on as it streams and the attempt
  is marked provisional just before its last byte, so the retry runs the handler again
  (other 3xx are finished answers: :func:`~settle.http.stored.storable_status`).

An exception, a timeout or a client disconnect before the last byte marks the attempt
provisional too; on a timeout or a disconnect the handler task is cancelled first. Work the
app does after its last byte (background tasks) never changes the stored outcome.
"""

from __future__ import annotations

import asyncio
from enum import Enum

from settle._async.settler import AsyncSettler
from settle.asgi._types import ASGIApp, Message, Receive, Scope, Send
from settle.errors import SettleError
from settle.http._rules import Guard, Run, Settle
from settle.http.problems import Response
from settle.models import OperationRecord

__all__ = ["AttemptRunner", "send_response"]

#: ASGI extensions that send a response without body messages.
_FILE_SENDS = frozenset({"http.response.pathsend", "http.response.zerocopysend"})


class _Phase(Enum):
    RUNNING = "running"  # the handler has not sent its last byte
    FINISHING = "finishing"  # the last byte arrived: settling, then sending
    SETTLED = "settled"  # the outcome is written (or could not be); the response is out
    ABANDONED = "abandoned"  # timed out or the client left: the handler is being cancelled


class AttemptRunner:
    """One reserved attempt: run the app, capture its response, settle the reservation."""

    def __init__(self, app: ASGIApp, settler: AsyncSettler, guard: Guard, run: Run) -> None:
        self._app = app
        self._settler = settler
        self._guard = guard
        self._run = run
        self._policy = guard.policy
        self._reservation = run.reservation
        self._attempt = run.attempt
        self._lease = run.lease
        self._phase = _Phase.RUNNING
        self._send: Send | None = None
        self._start: Message | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self._streaming = False  # the response is being sent on as it arrives
        self._downstream_started = False
        self._stopped = False  # the handler task has ended (after being cancelled)
        self._heartbeat: asyncio.Task[None] | None = None
        self._heartbeat_ended: asyncio.Future[None] | None = None

    async def run(self, scope: Scope, receive: Receive, send: Send, body: bytes) -> None:
        self._send = send
        gone = asyncio.Event()
        delivered = False

        async def app_receive() -> Message:
            nonlocal delivered
            # Yield first, as a real receive would: a caller that polls with an already
            # cancelled scope (Starlette's is_disconnected) must not swallow the body.
            await asyncio.sleep(0)
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        loop = asyncio.get_running_loop()
        watcher = asyncio.create_task(_watch_disconnect(receive, gone))
        # No heartbeat task until the first renewal is due: most handlers are done before.
        self._heartbeat_ended = loop.create_future()
        timer = loop.call_later(self._lease / 3, self._start_heartbeat)
        app_task = asyncio.create_task(self._call_app(scope, app_receive))
        try:
            await self._supervise(app_task, watcher, self._heartbeat_ended)
        except asyncio.CancelledError:
            # The server cancelled us (shutdown, or a server that cancels on disconnect).
            if self._phase is _Phase.RUNNING:
                self._phase = _Phase.ABANDONED
                await _cancel(app_task)
                self._stopped = True
                await asyncio.shield(self._settle(self._guard.failed(self._run, "cancelled")))
            raise
        finally:
            timer.cancel()
            tasks = [watcher] if self._heartbeat is None else [watcher, self._heartbeat]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _call_app(self, scope: Scope, receive: Receive) -> None:
        # A guarded response must go through http.response.body messages to be stored:
        # hide the server's send-a-file extensions, so the app falls back to body messages
        # (a pathsend after a held-back start would break the response and re-run the
        # handler on the next retry).
        extensions = {
            k: v for k, v in (scope.get("extensions") or {}).items() if k not in _FILE_SENDS
        }
        await self._app(
            {**scope, "extensions": extensions, "settle": self._attempt}, receive, self._capture
        )

    # -- supervision ---------------------------------------------------------------------

    async def _supervise(
        self,
        app_task: asyncio.Task[None],
        watcher: asyncio.Task[None],
        heartbeat: asyncio.Future[None],
    ) -> None:
        loop = asyncio.get_running_loop()
        timeout = self._policy.timeout
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            waiting = {t for t in (app_task, watcher, heartbeat) if not t.done()}
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            done, _ = await asyncio.wait(
                waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            if app_task in done:
                await self._handler_ended(app_task)
                return
            if self._phase is not _Phase.RUNNING:
                deadline = None  # the response is out; let the app finish its own work
                continue
            if watcher in done:
                reason = "client_disconnect"
            elif heartbeat in done:
                if not self._attempt.lost:
                    continue  # the heartbeat stopped without a verdict (logged): carry on
                reason = "lease_lost"
            else:
                reason = "timeout"
            self._phase = _Phase.ABANDONED
            problem = self._guard.abandoned(reason)
            if problem is not None and not self._downstream_started:
                # Answer at the timeout, not when the handler's cleanup ends.
                await self._respond(problem)
            # The heartbeat keeps the lease while the handler stops: a retry meanwhile gets
            # 409, never a second handler running beside this one.
            await _cancel(app_task)
            self._stopped = True
            if reason == "lease_lost":
                # Another attempt may own the operation now: this one must not settle it.
                await self._answer_superseded(None)
                return
            await self._settle(self._guard.failed(self._run, reason))
            return

    async def _handler_ended(self, app_task: asyncio.Task[None]) -> None:
        error = None if app_task.cancelled() else app_task.exception()
        if self._phase is _Phase.RUNNING:
            self._phase = _Phase.SETTLED
            reason = "exception" if error else "no_response"
            await self._settle(self._guard.failed(self._run, reason))
        if error is not None:
            self._guard.handler_raised(error)
            raise error

    def _start_heartbeat(self) -> None:
        """The first renewal is due (``lease / 3`` after the reservation): start renewing."""
        self._heartbeat = asyncio.get_running_loop().create_task(self._renew_lease())
        self._heartbeat.add_done_callback(self._heartbeat_stopped)

    def _heartbeat_stopped(self, _task: asyncio.Task[None]) -> None:
        ended = self._heartbeat_ended
        if ended is not None and not ended.done():
            ended.set_result(None)

    async def _renew_lease(self) -> None:
        """Renew the lease every ``lease / 3`` seconds until the outcome is settled, or until
        an abandoned handler has stopped (not while background tasks run after the
        response)."""
        while not (
            self._phase is _Phase.SETTLED or (self._phase is _Phase.ABANDONED and self._stopped)
        ):
            try:
                renewal = await self._settler.renew(self._reservation, lease=self._lease)
            except SettleError as exc:  # transient (BackendError, DurabilityError): beat on
                self._guard.renew_failed(exc)
            # Anything else too: a heartbeat that stopped would let the lease lapse under a
            # running handler, and a retry would run it again. (A cancellation is not an
            # Exception: it stops here.)
            except Exception as exc:  # noqa: BLE001
                self._guard.log.warning("settle.http.renew_failed", error=type(exc).__name__)
            else:
                if not renewal.renewed:
                    self._guard.lease_lost(renewal.reason)
                    self._attempt.mark_lost(renewal)
                    return
            await asyncio.sleep(self._lease / 3)

    # -- capturing the response ----------------------------------------------------------

    async def _capture(self, message: Message) -> None:
        if self._phase is _Phase.ABANDONED:
            return  # the client left or the attempt timed out: nobody reads this
        kind = message["type"]
        if kind == "http.response.start":
            self._start = message
            if not self._guard.keeps(int(message["status"]), 0):
                self._streaming = True
                await self._forward(message)
            return
        if kind != "http.response.body":
            await self._forward(message)  # extensions (trailers, ...) pass through
            return
        chunk = bytes(message.get("body", b""))
        more = bool(message.get("more_body", False))
        if self._streaming:
            self._size += len(chunk)  # the size the first client was sent, as WSGI counts it
            if not more:
                await self._finish()
            await self._forward(message)
            return
        self._chunks.append(chunk)
        self._size += len(chunk)
        assert self._start is not None
        if not self._guard.keeps(int(self._start["status"]), self._size):
            self._streaming = True
            if not more:
                await self._finish()
            await self._forward(self._start)
            await self._forward(
                {"type": "http.response.body", "body": b"".join(self._chunks), "more_body": more}
            )
            self._chunks.clear()
            return
        if not more:
            await self._finish()

    async def _forward(self, message: Message) -> None:
        assert self._send is not None
        self._downstream_started = True
        await self._send(message)

    async def _finish(self) -> None:
        """The handler sent its last byte: settle, then (if buffered) send the response."""
        self._phase = _Phase.FINISHING
        assert self._start is not None
        status = int(self._start["status"])
        body = None if self._streaming else b"".join(self._chunks)
        try:
            step = self._guard.finished(
                self._run, status, list(self._start.get("headers", [])), body, self._size
            )
            instead = await self._settle(step)
            if body is None:
                return  # sent on as it streamed: nothing else can be said
            if instead is not None:
                await self._answer(instead)
                return
            await self._forward(self._start)
            await self._forward({"type": "http.response.body", "body": body, "more_body": False})
        finally:
            self._phase = _Phase.SETTLED

    async def _answer_superseded(self, record: OperationRecord | None) -> None:
        """This attempt lost its reservation: answer with what is authoritative instead."""
        await self._answer(self._guard.superseded(record))

    async def _answer(self, response: Response) -> None:
        if self._downstream_started:
            return  # part of the response is out already; nothing else can be said
        await self._respond(response)

    async def _respond(self, response: Response) -> None:
        assert self._send is not None
        self._downstream_started = True
        await send_response(self._send, response)

    # -- settlement calls ----------------------------------------------------------------

    async def _settle(self, step: Settle | None) -> Response | None:
        """Carry out the guard's settlement; return what to answer instead, if anything."""
        while step is not None:
            try:
                settlement = await step.call(self._settler)
            except SettleError as exc:
                step = self._guard.settle_failed(step, exc)
            else:
                return self._guard.settled(step, settlement)
        return None


async def send_response(send: Send, response: Response) -> None:
    """Send a complete response in two ASGI messages."""
    headers = list(response.headers)
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": False})


async def _watch_disconnect(receive: Receive, gone: asyncio.Event) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
            return


async def _cancel(task: asyncio.Task[None]) -> None:
    """Cancel the handler and wait until its task has ended. A sync handler's thread (run by
    the framework in a thread pool) cannot be interrupted and may go on after that: see
    docs/http-endpoints.md."""
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # what it raised while stopping changes nothing: it is provisional
