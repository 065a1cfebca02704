"""The sync driver: carries out the :class:`~settle.decorator._plan.Plan` with blocking
calls; the heartbeat renews the lease from a thread. No rule lives here."""

from __future__ import annotations

import functools
import inspect
import itertools
import math
import sys
import threading
import time
from collections.abc import Callable
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
from settle.errors import InvalidInput, SettleError
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
                    ran = _run(beats, step, fn, call_args, call_kwargs)
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
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Ran:
    """Run ``fn`` in this thread while the heartbeat thread renews the lease every
    ``run.heartbeat`` seconds. A lost lease is reported through ``run.attempt.lost``: a
    thread cannot be interrupted, so the function is told and must stop on its own."""
    attempt = run.attempt
    beating = beats.add(run)
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001  # every outcome is settled, then re-raised
        error: BaseException | None = exc
        value = None
    else:
        error = None
    finally:
        beats.remove(beating)
    deadline = attempt.deadline
    timed_out = error is not None and deadline is not None and time.monotonic() >= deadline
    return Ran(value, error, timed_out, attempt._renewal if attempt.lost else None)


#: How long an idle heartbeat thread waits for the next call before it ends (seconds).
_IDLE_LINGER = 2.0


class _Heartbeats:
    """One daemon thread per decorated function renews the lease of each of its running
    attempts every ``run.heartbeat`` seconds, and ends when none is running. (A thread
    started and joined around every call cost more than the call's two round trips.)"""

    def __init__(self, settler: Settler) -> None:
        self._settler = settler
        self._cond = threading.Condition()
        self._due: dict[int, tuple[float, Run]] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        #: When the thread's wait ends (-inf while it is not waiting: it reads ``_due``
        #: before it waits again). A new attempt due later needs no wake-up: waking the
        #: thread on every call cost a thread switch per call.
        self._wake_at = -math.inf

    def add(self, run: Run) -> int:
        with self._cond:
            key = next(self._ids)
            due = time.monotonic() + run.heartbeat
            self._due[key] = (due, run)
            if self._thread is None:
                self._wake_at = -math.inf
                self._thread = threading.Thread(
                    target=self._loop, name="settle-heartbeat", daemon=True
                )
                self._thread.start()
            elif due < self._wake_at:
                self._cond.notify()
            return key

    def remove(self, key: int) -> None:
        with self._cond:
            self._due.pop(key, None)

    def _loop(self) -> None:
        idle_since: float | None = None
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    nearest = min((due for due, _ in self._due.values()), default=None)
                    if nearest is not None and nearest <= now:
                        break
                    if nearest is None:
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
                ready = [(k, run) for k, (due, run) in self._due.items() if due <= now]
                for k, run in ready:
                    self._due[k] = (now + run.heartbeat, run)
            for k, run in ready:
                if not self._beat(run):
                    self.remove(k)

    def _wait_until(self, wake_at: float, now: float) -> None:
        """Wait (the lock held) until ``wake_at``, or until ``add`` brings a nearer due."""
        self._wake_at = wake_at
        try:
            self._cond.wait(wake_at - now)
        finally:
            self._wake_at = -math.inf

    def _beat(self, run: Run) -> bool:
        """Renew one lease; False once it is lost (the attempt is told, renewals stop)."""
        attempt = run.attempt
        try:
            renewal = self._settler.renew(run.reservation, lease=run.lease)
        except SettleError as exc:  # transient (BackendError, DurabilityError): beat on
            logger.warning(
                "settle.operation.heartbeat_failed",
                operation_digest=operation_digest(attempt.operation_id),
                generation=attempt.generation,
                error=type(exc).__name__,
            )
            return True
        if not renewal.renewed:
            attempt.mark_lost(renewal)
            return False
        return True
