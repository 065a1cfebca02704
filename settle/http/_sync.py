"""The blocking driver of :class:`~settle.http._rules.Guard`, for the WSGI and Django shells.

A shell hands it the request's head and an :class:`Exchange` (how to ask the principal,
read the body and call the app); the driver carries out the guard's steps on the sync
:class:`~settle.Settler` and returns the response to send. The handler runs in the calling
thread while the decorator's heartbeat thread renews the lease; a thread cannot be
interrupted, so a lost lease is reported through ``attempt.lost`` and the settlement of
a superseded attempt is quarantined. No rule lives here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Protocol

from settle._core import heartbeat
from settle._sync.settler import Settler
from settle._telemetry import telemetry
from settle.decorator._plan import Run as HeartbeatRun
from settle.decorator._sync import _Heartbeats
from settle.errors import ConfigurationError, SettleError
from settle.http._rules import (
    Answer,
    Forward,
    Guard,
    Identify,
    ReadBody,
    Release,
    Reserve,
    Run,
    Settle,
)
from settle.http.policy import IdempotencyPolicy
from settle.http.problems import Response
from settle.http.request import (
    BodyBuffer,
    ClientDisconnected,
    RequestHead,
    RequestMalformed,
    RequestTooLarge,
)

if TYPE_CHECKING:
    from settle.attempt import Attempt

_SETTLER_NEEDED = (
    "give 'settler' (a settle.Settler or its dotted path 'package.module.name') or 'url' and "
    "'namespace' (e.g. {'url': 'redis://localhost:6379/0', 'namespace': 'shop'})"
)

__all__ = [
    "Exchange",
    "NotReached",
    "Raised",
    "Streamed",
    "Streaming",
    "SyncGuard",
    "configured_guard",
    "do_nothing",
    "resolve",
    "status_line",
]


class NotReached(Exception):  # a signal between a shell and the driver
    """What :meth:`Exchange.call` raises when the application answered before the guarded
    handler ran (a Django middleware's refusal, e.g. the CSRF check's 403; a 404 of URL
    resolution): ``response`` is sent as it is and never stored, so the key stays usable
    for the same request (the attempt is marked provisional: nothing ran under it; the
    record keeps its fingerprint, so a changed request is still a 422)."""

    def __init__(self, response: Response) -> None:
        super().__init__("the guarded handler was not reached")
        self.response = response


class Raised(Exception):  # a signal between a shell and the driver
    """What :meth:`Exchange.call` raises when the framework answered the guarded handler's
    exception with its own 5xx (Django's and Flask's 500): ``response`` is that answer, and
    the attempt is settled as the exception it is (``exception``), as under ASGI and plain
    WSGI, which see the exception itself. ``at``: the ``time.monotonic()`` instant the
    framework caught it (its ``got_request_exception``), which the deadline is asked of:
    the framework logs the exception and renders its 500 after that, which may take long."""

    def __init__(self, response: Response, at: float, error: BaseException | None = None) -> None:
        super().__init__("the guarded handler raised")
        self.response = response
        self.at = at
        self.error = error  # the exception the framework caught, if it said


@dataclasses.dataclass
class Streaming:
    """What :meth:`Exchange.call` returns for a response that passed ``max_response_bytes``
    before its end: its status and headers, the parts held so far (``held``, ``size`` bytes
    in all) and the rest as the app yields it (``rest``; ``close``: the app's iterable's
    ``close()``, to call once). It is never stored: it is sent on as it streams."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    held: deque[bytes]  # the shell may add to it while ``rest`` is read (WSGI's write())
    size: int
    rest: Iterator[bytes]
    close: Callable[[], object]


class Exchange(Protocol):
    """One request as a sync shell sees it."""

    #: The ``time.monotonic()`` instant the app chose the status of the response
    #: :meth:`call` returned (PEP 3333: its last ``start_response``; Django: its response
    #: came back), which the deadline is asked of: a body that runs on past it does not
    #: turn a 5xx chosen in time into a 504, as under ASGI, whose response start went out.
    chosen: float | None

    def principal(self) -> object:
        """What the principal callable returns for this request."""

    def body(self, buffer: BodyBuffer) -> bytes:
        """Read the whole body into ``buffer`` (it raises past its limit) and keep it for
        the app to read again; return it. :class:`ClientDisconnected` if it ends early."""

    def call(self, attempt: Attempt, limit: int) -> Response | Streaming:
        """Run the app with ``attempt`` and return its whole response (:class:`NotReached`
        when the app answered without running the guarded handler), or, once more than
        ``limit`` bytes of it came with more to come, a :class:`Streaming` of the rest."""

    def report(self, error: BaseException) -> None:
        """The handler raised ``error`` and its client gets settle's 504 or 409 in its place:
        hand its traceback to where the server would have logged it, had it been raised
        (plain WSGI: ``environ["wsgi.errors"]``; a framework that reported it already as it
        caught it, Django, does nothing)."""


def write_traceback(stream: object, error: BaseException) -> None:
    """Write ``error``'s traceback to ``stream``, a server's error log (PEP 3333's
    ``wsgi.errors``: gunicorn's error log, wsgiref's stderr), where the server would have
    written it had the error been raised to it (:meth:`Exchange.report`). No stream, or one
    that fails, changes nothing: the answer goes out all the same."""
    write = getattr(stream, "write", None)
    if write is None:
        return
    try:
        write("".join(traceback.format_exception(error)))
        stream.flush()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001, S110  # the answer goes out all the same
        pass


class SyncGuard:
    """Carries out the guard's steps with blocking calls; one per middleware."""

    def __init__(self, settler: Settler, policy: IdempotencyPolicy) -> None:
        if not isinstance(settler, Settler):  # an AsyncSettler's calls would go unawaited
            raise ConfigurationError(
                f"settler must be a settle.Settler, got {type(settler).__name__} (an "
                "AsyncSettler guards ASGI apps: settle.asgi.IdempotencyMiddleware)"
            )
        policy.check_store(settler.config.max_result_bytes)
        self.settler = settler
        self.policy = policy
        self._beats = _Heartbeats(settler)

    def handle(
        self, head: RequestHead, exchange: Exchange, held: Iterable[Attempt] = ()
    ) -> Response | Streamed | None:
        """The response to send, or None when the request is not guarded (call the app).
        ``held``: the attempts of the guards that run the request already
        (:func:`settle.http.attempt.held_attempts`). A :class:`Streamed` response settles
        the request as it is sent (its last part, or its ``close()``)."""
        config = self.settler.config
        guard = Guard(self.policy, config.namespace, config.lease, head, held)
        request = telemetry().http_request(config.namespace)
        streamed = False
        try:
            step = guard.start()
            while True:
                match step:
                    case Forward():
                        return None
                    case Answer():
                        return step.response
                    case Identify():
                        try:
                            principal = exchange.principal()
                        except Exception as exc:  # noqa: BLE001  # the guard answers a 500 problem
                            step = guard.principal_failed(exc)
                        else:
                            step = guard.identified(principal)
                    case ReadBody():
                        try:
                            body = exchange.body(BodyBuffer(step.limit, head.content_length))
                        except RequestTooLarge as exc:
                            step = guard.body_too_large(exc)
                        except RequestMalformed as exc:
                            step = guard.body_malformed(exc)
                        except ClientDisconnected:
                            step = guard.disconnected()
                        else:
                            step = guard.body_read(body)
                    case Reserve():
                        try:
                            outcome = step.call(self.settler)
                        except SettleError as exc:
                            step = guard.reserve_failed(exc)
                        else:
                            step = guard.reserved(outcome)
                    case Release():
                        step = self._release(guard, step)
                    case Run():
                        sent = self._run(guard, step, exchange, request.capture())
                        if isinstance(sent, Streamed):
                            streamed = True
                            sent.finished = request.finished
                        return sent
        finally:
            if not streamed:
                request.finished(guard.outcome)

    def _run(
        self, guard: Guard, run: Run, exchange: Exchange, context: AbstractContextManager[Any]
    ) -> Response | Streamed:
        """Run the handler while the heartbeat thread renews the lease; its failed renewals
        are logged under the request's logger, its renewals are children of the request's
        span (``context``). A response over ``max_response_bytes`` keeps the heartbeat
        until it is sent (:meth:`_stream`)."""
        beat = HeartbeatRun(
            run.reservation, run.attempt, None, run.lease, heartbeat.interval(run.lease), run.first
        )
        # A renewal that finds the record gone leaves the attempt unmarked, as under ASGI;
        # one that finds the lease lost is logged as under ASGI.
        beating = self._beats.add(beat, guard, context, runs_on=guard.runs_on)
        streamed: Streamed | None = None
        try:
            try:
                response = exchange.call(run.attempt, self.policy.max_response_bytes)
            except NotReached as refused:
                if not self._failed(guard, run, "handler_not_reached"):
                    guard.abandoned("lease_lost")  # the refusal goes out all the same
                return refused.response
            except Raised as raised:
                # The framework answered the handler's exception with its 5xx: settled as
                # that exception, as under ASGI; its client gets that answer, or the 504 /
                # the 409 a timeout or a lost lease gives.
                if guard.timed_out(run, at=raised.at):
                    return self._timed_out(guard, run, raised.error)
                if not self._failed(guard, run, "exception"):
                    return guard.stopped_by_loss(raised.error)
                return raised.response
            except BaseException as exc:
                guard.handler_raised(exc)  # first: whatever settling it raises chains to it
                if isinstance(exc, Exception) and guard.timed_out(run):
                    # attempt.check()'s TimeoutError, or an error past the deadline: its
                    # client gets the 504 ASGI answers when its timeout stops a handler.
                    # A bug's traceback goes to the server's log, not to the server.
                    if guard.reports(run, exc):
                        exchange.report(exc)
                    return self._timed_out(guard, run, exc)
                if not self._failed(guard, run, "exception"):
                    if guard.stops(run, exc):
                        # The lease is lost (attempt.check()'s StaleAttempt, or the
                        # handler's own error after the loss): its client gets what ASGI
                        # answers when it stops one, and the stale attempt settles nothing.
                        if guard.reports(run, exc):
                            exchange.report(exc)
                        return guard.stopped_by_loss(exc)
                    guard.abandoned("lease_lost")  # a KeyboardInterrupt: superseded too
                raise
            if isinstance(response, Streaming):
                sent = self._stream(guard, run, response, exchange.chosen)
                if isinstance(sent, Streamed):
                    streamed = sent
                    sent.beating = beating
                return sent
            size = len(response.body)
            step = guard.finished(run, response.status, list(response.headers), response.body, size)
            instead: Response | None
            if step.stored is None and guard.timed_out(run, response.status, exchange.chosen):
                # The 500 a framework (Django, Flask) made of an error past the deadline.
                instead = self._timed_out(guard, run)
            elif guard.settles(run, step):
                instead = self._settle(guard, step)
            else:
                # An error answered after the lease was lost (a framework's 500 for the
                # StaleAttempt of attempt.check()): stale, and nothing to store.
                instead = guard.stopped_by_loss()
        finally:
            if streamed is None:
                self._beats.remove(beating)
        return response if instead is None else instead

    def _stream(
        self, guard: Guard, run: Run, response: Streaming, chosen: float | None
    ) -> Response | Streamed:
        """A response over ``max_response_bytes`` with more to come, about to be sent on
        before its end, as ASGI sends it. Before its first byte goes out: a status that is
        never stored is replaced by the 409 when the lease is known lost, by the 504 when it
        was chosen past the deadline (a 5xx); a finished one asks a renewal whether this
        attempt still owns the operation (one round trip, for such responses only). When a
        newer attempt owns it, the rest is read to its end and dropped, and its settlement
        (quarantined: the evidence) answers with the authoritative response or the 409."""
        status = response.status
        if not guard.keeps(status, 0):
            if run.attempt.lost:
                response.close()
                return guard.stopped_by_loss()
            if guard.timed_out(run, status, chosen):
                response.close()
                return self._timed_out(guard, run)
            return Streamed(self, guard, run, response)
        try:
            renewal = self.settler.renew(run.reservation, lease=run.lease)
        except SettleError as exc:  # a store that cannot be asked: sent on, as under ASGI
            guard.renew_failed(exc)
            return Streamed(self, guard, run, response)
        if guard.still_owns(run, renewal):
            return Streamed(self, guard, run, response)
        run.attempt.mark_lost(renewal)
        size = response.size
        response.held.clear()
        try:
            for chunk in response.rest:  # the handler runs to its end, as under ASGI
                size += len(chunk) + sum(map(len, response.held))  # and what it wrote
                response.held.clear()
        finally:
            response.close()
        step = guard.finished(run, status, list(response.headers), None, size)
        instead = self._settle(guard, step)
        return guard.superseded(renewal.record) if instead is None else instead

    def _timed_out(self, guard: Guard, run: Run, error: BaseException | None = None) -> Response:
        """The handler ended in error (``error``, if it raised) past its ``timeout``
        (:meth:`Guard.timed_out`): the 504 ``handler-timeout``, and the attempt provisional
        (``timeout``), as under ASGI. Unless the lease is known lost by the time it would
        be marked (:meth:`Guard.settles`, asked last, as :meth:`_failed` does): a newer
        attempt may own the operation, and the mark would be quarantined against its record;
        the 504 stands and nothing is settled, as when ASGI's timeout stopped a handler
        whose lease was lost while it stopped."""
        problem = guard.abandoned("timeout", error)
        assert problem is not None, "a timeout is answered"
        step = guard.failed(run, "timeout")
        if guard.settles(run, step):
            self._settle(guard, step)
        else:
            guard.superseded(None)  # the outcome, as ASGI's: its answer is the 504
        return problem

    def _failed(self, guard: Guard, run: Run, reason: str) -> bool:
        """Mark the attempt provisional (``reason``: the handler raised, or was not
        reached), unless its lease is known lost (:meth:`Guard.settles`: a newer attempt
        may own the operation, and a stale mark would be quarantined against it). Whether
        it was settled."""
        step = guard.failed(run, reason)
        if not guard.settles(run, step):
            return False
        self._settle(guard, step)
        return True

    def _release(self, guard: Guard, step: Release) -> Answer:
        """Mark provisional the reservation ``step`` finds this request holds, if any; the
        guard's 503 stands whatever that answers."""
        with contextlib.suppress(SettleError):
            own = step.reservation(self.settler.get(step.operation_id))
            if own is not None:
                self.settler.mark_provisional(own, step.reason)
        return guard.released()

    def _settle(self, guard: Guard, step: Settle | None) -> Response | None:
        """Carry out the guard's settlement; return what to answer instead, if anything."""
        while step is not None:
            try:
                settlement = step.call(self.settler)
            except SettleError as exc:
                step = guard.settle_failed(step, exc)
            else:
                return guard.settled(step, settlement)
        return None


class Streamed:
    """A response over ``max_response_bytes``, sent on as the app yields it: the parts held
    so far, then the rest, one part read ahead so that the operation is settled before the
    last part goes out (completed "not stored", or provisional for a status never stored).
    The app's iterable is closed once: at its end, when it raises, or at :meth:`close` (the
    server stopped iterating: its client went away), which leaves the attempt provisional
    (``client_disconnect``), as under ASGI. The heartbeat renews the lease until then."""

    def __init__(self, driver: SyncGuard, guard: Guard, run: Run, response: Streaming) -> None:
        self._driver = driver
        self._guard = guard
        self._run = run
        self._response = response
        self._parts = response.held  # shared: the shell adds what the app writes to it
        self._sent = 0  # bytes out of the queue
        self._done = False  # the app's iterable is read to its end, or failed
        self._closed = False
        self.beating: int | None = None
        self.finished: Callable[[str | None], object] | None = None
        self.status = response.status
        self.headers = response.headers

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        if self._closed:
            raise StopIteration
        if not self._done and len(self._parts) <= 1:  # one part read ahead, no more
            try:
                chunk = next(self._response.rest)
            except StopIteration:
                self._ended()  # settled before the last part goes out
            except BaseException as exc:
                self._raised(exc)
                raise
            else:
                self._parts.append(chunk)
        if self._parts:
            part = self._parts.popleft()
            self._sent += len(part)
            return part
        self.close()
        raise StopIteration

    def _ended(self) -> None:
        self._done = True
        self._release()
        guard, run = self._guard, self._run
        size = self._sent + sum(map(len, self._parts))  # written parts too
        step = guard.finished(run, self.status, list(self.headers), None, size)
        if guard.settles(run, step):
            self._driver._settle(guard, step)  # nothing else can be said: it streams
        else:
            guard.stopped_by_loss()  # a status never stored, the lease known lost

    def _raised(self, exc: BaseException) -> None:
        """The app's iterable raised ``exc`` while it streamed: its client has part of the
        response, so nothing else can be said; the error goes on to the server (which
        breaks the connection off, so that the client sees the response cut), and the
        attempt is provisional (``timeout`` past the deadline, else ``exception``; nothing
        when the lease is known lost)."""
        self._done = True
        self._parts.clear()
        try:
            self._release()
        finally:
            guard, run, driver = self._guard, self._run, self._driver
            guard.handler_raised(exc)
            if isinstance(exc, Exception) and guard.timed_out(run):
                driver._timed_out(guard, run, exc)
            elif not driver._failed(guard, run, "exception"):
                guard.abandoned("lease_lost", exc)
            self.close()

    def close(self) -> None:
        """The server is done with the response (PEP 3333): if the app's iterable was not
        read to its end, its client went away (or the server stopped): provisional
        (``client_disconnect``), as under ASGI; nothing when the lease is known lost."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self._done:
                self._done = True
                self._parts.clear()
                try:
                    self._release()
                finally:
                    guard, run = self._guard, self._run
                    if run.attempt.lost:
                        guard.abandoned("lease_lost")
                    else:
                        guard.abandoned("client_disconnect")
                        self._driver._failed(guard, run, "client_disconnect")
        finally:
            if self.beating is not None:
                self._driver._beats.remove(self.beating)
            if self.finished is not None:
                self.finished(self._guard.outcome)

    def _release(self) -> None:
        """The app's iterable's ``close()``, once (and the heartbeat stops once settled)."""
        close, self._response.close = self._response.close, do_nothing
        close()


def do_nothing() -> None:
    """A ``close`` that closes nothing (an iterable closed already, or without one)."""


def status_line(status: int) -> str:
    """``201 Created``: the WSGI status of a response the middleware writes itself."""
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Unknown"


def configured_guard(options: dict[str, Any], default_principal: Any = None) -> SyncGuard:
    """The driver of a framework integration configured by a dict (Django's
    ``settings.SETTLE``, Flask's ``app.config["SETTLE"]``): ``settler`` or ``url`` and
    ``namespace``, ``principal`` (a callable or its dotted path), and the middleware options.
    """
    options = dict(options)
    settler = resolve(options.pop("settler", None))
    url, namespace = options.pop("url", None), options.pop("namespace", None)
    if settler is None and url is not None and namespace is not None:
        settler = _settler_for(url, namespace)
    if not isinstance(settler, Settler):
        raise ConfigurationError(f"the settle configuration has no settler: {_SETTLER_NEEDED}")
    principal = resolve(options.pop("principal", default_principal))
    if principal is None:
        raise ConfigurationError(
            "the settle configuration needs 'principal': a callable (or its dotted path) that "
            "names the authenticated caller of a request, or returns None (401)"
        )
    return SyncGuard(settler, IdempotencyPolicy.configure(principal=principal, **options))


def resolve(value: Any) -> Any:
    """An object, or the object a dotted path ``package.module.name`` names."""
    if not isinstance(value, str):
        return value
    module, _, name = value.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigurationError(f"cannot import {value!r}: give 'package.module.name'") from exc


@functools.cache
def _settler_for(url: str, namespace: str) -> Settler:
    """One settler per process and configuration, shared by every guarded view."""
    return Settler.from_url(url, namespace=namespace)
