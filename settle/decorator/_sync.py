"""The sync driver: carries out the :class:`~settle.decorator._plan.Plan` with blocking
calls; the heartbeat renews the lease from a thread. No rule lives here."""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import itertools
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, cast

from settle._log import logger, operation_digest
from settle._telemetry import telemetry
from settle.decorator._options import Options
from settle.decorator._plan import (
    Plan,
    Raise,
    Ran,
    Read,
    Release,
    ReplayHook,
    Reserve,
    RetrySpec,
    Return,
    Run,
    Settle,
    Sleep,
    Step,
    TerminalSpec,
)
from settle.decorator._signature import (
    KeySpec,
    PrincipalSpec,
    RequestSpec,
    Signature,
    check_decorable,
)
from settle.errors import DurabilityError, InvalidInput, SettleError
from settle.models import Action, Settlement

if TYPE_CHECKING:
    from settle._sync.settler import Settler
    from settle.models import Renewal

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
        check_decorable(fn)
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
    span = telemetry().operation(settler.config.namespace, fn)
    with span:
        step = plan.start()
        while True:
            match step:
                # The last step first: a class pattern that fails costs about 450
                # instructions, and every call ends here (a replay's second step).
                case Return():
                    return step.value
                case Reserve():
                    try:
                        outcome = settler.reserve(
                            step.identity.operation_id,
                            principal=step.identity.principal,
                            fingerprint=step.identity.fingerprint,
                            lease=step.lease,
                            attempt_id=step.attempt_id,
                        )
                    except DurabilityError as exc:
                        step = plan.reserve_unconfirmed(step, exc)
                    else:
                        step = plan.reserved(outcome)
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
                    except SettleError as exc:  # unreachable, too few replicas
                        step = plan.settle_raised(step, exc)
                    else:
                        step = plan.settled(step, settlement)
                case Read():
                    step = _read(settler, plan, step)
                case Release():
                    # On the primary at least; the caller gets the reserve's error either way.
                    with contextlib.suppress(SettleError):
                        settler.mark_provisional(step.reservation, step.reason)
                    step = plan.released()
                case Sleep():
                    span.attempt_done()
                    time.sleep(step.seconds)
                    step = plan.slept()
                case Raise():
                    if step.cause is None:
                        raise step.error
                    raise step.error from step.cause


def _read(settler: Settler, plan: Plan, step: Read) -> Step:
    """A :class:`Read` step: the record, as the plan reads it; after a ``reserve`` that
    raised :class:`DurabilityError` (the read is only to release this call's reservation),
    that error, whatever the read answers."""
    try:
        record = settler.get(step.operation_id)
    except SettleError:
        if not plan.releasing:
            raise
        return plan.released()
    return plan.read(record)


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
    key = beats.add(run, plan, context)
    try:
        running = plan.enter_run(run.reservation.generation)
        try:
            value = fn(*args, **kwargs)
        finally:
            plan.leave_run(running)
    except BaseException as exc:  # noqa: BLE001  # every outcome is settled, then re-raised
        error: BaseException | None = exc
        value = None
    else:
        error = None
    finally:
        beats.remove(key)
    deadline = attempt.deadline
    timed_out = error is not None and deadline is not None and time.monotonic() >= deadline
    lost = attempt._renewal if attempt.lost else None
    return Ran(value, error, timed_out, lost, stopped=attempt.stopped_by(error))


#: How long an idle heartbeat thread (the scheduler, a renewer) waits for work before it
#: ends (seconds).
_IDLE_LINGER = 2.0

#: How long a renewal being sent has taken when its renewer counts as held (by a hung
#: server), and how long a queued renewal waits while every renewer is held before the
#: scheduler starts another (seconds). On a healthy server a renewal takes well under a
#: millisecond, so a burst of calls shares one renewer; a renewal held by a hung server
#: holds up another by this for each held renewal queued before it (and by no more than
#: ``_SLOW_QUEUE`` of its heartbeat).
_SPARE_AFTER = 0.05

#: The share of its heartbeat a queued renewal may wait, or be expected to wait for the
#: renewers that are not held at the pace they have been sending renewals (a loaded
#: machine, a slow server), before the scheduler starts another: half leaves half the
#: lease before it would lapse.
_SLOW_QUEUE = 0.5

#: The weight of the latest renewal's time in the renewers' pace (a moving average).
_PACE_WEIGHT = 0.2

#: The most renewer threads one decorated function (or HTTP guard) runs at once. At the
#: cap, due renewals queue for the next free renewer: renewals held by hung servers (up to
#: this many) then hold up the others.
MAX_RENEWERS = 32

#: After a thread cannot be started (no memory, a pids limit), how long before a renewal
#: is handed out again (seconds): well inside the lease's remaining two thirds.
_START_RETRY = 0.05

_NO_CONTEXT = contextlib.nullcontext()

#: Every heartbeat of this process: a forked child resets them (see ``_after_fork``).
_ALL_HEARTBEATS: weakref.WeakSet[_Heartbeats] = weakref.WeakSet()


class _Logs(Protocol):
    """What names a call in its events: the decorator's plan, the HTTP guard."""

    @property
    def log(self) -> Any:
        """The logger bound to the call (bound on first use)."""


@dataclass(slots=True)  # not frozen: built on every call, and a frozen one costs more
class _Beating:
    """A running attempt, as the heartbeat threads renew it."""

    run: Run
    owner: _Logs | None
    """Its call's plan (or HTTP guard), whose ``log`` names the call in a failed renewal's
    event as the call's own events do; read only then: binding it (an HMAC of the
    operation id) on every call cost more than a call that logs nothing needs. None: an
    unnamed one."""
    context: AbstractContextManager[Any]
    """Made current around each renewal (the attempt's telemetry context)."""
    runs_on: Callable[[Renewal], bool] | None = None
    """Asked of a renewal that did not renew (and did not only lapse): True when the
    attempt is not lost all the same and its function runs on unmarked (the HTTP guard's
    ``Guard.record_gone``: the record is gone, nobody else owns the key). None: lost."""

    def warn(self, error: BaseException) -> None:
        """Log ``settle.operation.heartbeat_failed`` for this attempt (``error``'s class).
        A log line that cannot be written (an application's processor that raises, a closed
        stream) is dropped: it must not end the renewer thread that logs it, least of all
        in an outage, when every renewal fails and is logged."""
        self._warn("settle.operation.heartbeat_failed", error=type(error).__name__)

    def lapsed(self, renewal: Renewal) -> None:
        """Log ``settle.operation.lease_lapsed`` for this attempt (dropped as :meth:`warn`'s
        line is when it cannot be written)."""
        self._warn("settle.operation.lease_lapsed", reason=renewal.reason)

    def _warn(self, event: str, **fields: Any) -> None:
        attempt = self.run.attempt
        owner = self.owner
        with contextlib.suppress(Exception):
            if owner is None:
                log = logger.bind(operation_digest=operation_digest(attempt.operation_id))
            else:
                log = owner.log
            log.warning(event, generation=attempt.generation, **fields)


class _Heartbeats:
    """Renews the lease of each running attempt of one decorated function (or one HTTP
    guard) every ``run.heartbeat`` seconds, from threads that end when none is running.

    One scheduler thread keeps the due times and queues each due renewal for the renewer
    threads. It starts the first renewer at once, and another (up to ``MAX_RENEWERS``, one
    at a time: none while a renewer started is not yet at the queue) only when

    - a queued renewal has waited ``_SPARE_AFTER`` and every renewer is held (in a renewal
      sent ``_SPARE_AFTER`` ago or more): a renewer started for it is not held before
      ``_SPARE_AFTER``, so a stalled server gets one more per ``_SPARE_AFTER``;
    - at the pace the renewers have been sending renewals, the ones not held would leave
      the newest queued renewal waiting more than ``_SLOW_QUEUE`` of its heartbeat; or
    - a queued renewal has waited ``_SLOW_QUEUE`` of its heartbeat, whatever the renewers
      do: its lease's margin is being spent.

    A renewer lingers ``_IDLE_LINGER`` for the next. So a burst of calls shares one
    renewer on a healthy server and a few on a loaded machine or through a stall of the
    server (where a spare for every renewal that waited ``_SPARE_AFTER`` started a thread
    per queued renewal, up to the cap, for a stall of a tenth of a second); and a renewal
    held up by a hung server (a frozen cluster primary holds it for the socket timeout,
    once per try) holds up another attempt's by ``_SPARE_AFTER`` for each held renewal
    queued before it, and by no more than ``_SLOW_QUEUE`` of its heartbeat (and a thread
    start): that lease would lapse under its running function and let a second worker run
    it again.
    An attempt has at most one renewal in flight; its next is due ``run.heartbeat`` after
    that one was sent. (A thread per call cost more than the call's two round trips: a
    call that ends before its first renewal starts no renewer, and back-to-back calls
    share the threads.)

    A thread that cannot be started (no memory, a pids limit) is logged and costs no
    attempt its renewals: the renewals it was for are due again ``_START_RETRY`` later."""

    def __init__(self, settler: Settler) -> None:
        self._settler = settler
        self._ids = itertools.count()
        self._reset()
        _ALL_HEARTBEATS.add(self)

    def _reset(self) -> None:
        """Start empty: no thread, no attempt (also in a forked child: ``_after_fork``)."""
        lock = self._lock = threading.Lock()
        """What both conditions wait with: the per-call :meth:`add` and :meth:`remove` take it
        directly (a ``Condition``'s ``with`` only takes its lock, through two Python calls)."""
        self._cond = threading.Condition(lock)
        """The scheduler waits on it (for a nearer due time)."""
        self._work = threading.Condition(lock)
        """Idle renewers wait on it (for a renewal in ``_jobs``)."""
        self._due: dict[int, tuple[float, _Beating]] = {}
        self._flying: dict[int, _Beating] = {}
        """Attempts with a renewal queued or being sent (not in ``_due`` until it returns)."""
        self._jobs: collections.deque[tuple[int, _Beating, float]] = collections.deque()
        """Queued renewals: the key, its attempt, when it was queued."""
        self._renewers = 0
        """Renewer threads started and not ended."""
        self._starting = 0
        """Renewer threads started that have not taken a renewal yet."""
        self._sending: dict[int, float] = {}
        """Renewals being sent: the key, when it was taken from the queue."""
        self._pace = 0.0
        """A moving average of the time a renewal not held takes (0: none sent yet)."""
        self._thread: threading.Thread | None = None
        #: When the scheduler's wait ends (-inf while it is not waiting: it reads ``_due``
        #: before it waits again). A new attempt due later needs no wake-up: waking the
        #: thread on every call cost a thread switch per call.
        self._wake_at = -math.inf

    def add(
        self,
        run: Run,
        owner: _Logs | None = None,
        context: AbstractContextManager[Any] = _NO_CONTEXT,
        runs_on: Callable[[Renewal], bool] | None = None,
    ) -> int:
        """Renew ``run``'s lease until :meth:`remove`; ``owner.log`` (bound to the call)
        names it in a failed renewal's event, and each renewal runs in ``context`` (the telemetry
        context of the caller, captured in its thread). ``runs_on`` (see
        :attr:`_Beating.runs_on`) may keep an attempt a renewal did not renew. Raises when the
        scheduler thread cannot be started, and then keeps nothing of ``run``."""
        beating = _Beating(run, owner, context, runs_on)
        with self._lock:
            key = next(self._ids)
            try:
                self._schedule(key, beating, time.monotonic() + run.first)
            except BaseException:
                # The caller will not run (nor call remove): renewing its lease later would
                # keep an abandoned operation in progress for the life of the process.
                del self._due[key]
                raise
            return key

    def remove(self, key: int) -> None:
        with self._lock:
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
        """Start the scheduler thread (the lock held: it is started once per busy spell)."""
        self._wake_at = -math.inf
        thread = threading.Thread(target=self._loop, name="settle-heartbeat", daemon=True)
        thread.start()
        self._thread = thread

    def _loop(self) -> None:
        try:
            while True:
                try:
                    self._serve()
                except Exception as exc:  # noqa: BLE001  # no beat's error: serve on
                    # A scheduler that died would renew no lease of this function again,
                    # and a new thread may not start (no memory, a pids limit): this one
                    # serves on, a moment later.
                    logger.warning("settle.operation.heartbeat_failed", error=type(exc).__name__)
                    time.sleep(_START_RETRY)
                else:
                    return
        finally:
            # A thread that ended otherwise must not stay registered: no lease of this
            # function would be renewed again. Attempts still running get a new thread now
            # (their next renewals are not due before their heartbeat); one that cannot be
            # started is started by the next call or returning renewal.
            with self._cond:
                if self._thread is threading.current_thread():
                    self._thread = None
                    if self._due or self._flying:
                        try:
                            self._start()
                        except Exception as exc:  # noqa: BLE001
                            logger.warning(
                                "settle.operation.heartbeat_failed", error=type(exc).__name__
                            )

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
                spare_at = self._spare_at(now)
                if spare_at is not None and spare_at <= now:
                    idle_since = None
                    self._add_renewer()
                    continue
                if nearest is None:
                    if self._flying:  # renewals still out: their attempts are running
                        idle_since = None
                        wake_at = now + _IDLE_LINGER if spare_at is None else spare_at
                        self._wait_until(wake_at, now)
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
                self._wait_until(nearest if spare_at is None else min(nearest, spare_at), now)

    def _hand_out(self, now: float) -> None:
        """Queue each due renewal for the renewers (the lock held)."""
        for key, (due, beating) in list(self._due.items()):
            if due > now:
                continue
            del self._due[key]
            self._flying[key] = beating
            self._jobs.append((key, beating, now))
            self._work.notify()

    def _spare_at(self, now: float) -> float | None:
        """When to start another renewer for the queued renewals (the lock held): at once
        (-inf) when there is none, or when the class's rules call for one; else when to look
        again (when the oldest will have waited ``_SPARE_AFTER`` or a renewal being sent
        will count as held). None when none is needed: no renewal queued, a renewer
        started and on its way to the queue, the cap reached."""
        jobs = self._jobs
        while jobs and jobs[0][0] not in self._flying:  # its call ended: not sent
            jobs.popleft()
        if not jobs or self._starting or self._renewers >= MAX_RENEWERS:
            return None
        if self._renewers == 0:
            return -math.inf
        _, oldest, queued = jobs[0]
        late = queued + _SLOW_QUEUE * oldest.run.heartbeat
        if now >= late:  # its lease's margin is being spent: whatever the renewers do
            return -math.inf
        held = sum(1 for sent in self._sending.values() if now - sent >= _SPARE_AFTER)
        free = self._renewers - held
        if free <= 0:
            if now - queued >= _SPARE_AFTER:
                return -math.inf
        elif self._pace:
            _, newest, last = jobs[-1]
            expected = now - last + len(jobs) * self._pace / free
            if expected > _SLOW_QUEUE * newest.run.heartbeat:
                return -math.inf
        looks = (t + _SPARE_AFTER for t in (queued, *self._sending.values()))
        return min((t for t in looks if t > now), default=min(late, now + _SPARE_AFTER))

    def _add_renewer(self) -> None:
        """Start a renewer thread, the lock released meanwhile (the lock held). When it
        cannot be started, the queued renewals go back to ``_due``, ``_START_RETRY`` later:
        they are not lost, and the scheduler lives on."""
        # Made before it is counted: a thread that cannot even be made (MemoryError) counted
        # as on its way to the queue would hold every later spare back for good.
        thread = threading.Thread(target=self._renewer, name="settle-heartbeat", daemon=True)
        self._renewers += 1
        self._starting += 1
        self._cond.release()
        try:
            thread.start()
        except Exception as exc:  # noqa: BLE001  # RuntimeError: can't start new thread
            error: Exception | None = exc
        else:
            error = None
        finally:
            self._cond.acquire()
        if error is None:
            return
        self._renewers -= 1
        self._starting -= 1
        retry = time.monotonic() + _START_RETRY
        while self._jobs:
            key, beating, _ = self._jobs.popleft()
            if self._flying.pop(key, None) is not None:
                self._due[key] = (retry, beating)
                beating.warn(error)

    def _wait_until(self, wake_at: float, now: float) -> None:
        """Wait (the lock held) until ``wake_at``, or until a nearer due is scheduled."""
        self._wake_at = wake_at
        try:
            self._cond.wait(wake_at - now)
        finally:
            self._wake_at = -math.inf

    def _renewer(self) -> None:
        """Carry out renewals from ``_jobs``, each outside the lock (so renewers run side
        by side); end after ``_IDLE_LINGER`` without one. A renewer that ends any other way
        (an error it did not expect) is counted out too, and the scheduler told: else the
        count would keep counting it, and at the cap no renewer would start again."""
        starting = [True]  # until it takes its first renewal (or ends)
        try:
            self._serve_jobs(starting)
        except BaseException:
            with self._cond:
                self._renewers -= 1
                if starting[0]:
                    self._starting -= 1
                self._cond.notify()
            raise

    def _serve_jobs(self, starting: list[bool]) -> None:
        while (job := self._next_job(starting)) is not None:
            key, beating, sent = job
            renewal = None
            try:
                renewal = self._beat(beating)
            finally:
                with self._cond:
                    took = time.monotonic() - self._sending.pop(key, sent)
                    if took < _SPARE_AFTER:  # a held one is no pace: the held rule counts it
                        pace = self._pace
                        self._pace = took if not pace else pace + _PACE_WEIGHT * (took - pace)
                    # Only while the call runs (not removed meanwhile): a renewal that
                    # comes back after the call settled finds it not pending, and must not
                    # mark the finished attempt lost. Renew again one heartbeat after this
                    # renewal was sent (at once if that has passed), unless it is lost.
                    if self._flying.pop(key, None) is not None:
                        if renewal is not None:
                            beating.run.attempt.mark_lost(renewal)
                        else:
                            self._reschedule(key, beating, sent + beating.run.heartbeat)

    def _reschedule(self, key: int, beating: _Beating, due: float) -> None:
        """:meth:`_schedule` from a renewer (the lock held): a scheduler that cannot be
        started now is started by the next call (the renewer lives on)."""
        try:
            self._schedule(key, beating, due)
        except Exception as exc:  # noqa: BLE001
            beating.warn(exc)

    def _next_job(self, starting: list[bool]) -> tuple[int, _Beating, float] | None:
        """The next queued renewal and when it was taken (counted as being sent), or None
        after ``_IDLE_LINGER`` without one (the renewer is counted out). A renewer's first
        renewal tells the scheduler, which starts no spare while one is on its way to the
        queue, when more are queued."""
        with self._cond:
            deadline = time.monotonic() + _IDLE_LINGER
            while True:
                while self._jobs:
                    key, beating, _ = self._jobs.popleft()
                    if key in self._flying:  # else its call ended: nothing to renew
                        if starting[0]:
                            self._arrived(starting)
                            if self._jobs:
                                self._cond.notify()
                        taken = self._sending[key] = time.monotonic()
                        return key, beating, taken
                left = deadline - time.monotonic()
                if left <= 0:
                    self._renewers -= 1
                    if starting[0]:
                        self._arrived(starting)
                    return None
                self._work.wait(left)

    def _arrived(self, starting: list[bool]) -> None:
        """Count a started renewer as no longer on its way to the queue (the lock held)."""
        starting[0] = False
        self._starting -= 1

    def _beat(self, beating: _Beating) -> Renewal | None:
        """Renew one lease: the reply that finds it lost, or None when the attempt runs on
        and the next renewal follows: renewed; only lapsed (logged: nobody took the key over,
        so its function is not told to stop, and a later renewal that finds a takeover
        does); kept by ``beating.runs_on``; or failed (logged: a heartbeat that stopped
        would let the lease lapse under a running function, and a second caller would run
        it again)."""
        run = beating.run
        try:
            with beating.context:
                renewal = self._settler.renew(run.reservation, lease=run.lease)
        # Transient (BackendError, DurabilityError) or anything else: beat on.
        except Exception as exc:  # noqa: BLE001
            beating.warn(exc)
            return None
        if renewal.renewed:
            return None
        if renewal.lapsed(run.attempt.generation):
            beating.lapsed(renewal)
            return None
        if beating.runs_on is not None and beating.runs_on(renewal):
            return None
        return renewal


def _after_fork() -> None:
    """In a forked child: none of the parent's threads exist, nor do the calls they ran.
    Each heartbeat starts empty (new locks, no thread). The parent's attempts are dropped,
    not renewed: the parent renews its own, and a child renewing them would keep an
    attempt owned that no thread of its runs (for ever, should the parent die)."""
    for beats in list(_ALL_HEARTBEATS):
        beats._reset()


os.register_at_fork(after_in_child=_after_fork)
