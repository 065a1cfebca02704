"""Running the handler under a reservation, and settling the reservation from its response.

The handler runs in the request's own task. A heartbeat renews the lease once the first
renewal is due, and a listener hears the client go away once the handler has run for
``LISTEN_AFTER``; a timeout, a disconnect or a lost lease stops the handler by cancelling
the request's task, as ``asyncio.timeout`` does, and a cancellation from the server is told
apart from those and passed on. The response is captured through ``send``:

* a finished response (:meth:`Guard.keeps`) is buffered; when its last byte arrives it
  is stored with ``complete`` and only then sent, so a client that saw the whole response
  always finds it stored;
* a response over ``max_response_bytes`` is sent on as it streams; when it ends the
  operation is completed with a "not stored" marker (a retry gets 410, never a re-run).
  Until some of it is sent it is held back, so a superseded attempt still answers with the
  authoritative response or a 409: one that crosses the limit with its last byte waits for
  ``complete``; one with more to come waits for a renewal that says the attempt still owns
  the operation;
* any other status (1xx, 304, 5xx, 408, 409, 429) is sent on as it streams and the attempt
  is marked provisional just before its last byte, so the retry runs the handler again
  (other 3xx are finished answers: :func:`~settle.http.stored.storable_status`); one that
  starts once the lease is known lost (its stop put off: :meth:`AttemptRunner._interrupt`)
  marks nothing, and a 409 goes out in its place.

An exception, a timeout or a client disconnect before the last byte marks the attempt
provisional too; on a timeout or a disconnect the handler is cancelled first. Work the
app does after its last byte (background tasks) never changes the stored outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from enum import Enum

from settle._async.settler import AsyncSettler
from settle._core import heartbeat
from settle.asgi._types import ASGIApp, Message, Receive, Scope, Send
from settle.errors import SettleError
from settle.http._rules import Guard, Run, Settle
from settle.http.attempt import carrying
from settle.http.problems import Response
from settle.models import OperationRecord

__all__ = ["AttemptRunner", "send_response"]

#: ASGI extensions that send a response without body messages.
_FILE_SENDS = frozenset({"http.response.pathsend", "http.response.zerocopysend"})

#: Seconds a handler runs before the middleware listens for its client leaving. A listener
#: is a task of its own: a handler done sooner never needs one. A client gone before then is
#: noticed then (the handler is stopped and the attempt left provisional all the same).
LISTEN_AFTER = 0.1

#: Seconds before a stop that found another cancellation in flight looks again, and how
#: long it waits for that cancellation to end before it stops the handler all the same.
_LOOK_AGAIN = 0.01
_WAIT_FOR_OTHERS = 1.0


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
        self._replaced = False  # a superseded attempt's answer goes out in its place
        self._stopped = False  # the handler task has ended (after being cancelled)
        self._heartbeat: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._responder: asyncio.Task[None] | None = None
        self._gone = asyncio.Event()  # the listener heard the client leave
        self._task: asyncio.Task[object]
        self._reason: str | None = None  # why _interrupt stopped the handler
        self._others_until: float | None = None  # see _interrupt
        self._late_5xx = False  # stopped at a 5xx start past the deadline (_capture)
        self._receive: Receive
        self._timer: asyncio.TimerHandle  # the listener's or the heartbeat's: see run

    async def run(self, scope: Scope, receive: Receive, send: Send, body: bytes) -> None:
        self._send = send
        task = asyncio.current_task()
        assert task is not None, "an ASGI app runs in a task"
        self._task = task
        gone = self._gone
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
        # No listener and no heartbeat task until they can matter: most handlers are done
        # before either starts (docs/http-endpoints.md, "What a request costs"). One timer
        # at a time: the first of the two is due, then it schedules the other.
        self._receive = receive
        now = loop.time()
        listen_at, beat_at = now + LISTEN_AFTER, now + self._run.first
        listen, beat = self._start_listening, self._start_heartbeat
        if listen_at <= beat_at:
            self._timer = loop.call_at(listen_at, self._due, listen, beat, beat_at)
        else:
            self._timer = loop.call_at(beat_at, self._due, beat, listen, listen_at)
        timeout = None
        if self._policy.timeout is not None:
            timeout = loop.call_later(self._policy.timeout, self._interrupt, "timeout")
        try:
            await self._run_app(task, scope, app_receive)
        finally:
            self._timer.cancel()
            if timeout is not None:
                timeout.cancel()
            helpers = [t for t in (self._listener, self._heartbeat) if t is not None]
            for helper in helpers:
                helper.cancel()
            if self._responder is not None:
                helpers.append(self._responder)  # an answer already on its way: let it go out
            if helpers:
                await asyncio.gather(*helpers, return_exceptions=True)

    async def _call_app(self, scope: Scope, receive: Receive) -> None:
        # A guarded response must go through http.response.body messages to be stored:
        # hide the server's send-a-file extensions, so the app falls back to body messages
        # (a pathsend after a held-back start would break the response and re-run the
        # handler on the next retry).
        extensions = {
            k: v for k, v in (scope.get("extensions") or {}).items() if k not in _FILE_SENDS
        }
        # The handler finds this guard's attempt in scope["settle"]; a guard inside finds
        # every guard's around it (held_attempts).
        await self._app(
            {**scope, "extensions": extensions, **carrying(scope, self._attempt)},
            receive,
            self._capture,
        )

    # -- supervision ---------------------------------------------------------------------

    async def _run_app(self, task: asyncio.Task[object], scope: Scope, receive: Receive) -> None:
        """Run the app in this task and settle what it did. A timeout, the client leaving or
        the lost lease stops it by cancelling this task (:meth:`_interrupt`), as
        ``asyncio.timeout`` does; a cancellation that is not ours (the server's) is settled
        and raised."""
        try:
            error = await self._app_ended(task, scope, receive)
            if error is not None and self._reason is None and self._timed_out():
                # It raised past its deadline (attempt.check()'s TimeoutError) before the
                # timer could fire (the loop was held): the timeout it is, as under WSGI.
                self._report(error)
                await self._stop_late("timeout", error)
                return
            # A lease lost while another cancellation was in flight put its stop off: the
            # handler ended still RUNNING, and is superseded all the same.
            if self._reason is not None or (self._attempt.lost and self._phase is _Phase.RUNNING):
                self._phase = _Phase.ABANDONED
                if self._reason is None:
                    # As _interrupt would have; an error it raised on its own is reported.
                    if error is not None:
                        self._report(error)
                    self._guard.abandoned("lease_lost", error)
                elif error is not None and self._late_5xx:
                    # The 5xx the 504 replaced was a framework's answer to this error, which
                    # it raised on for the server to log (Starlette's ServerErrorMiddleware):
                    # the bug is reported, as under WSGI.
                    self._report(error)
                # Else what it raised while stopping is moot.
                await self._stopped_by(self._reason or "lease_lost")
                return
            if self._phase is _Phase.RUNNING:
                self._phase = _Phase.SETTLED
                reason = "exception" if error else "no_response"
                await self._settle(self._guard.failed(self._run, reason))
        except asyncio.CancelledError:
            await self._cancelled_from_outside()
            raise
        if error is not None:
            self._guard.handler_raised(error)
            raise error

    async def _app_ended(
        self, task: asyncio.Task[object], scope: Scope, receive: Receive
    ) -> Exception | None:
        """Call the app; what it raised, if anything. Raises CancelledError only for a
        cancellation that is not ours, with ours taken back."""
        error: Exception | None = None
        try:
            await self._call_app(scope, receive)
        except asyncio.CancelledError:
            if self._reason is None and not task.cancelling():
                # The handler raised it on its own (an awaited task of its was cancelled):
                # no one is stopping this request, so it ends as a handler without an answer.
                return None
            if self._reason is None or task.uncancel() > 0:
                raise
            return None  # ours, and it reached the handler
        except Exception as exc:  # noqa: BLE001  # settled, then raised to the server
            error = exc
        if self._reason is not None and await _absorb_cancel(task):
            raise asyncio.CancelledError
        return error

    def _timed_out(self, status: int | None = None) -> bool:
        """Whether the handler, still running, ended in error (``status``: its 5xx) past its
        deadline (:meth:`Guard.timed_out`)."""
        return self._phase is _Phase.RUNNING and self._guard.timed_out(self._run, status)

    def _report(self, error: BaseException) -> None:
        """The handler's own ``error``, answered with a 504 or a 409 in its place, goes to
        the event loop's exception handler (:func:`_to_exception_handler`), its operation
        named by its digest (:meth:`Guard.handler_raised`); not the stop of
        ``attempt.check()`` (:meth:`Guard.reports`)."""
        if self._guard.reports(self._run, error):
            self._guard.handler_raised(error)
            _to_exception_handler(error)

    async def _stop_late(self, reason: str, error: BaseException | None = None) -> None:
        """The handler ended on its own (``error``: what it raised, if it did) with what
        :meth:`_interrupt` would have answered (``reason``): answer and settle it as that
        stop does."""
        self._phase = _Phase.ABANDONED
        self._reason = reason
        problem = self._guard.abandoned(reason, error)
        if problem is not None:
            await self._answer(problem)
        await self._stopped_by(reason)

    def _interrupt(self, reason: str) -> None:
        """A timeout, a disconnect or the lost lease while the handler runs: answer now if
        the guard has an answer, and stop the handler (the cancellation reaches it at the
        await it is in; after its last byte nothing stops it)."""
        if self._phase is not _Phase.RUNNING:
            return
        loop = asyncio.get_running_loop()
        if self._task.cancelling():
            # Someone else is cancelling the request (the server, or a scope inside the
            # handler): let that end first, then look again, for up to _WAIT_FOR_OTHERS
            # seconds. The server's own cancellation keeps its reason (`cancelled`) and the
            # handler's cleanup is not cut short; a handler that swallowed it is stopped all
            # the same once the wait is over.
            if self._others_until is None:
                self._others_until = loop.time() + _WAIT_FOR_OTHERS
            if loop.time() < self._others_until:
                loop.call_later(_LOOK_AGAIN, self._interrupt, reason)
                return
        self._phase = _Phase.ABANDONED
        self._reason = reason
        problem = self._guard.abandoned(reason)
        if problem is not None and not self._downstream_started:
            # Answer at the timeout, not when the handler's cleanup ends.
            self._downstream_started = True
            self._responder = loop.create_task(self._respond(problem))
        self._task.cancel()

    async def _stopped_by(self, reason: str) -> None:
        """The handler stopped after :meth:`_interrupt`: settle the attempt (an answer, if
        any, is on its way already: :meth:`run` waits for it)."""
        self._stopped = True
        if reason == "lease_lost" or self._attempt.lost:
            # Another attempt may own the operation now (its lease may also have been lost
            # while the handler stopped for another reason): this one must not settle it.
            await self._answer_superseded(None)
            return
        # The heartbeat kept the lease while the handler stopped: a retry meanwhile got 409,
        # never a second handler running beside this one.
        await self._settle(self._guard.failed(self._run, reason))

    async def _cancelled_from_outside(self) -> None:
        """The server cancelled the request (shutdown, or a server that cancels on
        disconnect): a handler that had not finished, or had not finished stopping, is
        settled as provisional (a settlement already under way finishes on its own:
        :meth:`_settle`)."""
        if self._phase is _Phase.RUNNING or (self._phase is _Phase.ABANDONED and not self._stopped):
            reason = "lease_lost" if self._attempt.lost else (self._reason or "cancelled")
            if reason == "lease_lost" and self._reason is None:
                # Lost while its stop was put off: reported as every other way out of a
                # lost lease is (the loss itself was logged as settle.http.lease_lost).
                self._guard.abandoned(reason)
            self._phase = _Phase.ABANDONED
            self._stopped = True
            if reason != "lease_lost":
                await self._settle(self._guard.failed(self._run, reason))

    def _due(self, start: Callable[[], None], then: Callable[[], None], then_at: float) -> None:
        """The first of the listener and the heartbeat is due: start it, and time the other."""
        start()
        self._timer = asyncio.get_running_loop().call_at(then_at, then)

    def _start_listening(self) -> None:
        """The handler is still running ``LISTEN_AFTER`` seconds in: listen for the client
        leaving."""
        self._listener = asyncio.get_running_loop().create_task(self._listen(self._receive))

    async def _listen(self, receive: Receive) -> None:
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        except Exception:  # noqa: BLE001, S110  # a receive that fails: the client is gone
            pass
        self._gone.set()
        self._interrupt("client_disconnect")

    def _start_heartbeat(self) -> None:
        """The first renewal is due (``lease / 3`` after ``reserve`` was sent): renew."""
        self._heartbeat = asyncio.get_running_loop().create_task(self._renew_lease())

    async def _renew_lease(self) -> None:
        """Renew the lease every ``lease / 3`` seconds until the outcome is settled, or until
        an abandoned handler has stopped (not while background tasks run after the
        response)."""
        loop = asyncio.get_running_loop()
        while not (
            self._phase is _Phase.SETTLED or (self._phase is _Phase.ABANDONED and self._stopped)
        ):
            # Due a heartbeat after this one is sent, not after it returns: a renewal that
            # waits (min_replicas: up to a heartbeat, Call.wait_ms) would push each later one back.
            due = loop.time() + heartbeat.interval(self._lease)
            try:
                renewal = await self._settler.renew(self._reservation, lease=self._lease)
            # Transient (BackendError, DurabilityError) or anything else: beat on. A heartbeat
            # that stopped would let the lease lapse under a running handler, and a retry
            # would run it again; so would one that stopped at a log line it could not write
            # (the guard drops it). (A cancellation is not an Exception: it stops here.)
            except Exception as exc:  # noqa: BLE001
                self._guard.renew_failed(exc)
            else:
                if self._phase in (_Phase.FINISHING, _Phase.SETTLED):
                    # The settlement is under way or written, and decides: a renewal sent as
                    # it was (pipelined behind it) reads the completed record, not a loss.
                    return
                # A record gone (Redis lost it while the handler ran: Guard.record_gone) or
                # a lease that only lapsed (still_owns) is not lost, and each is logged:
                # nobody took the key over, so the handler runs on, and a later renewal that
                # finds a takeover stops it.
                gone = self._guard.record_gone(renewal)
                if not gone and not self._guard.still_owns(self._run, renewal):
                    self._attempt.mark_lost(renewal)
                    self._interrupt("lease_lost")
                    return
            await asyncio.sleep(max(0.0, due - loop.time()))

    # -- capturing the response ----------------------------------------------------------

    async def _capture(self, message: Message) -> None:
        if self._phase is _Phase.ABANDONED:
            return  # the client left or the attempt timed out: nobody reads this
        kind = message["type"]
        # Out of ASGI's order (a body before its start; anything but trailers after the
        # last body): the server refuses it as it would without settle, and it settles
        # nothing (a second settlement would quarantine a "conflicting" response that never
        # went out). Asked in the order that makes the usual start and body cheap.
        if self._phase is _Phase.SETTLED:
            await self._forward(message)
            return
        if kind == "http.response.start":
            if self._start is not None:
                if self._downstream_started:
                    await self._forward(message)  # the server saw the first: it refuses this
                    return
                # The first is held back, so the server would take this one in its place:
                # refused here as the server refuses it (one start per response), and the
                # first stands.
                raise RuntimeError(
                    "Expected ASGI message 'http.response.body', but got 'http.response.start'."
                )
            headers = message.get("headers", ())
            if not isinstance(headers, list | tuple):
                # Any iterable of pairs (ASGI): read once here, for the store and the server.
                message = {**message, "headers": list(headers)}
            self._start = message
            status = int(message["status"])
            if self._reason is None and not self._task.cancelling() and self._timed_out(status):
                # A 5xx answered past the deadline (the handler's, or the 500 a framework
                # inside the guard makes of its error), the loop held so that the timer could
                # not fire: the timeout stops it now, and its client gets the 504 in place of
                # this answer, as under WSGI.
                self._late_5xx = True
                self._interrupt("timeout")
                return
            if not self._guard.keeps(status, 0):
                self._streaming = True
                # The lease known lost, its stop put off (_interrupt): this response marks
                # nothing, and none of it goes out: the client gets the 409 in its place
                # (_finish, or _stopped_by if the handler is stopped before its end).
                self._replaced = self._attempt.lost
                await self._forward(message)
            return
        if kind != "http.response.body" or self._start is None:
            # extensions (trailers, ...) pass through, and so does a body before its start
            await self._forward(message)
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
        if self._guard.keeps(int(self._start["status"]), self._size):
            if not more:
                await self._finish()
            return
        # Over max_response_bytes: never stored, and sent on from here. Nothing is out yet:
        # a superseded attempt still answers with the authoritative response or a 409
        # (by _finish when this is the last byte, by _still_owned when more follows).
        self._streaming = True
        if not more:
            await self._finish()
            return
        owned = await self._still_owned()
        if self._reason is not None:
            return  # timed out or the client left while the store was asked (_interrupt)
        if owned:
            await self._forward(self._start)
            await self._forward(
                {"type": "http.response.body", "body": b"".join(self._chunks), "more_body": True}
            )
        self._chunks.clear()

    async def _forward(self, message: Message) -> None:
        if self._replaced:
            return  # the client got settle's answer instead: the rest of this one is dropped
        assert self._send is not None
        self._downstream_started = True
        await self._send(message)

    async def _still_owned(self) -> bool:
        """A response over the limit is about to be sent on before its last byte, so before
        ``complete`` can say whether this attempt still owns the operation: ask with a
        renewal first (one round trip, for such responses only). A lease that only lapsed,
        with no newer attempt, still owns it (:meth:`Guard.still_owns`). When a newer attempt
        owns it, the client gets what :meth:`Guard.superseded` answers and the rest of this
        response is dropped; it is still settled at its last byte (quarantined: the
        evidence). A store that cannot be asked sends the response on, as before."""
        try:
            renewal = await self._settler.renew(self._reservation, lease=self._lease)
        except SettleError as exc:
            self._guard.renew_failed(exc)
            return True
        if self._guard.still_owns(self._run, renewal):
            return True
        self._attempt.mark_lost(renewal)
        await self._answer_superseded(renewal.record)
        self._replaced = True
        return False

    async def _finish(self) -> None:
        """The handler sent its last byte: settle, then send what is held back (the
        buffered response, or the answer that replaces it)."""
        self._phase = _Phase.FINISHING
        assert self._start is not None
        status = int(self._start["status"])
        body = None if self._streaming else b"".join(self._chunks)
        try:
            step = self._guard.finished(
                self._run, status, list(self._start.get("headers", [])), body, self._size
            )
            # Nothing to store, and the lease known lost (its stop was put off while another
            # cancellation ran): this one marks nothing (Guard.settles), and is superseded;
            # its client gets the 409, unless part of the response is out already.
            superseded = not self._guard.settles(self._run, step)
            instead = self._guard.stopped_by_loss() if superseded else await self._settle(step)
            self._phase = _Phase.SETTLED  # the outcome is written: the heartbeat stops
            if self._downstream_started:
                return  # sent on as it streamed (or answered already): nothing else to say
            if instead is not None:
                await self._answer(instead)
                return
            # Held back until now: a response within the limit, or one that crossed it
            # with its last byte.
            held = b"".join(self._chunks)
            self._chunks.clear()
            await self._forward(self._start)
            await self._forward({"type": "http.response.body", "body": held, "more_body": False})
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
        """Carry out the guard's settlement; return what to answer instead, if anything.

        The server may cancel the request while a settlement is on the wire (its shutdown):
        the settlement may or may not be written then, so it is sent again, shielded, before
        the cancellation goes on. A repeat of a written settlement is absorbed (SPEC 2, a
        repeat after a lost reply), so the record ends settled either way, never pending
        until its lease runs out with the handler's work done."""
        try:
            return await self._settle_steps(step)
        except asyncio.CancelledError:
            await asyncio.shield(self._settle_steps(step))
            raise

    async def _settle_steps(self, step: Settle | None) -> Response | None:
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


def _to_exception_handler(error: BaseException) -> None:
    """The handler raised ``error`` on its own and its client gets settle's 504 or 409 in
    its place: the error is not raised to the server, so its traceback goes to the event
    loop's exception handler (asyncio's logs it at ERROR, with the traceback, on the
    ``asyncio`` logger; an application's own handler, an error tracker's, gets it), so that
    a bug is seen. settle's own log names only its type (``settle.http.abandoned``)."""
    asyncio.get_running_loop().call_exception_handler(
        {
            "message": "settle: the guarded handler raised; its client got a 504 or a 409 in "
            "its place",
            "exception": error,
        }
    )


async def _absorb_cancel(task: asyncio.Task[object]) -> bool:
    """Take back the cancellation :meth:`AttemptRunner._interrupt` requested of ``task``
    when the handler ended before it reached it (or swallowed it): on Python before 3.13 a
    cancellation still pending would hit the next await, the settlement's. True if the task
    is also being cancelled by someone else."""
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(0)
    return task.uncancel() > 0
