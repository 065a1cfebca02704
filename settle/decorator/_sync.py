"""The sync driver: carries out the :class:`~settle.decorator._plan.Plan` with blocking
calls; the heartbeat renews the lease from a thread. No rule lives here."""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import itertools
import math
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from settle._log import logger, operation_digest
from settle._telemetry import telemetry
from settle.decorator._options import Options
from settle.decorator._plan import (
    Plan,
    Raise,
    Ran,
    Read,
    ReplayHook,
    Reserve,
    RetrySpec,
    Return,
    Run,
    Settle,
    Sleep,
    TerminalSpec,
)
from settle.decorator._signature import KeySpec, PrincipalSpec, RequestSpec, Signature
from settle.errors import InvalidInput
from settle.models import Action, Settlement

if TYPE_CHECKING:
    from settle._sync.settler import Settler

__all__ = [
    "KeySpec",
    "Operation",
    "PrincipalSpec",
    "ReplayHook",
    "RequestSpec",
    "RetrySpec",
    "TerminalSpec",
]

P = ParamSpec("P")
R = TypeVar("R")


class Operation:
    """``@settler.operation(...)`` for plain functions and methods (see ``Settler.operation``)."""

    def __init__(self, settler: Settler, options: Options) -> None:
        self._settler = settler
        self._options = options

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        if inspect.iscoroutinefunction(fn):
            raise InvalidInput(
                f"{fn.__qualname__} is async: decorate it with AsyncSettler.operation"
            )
        # The decorating scope's names resolve annotations of classes defined in it.
        signature, policy = self._options.prepare(fn, dict(sys._getframe(1).f_locals))
        settler = self._settler
        beats = _Heartbeats(settler)

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            plan = Plan(policy, signature.identify(args, kwargs), fn=fn)
            return cast("R", _drive(settler, beats, plan, signature, fn, args, kwargs))

        return wrapper


def _drive(
    settler: Settler,
    beats: _Heartbeats,
    plan: Plan,
    signature: Signature,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    span = telemetry().operation(settler.config.namespace, fn.__name__)
    with span:
        step = plan.start()
        while True:
            match step:
                case Reserve():
                    step = plan.reserved(
                        settler.reserve(
                            step.identity.operation_id,
                            principal=step.identity.principal,
                            fingerprint=step.identity.fingerprint,
                            lease=step.lease,
                            attempt_id=step.attempt_id,
                        )
                    )
                case Run():
                    call_args, call_kwargs = signature.inject(args, kwargs, step.attempt)
                    span.attempt(step.attempt)
                    ran = _run(beats, step, plan, span.capture(), fn, call_args, call_kwargs)
                    span.ran(ran)
                    step = plan.ran(step, ran)
                case Settle():
                    try:
                        settlement = _settle(settler, step)
                    except InvalidInput as exc:
                        step = plan.settle_failed(step, exc)
                    else:
                        step = plan.settled(step, settlement)
                case Read():
                    step = plan.read(settler.get(step.operation_id))
                case Sleep():
                    span.attempt_done()
                    time.sleep(step.seconds)
                    step = plan.slept()
                case Return():
                    return step.value
                case Raise():
                    if step.cause is None:
                        raise step.error
                    raise step.error from step.cause


def _settle(settler: Settler, step: Settle) -> Settlement:
    if step.action is Action.COMPLETE:
        return settler.complete(step.reservation, step.stored)
    if step.action is Action.FAIL:
        return settler.fail(step.reservation, cast("BaseException", step.error))
    return settler.mark_provisional(step.reservation, step.reason)


def _run(
    beats: _Heartbeats,
    run: Run,
    plan: Plan,
    context: AbstractContextManager[Any],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Ran:
    """Run ``fn`` in this thread while the heartbeat thread renews the lease every
    ``run.heartbeat`` seconds (in the attempt's telemetry ``context``). A lost lease is
    reported through ``run.attempt.lost``: a thread cannot be interrupted, so the function
    is told and must stop on its own."""
    attempt = run.attempt
    key = beats.add(run, plan.log, context)
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001  # every outcome is settled, then re-raised
        error: BaseException | None = exc
        value = None
    else:
        error = None
    finally:
        beats.remove(key)
    deadline = attempt.deadline
    timed_out = error is not None and deadline is not None and time.monotonic() >= deadline
    return Ran(value, error, timed_out, attempt._renewal if attempt.lost else None)


#: How long an idle heartbeat thread (the scheduler, a renewer) waits for work before it
#: ends (seconds).
_IDLE_LINGER = 2.0

_NO_CONTEXT = contextlib.nullcontext()


@dataclass(slots=True)  # not frozen: built on every call, and a frozen one costs more
class _Beating:
    """A running attempt, as the heartbeat threads renew it."""

    run: Run
    log: Any
    """The logger bound to its call (the decorator's plan's, the HTTP guard's): a failed
    renewal's event names the call as the call's own events do. None: an unnamed one."""
    context: AbstractContextManager[Any]
    """Made current around each renewal (the attempt's telemetry context)."""


class _Heartbeats:
    """Renews the lease of each running attempt of one decorated function (or one HTTP
    guard) every ``run.heartbeat`` seconds, from threads that end when none is running.

    One scheduler thread keeps the due times and hands each due renewal to a renewer
    thread; a renewer is started only when none is free, and lingers for the next. So no
    renewal waits for another: a renewal held up by a hung server (a frozen cluster primary
    holds it for the socket timeout, once per try) delays no other attempt's, whose lease
    would lapse under its running function and let a second worker run it again. An
    attempt has at most one renewal in flight; its next is due ``run.heartbeat`` after that
    one was sent. (A thread per call cost more than the call's two round trips: a call that
    ends before its first renewal starts no thread, and back-to-back calls share them.)"""

    def __init__(self, settler: Settler) -> None:
        self._settler = settler
        lock = threading.Lock()
        self._cond = threading.Condition(lock)
        """The scheduler waits on it (for a nearer due time)."""
        self._work = threading.Condition(lock)
        """Free renewers wait on it (for a renewal in ``_jobs``)."""
        self._due: dict[int, tuple[float, _Beating]] = {}
        self._flying: dict[int, _Beating] = {}
        """Attempts with a renewal handed to a renewer (not in ``_due`` until it returns)."""
        self._jobs: collections.deque[tuple[int, _Beating]] = collections.deque()
        self._free = 0
        """Renewers waiting for a job: each takes one from ``_jobs`` before it ends."""
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        #: When the scheduler's wait ends (-inf while it is not waiting: it reads ``_due``
        #: before it waits again). A new attempt due later needs no wake-up: waking the
        #: thread on every call cost a thread switch per call.
        self._wake_at = -math.inf

    def add(
        self,
        run: Run,
        log: Any = None,
        context: AbstractContextManager[Any] = _NO_CONTEXT,
    ) -> int:
        """Renew ``run``'s lease until :meth:`remove`; ``log`` (bound to the call) names it
        in a failed renewal's event, and each renewal runs in ``context`` (the telemetry
        context of the caller, captured in its thread)."""
        beating = _Beating(run, log, context)
        with self._cond:
            key = next(self._ids)
            self._schedule(key, beating, time.monotonic() + run.heartbeat)
            return key

    def remove(self, key: int) -> None:
        with self._cond:
            self._due.pop(key, None)
            self._flying.pop(key, None)

    def _schedule(self, key: int, beating: _Beating, due: float) -> None:
        """Put ``beating``'s next renewal at ``due`` (the lock held)."""
        self._due[key] = (due, beating)
        if self._thread is None:
            self._start()
        elif due < self._wake_at:
            self._cond.notify()

    def _start(self) -> None:
        """Start the scheduler thread (the lock held)."""
        self._wake_at = -math.inf
        thread = threading.Thread(target=self._loop, name="settle-heartbeat", daemon=True)
        thread.start()
        self._thread = thread

    def _loop(self) -> None:
        try:
            self._serve()
        finally:
            # A thread that died (an exception no beat catches) must not stay registered:
            # no lease of this function would be renewed again. Attempts still running get
            # a new thread now (their next renewals are not due before their heartbeat).
            with self._cond:
                if self._thread is threading.current_thread():
                    self._thread = None
                    if self._due or self._flying:
                        self._start()

    def _serve(self) -> None:
        idle_since: float | None = None
        with self._cond:
            while True:
                now = time.monotonic()
                nearest = min((due for due, _ in self._due.values()), default=None)
                if nearest is not None and nearest <= now:
                    idle_since = None
                    self._hand_out(now)
                    continue
                if nearest is None:
                    if self._flying:  # renewals still out: their attempts are running
                        idle_since = None
                        self._wait_until(now + _IDLE_LINGER, now)
                        continue
                    # Nothing running: linger a moment for the next call (back-to-back
                    # calls would otherwise start a thread each), then end, so an idle
                    # decorated function (or a closed settler) keeps no thread.
                    idle_since = now if idle_since is None else idle_since
                    if now - idle_since >= _IDLE_LINGER:
                        self._thread = None
                        return
                    self._wait_until(idle_since + _IDLE_LINGER, now)
                    continue
                idle_since = None
                self._wait_until(nearest, now)

    def _hand_out(self, now: float) -> None:
        """Give each due renewal to a free renewer, or a new one (the lock held)."""
        for key, (due, beating) in list(self._due.items()):
            if due > now:
                continue
            del self._due[key]
            self._flying[key] = beating
            self._jobs.append((key, beating))
            if len(self._jobs) > self._free:
                threading.Thread(target=self._renewer, name="settle-heartbeat", daemon=True).start()
            else:
                self._work.notify()

    def _wait_until(self, wake_at: float, now: float) -> None:
        """Wait (the lock held) until ``wake_at``, or until a nearer due is scheduled."""
        self._wake_at = wake_at
        try:
            self._cond.wait(wake_at - now)
        finally:
            self._wake_at = -math.inf

    def _renewer(self) -> None:
        """Carry out renewals from ``_jobs``, each outside the lock (so renewers run side
        by side); end after ``_IDLE_LINGER`` without one."""
        while (job := self._next_job()) is not None:
            key, beating = job
            sent = time.monotonic()
            alive = True
            try:
                alive = self._beat(beating)
            finally:
                with self._cond:
                    # Still running (not removed meanwhile) and not lost: renew again one
                    # heartbeat after this renewal was sent (at once if that has passed).
                    if self._flying.pop(key, None) is not None and alive:
                        self._schedule(key, beating, sent + beating.run.heartbeat)

    def _next_job(self) -> tuple[int, _Beating] | None:
        with self._cond:
            if not self._jobs:
                self._free += 1
                try:
                    self._work.wait(_IDLE_LINGER)
                finally:
                    self._free -= 1
            return self._jobs.popleft() if self._jobs else None

    def _beat(self, beating: _Beating) -> bool:
        """Renew one lease; False once it is lost (the attempt is told, renewals stop)."""
        run = beating.run
        attempt = run.attempt
        try:
            with beating.context:
                renewal = self._settler.renew(run.reservation, lease=run.lease)
        # Transient (BackendError, DurabilityError) or anything else: beat on. A heartbeat
        # that stopped would let the lease lapse under a running function, and a second
        # caller would run it again.
        except Exception as exc:  # noqa: BLE001
            log = beating.log
            if log is None:
                log = logger.bind(operation_digest=operation_digest(attempt.operation_id))
            log.warning(
                "settle.operation.heartbeat_failed",
                generation=attempt.generation,
                error=type(exc).__name__,
            )
            return True
        if not renewal.renewed:
            attempt.mark_lost(renewal)
            return False
        return True
