"""The decorator's rules, with no I/O, in tenacity's shape: :class:`Plan` hands out one
instruction at a time and the sync and async drivers carry it out and feed back what
happened. Every decision (replay, wait, retry, settle, give up) lives here, once.

    step = plan.start()
    while True:
        match step:
            case Reserve():  step = plan.reserved(settler.reserve(...))
            case Run():      step = plan.ran(<run the function under a heartbeat>)
            case Settle():   step = plan.settled(settler.complete / fail / mark_provisional)
            case Read():     step = plan.read(settler.get(...))
            case Sleep():    sleep; step = plan.slept()
            case Return():   return step.value
            case Raise():    raise step.error from step.cause
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import sys
import time
import types
import typing
from collections.abc import Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass
from logging import INFO
from typing import Any

import tenacity
from pydantic import ValidationError

from settle._core import heartbeat
from settle._core.codec import AsJson, encode_result, repeated_key
from settle._core.engine import MAX_LEASE
from settle._jitter import OwnRandomWait, draw
from settle._log import enabled as log_enabled
from settle._log import logger, operation_digest
from settle._slots import slot_init
from settle.attempt import Attempt
from settle.decorator._signature import CallIdentity
from settle.errors import (
    DurabilityError,
    InvalidInput,
    OperationFailed,
    OperationInProgress,
    SettleError,
    StaleAttempt,
)
from settle.models import (
    Action,
    InProgress,
    OperationRecord,
    Renewal,
    Replay,
    Reservation,
    Reserved,
    Settlement,
    State,
    StoredFailure,
    Verdict,
    _replayed,
    _where_it_fails,
)

__all__ = [
    "DEFAULT_RETRY",
    "Plan",
    "Policy",
    "Raise",
    "Ran",
    "Read",
    "ReplayHook",
    "Reserve",
    "RetrySpec",
    "Return",
    "Run",
    "Settle",
    "Sleep",
    "Step",
    "TerminalSpec",
]

#: Three attempts, exponential backoff with jitter, for any ``Exception`` that is not
#: terminal. Pass your own ``tenacity.Retrying(...)`` as ``retry=`` to change it.
DEFAULT_RETRY = tenacity.Retrying(
    stop=tenacity.stop_after_attempt(3),
    wait=tenacity.wait_exponential(multiplier=0.1, max=2.0) + OwnRandomWait(0, 0.1),
    retry=tenacity.retry_if_exception_type(Exception),
)

RetrySpec = tenacity.BaseRetrying
ReplayHook = Callable[[OperationRecord], object]
"""Called with the stored record when a call's outcome is replayed, not computed."""
TerminalSpec = tuple[type[BaseException], ...] | type[BaseException]

_BYTES_LIKE = (bytes, bytearray, memoryview)

_POLL_FIRST = 0.02
_POLL_MAX = 0.5


@dataclass(slots=True)
class _Held:
    """An attempt (namespace, operation id, generation) running in this context; ``refused``
    once a call made inside it was refused (:class:`Reentered`), however its function then
    reports that (the refusal itself, wrapped in its own error, in a ``TaskGroup``'s
    group): every retry of it would meet the refusal again."""

    key: tuple[str, str, int]
    refused: bool = False


#: The attempts running in this context, outermost first: the thread that runs one, or its
#: asyncio task and the tasks (and ``to_thread`` calls) it starts, which copy the context.
#: A call there that finds one of them holding the lease is a call of the operation inside
#: its own attempt, which could only wait for itself.
_RUNNING: ContextVar[tuple[_Held, ...]] = ContextVar("settle_running_operations", default=())


class Reentered(InvalidInput):
    """An operation was called inside its own attempt (recursion, or a task the attempt
    awaits) while that attempt holds the lease: refused, with nothing written. The attempt
    that made the call is marked provisional and raises it without a retry, which would
    only meet it again."""


# -- instructions --------------------------------------------------------------------------


@slot_init
@dataclass(frozen=True, slots=True)
class Reserve:
    identity: CallIdentity
    lease: float | None
    attempt_id: str


@slot_init
@dataclass(frozen=True, slots=True)
class Run:
    """Run the function with ``attempt`` while a heartbeat renews ``reservation`` every
    ``heartbeat`` seconds, the first renewal ``first`` seconds from now
    (:func:`settle._core.heartbeat.first_renewal`)."""

    reservation: Reservation
    attempt: Attempt
    timeout: float | None
    lease: float
    heartbeat: float
    first: float


@slot_init
@dataclass(frozen=True, slots=True)
class Settle:
    action: Action
    reservation: Reservation
    result: Any = None
    """What the caller gets back (a completion's)."""
    stored: Any = None
    """What a completion stores (``result``, or the form it is stored in)."""
    error: BaseException | None = None
    reason: str = ""


@slot_init
@dataclass(frozen=True, slots=True)
class Read:
    """Read the authoritative record (for the :class:`StaleAttempt` the caller gets)."""

    operation_id: str


@slot_init
@dataclass(frozen=True, slots=True)
class Release:
    """Mark provisional ``reservation``, this call's own, whose ``reserve`` raised
    :class:`DurabilityError`: the function did not run, and the primary must not tell the
    next call that it is running until the lease ends. Whatever the settlement answers,
    :meth:`Plan.released` says what the caller gets."""

    reservation: Reservation
    reason: str


@slot_init
@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@slot_init
@dataclass(frozen=True, slots=True)
class Return:
    value: Any


@slot_init
@dataclass(frozen=True, slots=True)
class Raise:
    error: BaseException
    cause: BaseException | None = None


Step = Reserve | Run | Settle | Read | Release | Sleep | Return | Raise


@slot_init
@dataclass(frozen=True, slots=True)
class Ran:
    """What running the function gave: a value, or an error; whether the ``timeout``
    fired; and the heartbeat's renewal if it found the lease lost."""

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False
    lost: Renewal | None = None
    interrupted: BaseException | None = None
    """A cancellation of the caller that arrived after the function had finished: the
    outcome is settled first, then the cancellation is raised."""
    stopped: bool = False
    """settle stopped the function (its ``timeout``, a lost lease: the async timeout scope,
    or :meth:`Attempt.check`): its error says so and is no definite answer, so it is never
    stored as a failure, even when ``terminal`` lists its class (``TimeoutError`` is an
    ``OSError``, an ``Exception``). Its effect may have happened: SPEC 6 makes it
    provisional."""


# -- policy ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """The decorator's options, validated once at decoration time."""

    namespace: str
    lease: float
    timeout: float | None
    retry: tenacity.BaseRetrying
    terminal: tuple[type[BaseException], ...]
    wait: float
    result_type: Callable[[], Any]
    """Resolves the type replayed results are validated into (lazily: forward refs)."""
    on_replay: ReplayHook | None = None

    @staticmethod
    def check(
        *,
        namespace: str,
        lease: float,
        timeout: float | None,
        retry: tenacity.BaseRetrying | None,
        terminal: tuple[type[BaseException], ...] | type[BaseException],
        wait: float,
        result_type: Callable[[], Any],
        on_replay: ReplayHook | None = None,
    ) -> Policy:
        if isinstance(terminal, type):
            terminal = (terminal,)
        try:  # once: a generator checked by all() was empty by the time it was kept
            terminal = tuple(terminal)
        except TypeError:
            raise InvalidInput("terminal must be exception types") from None
        if not all(isinstance(t, type) and issubclass(t, BaseException) for t in terminal):
            raise InvalidInput("terminal must be exception types")
        if retry is None:
            retry = DEFAULT_RETRY
        if not isinstance(retry, tenacity.BaseRetrying):
            raise InvalidInput(
                "retry must be a tenacity.Retrying(stop=..., wait=..., retry=...) policy"
            )
        if on_replay is not None and not callable(on_replay):
            raise InvalidInput("on_replay must be a callable taking the replayed record")
        if inspect.iscoroutinefunction(on_replay) or inspect.iscoroutinefunction(
            getattr(on_replay, "__call__", None)  # noqa: B004  # an object's async __call__
        ):
            raise InvalidInput(
                "on_replay must be a plain callable: it is called, never awaited, so an "
                "async def would never run; make it a def (schedule any async work from it)"
            )
        return Policy(
            namespace,
            _seconds("lease", lease, zero=False, most=MAX_LEASE),
            None if timeout is None else _seconds("timeout", timeout, zero=False),
            retry,
            tuple(terminal),
            _seconds("wait", wait, zero=True),
            result_type,
            on_replay,
        )


def _seconds(name: str, value: object, *, zero: bool, most: float = math.inf) -> float:
    """``value`` as a finite number of seconds more than 0 (at least 0 with ``zero``) and at
    most ``most``. NaN is refused: it passes no comparison, so a check made of ``value < 0``
    lets it through (a NaN ``wait`` never gives up, a NaN ``timeout`` never fires)."""
    seconds = math.nan
    if not isinstance(value, bool) and isinstance(value, int | float):
        with contextlib.suppress(OverflowError):  # an int too large for a float
            seconds = float(value)
    if not (math.isfinite(seconds) and 0 <= seconds <= most) or (seconds == 0 and not zero):
        least = "at least" if zero else "more than"
        most_ = "" if most == math.inf else f" and at most {most:g}"
        raise InvalidInput(
            f"{name} must be a finite number of seconds {least} 0{most_}, got {value!r}"
        )
    return seconds


# -- the plan ----------------------------------------------------------------------------


class Plan:
    """The decisions of one decorated call, from the first reserve to its final answer."""

    def __init__(
        self,
        policy: Policy,
        identity: CallIdentity,
        *,
        fn: Callable[..., Any],
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = draw,
    ) -> None:
        self.policy = policy
        self.identity = identity
        self._clock = clock
        self._rng = rng
        # The retry policy's state is made at the first retry decision, which most calls
        # never reach; its delays count from the call's start all the same.
        self._started = time.monotonic()
        self._retry_state: tenacity.RetryCallState | None = None
        self._fn = fn
        self._waiting_since: float | None = None
        self._polls = 0
        self._reserving = 0.0  # when the last Reserve was made (sent): on _clock
        self._ran: Ran | None = None
        self._stale: Settlement | None = None
        self._after_provisional: BaseException | None = None
        self._mismatch: tuple[InvalidInput, ValidationError] | None = None
        # A result of one arm of a declared union that reads back as another: the classes.
        self._ambiguous: tuple[type, type] | None = None
        # The attempt running (or last run) in this call's context.
        self._held: _Held | None = None
        # A reserve that raised DurabilityError: its attempt id and the error.
        self._unconfirmed: tuple[str, DurabilityError] | None = None
        self._bound: Any = None

    @property
    def log(self) -> Any:
        """The call's logger, bound on first use: most calls log nothing (a first call
        logs nothing, a replay one event that is usually filtered out)."""
        if self._bound is None:
            self._bound = logger.bind(
                namespace=self.policy.namespace,
                operation_digest=operation_digest(self.identity.operation_id),
                function=self._fn.__name__,
            )
        return self._bound

    def start(self) -> Step:
        return self._reserve()

    def enter_run(self, generation: int) -> Token[tuple[_Held, ...]]:
        """Before the function's run under ``generation`` (the driver calls
        :meth:`leave_run` with what this returns in a ``finally`` after it): a call of this
        operation inside it that finds this attempt holding the lease is refused
        (:meth:`_in_progress`) instead of waiting for the attempt that made it. Two calls,
        not a ``contextlib.contextmanager``, whose generator and wrapper cost about 5,000
        instructions per first call (the nineteenth round, docs/benchmarks.md)."""
        held = self._held = _Held((self.policy.namespace, self.identity.operation_id, generation))
        return _RUNNING.set((*_RUNNING.get(), held))

    @staticmethod
    def leave_run(token: Token[tuple[_Held, ...]]) -> None:
        """After the function's run (see :meth:`enter_run`)."""
        _RUNNING.reset(token)

    def _reserve(self) -> Reserve:
        self._reserving = self._clock()  # the shell sends it next
        return Reserve(self.identity, self.policy.lease, _uuid4_hex())

    # -- reserve -------------------------------------------------------------------------

    def reserved(self, outcome: Reserved | Replay | InProgress) -> Step:
        if isinstance(outcome, Replay):
            return self._replay(outcome.record)
        if isinstance(outcome, InProgress):
            return self._in_progress(outcome)
        self._waiting_since = None
        self._polls = 0
        r = outcome.reservation
        timeout = self.policy.timeout
        deadline = None if timeout is None else self._clock() + timeout
        attempt = Attempt.for_reservation(outcome, self.policy.namespace, deadline)
        lease = self.policy.lease
        first = heartbeat.first_renewal(lease, self._reserving, self._clock())
        return Run(r, attempt, timeout, lease, heartbeat=heartbeat.interval(lease), first=first)

    def reserve_unconfirmed(self, step: Reserve, error: DurabilityError) -> Step:
        """``reserve`` raised :class:`DurabilityError`: no replica is known to hold what it
        wrote or read, so the function does not run. A reservation it wrote (a new key, a
        takeover) would hold the key for the whole lease while nothing runs, and every
        call until then would be told ``OperationInProgress``: read the record to find
        it, then release it (:meth:`read`)."""
        self._unconfirmed = (step.attempt_id, error)
        return Read(step.identity.operation_id)

    @property
    def releasing(self) -> bool:
        """Whether this call's ``reserve`` raised :class:`DurabilityError` (its record is
        read, and its reservation released, only to raise that error after)."""
        return self._unconfirmed is not None

    def released(self) -> Step:
        """The reserve's :class:`DurabilityError`, whatever the release (the read of the
        record included) answered."""
        assert self._unconfirmed is not None
        return Raise(self._unconfirmed[1])

    def _release(self, record: OperationRecord | None, attempt_id: str) -> Step:
        assert self._unconfirmed is not None
        reservation = own_reservation(record, attempt_id)
        if reservation is None:
            return Raise(self._unconfirmed[1])
        self.log.warning("settle.operation.reserve_unconfirmed", generation=reservation.generation)
        return Release(reservation, UNCONFIRMED)

    def _declared(self) -> Any:
        """The declared result type, or None when it cannot be resolved (the function has
        run: its result is stored, and a replay says what is wrong with the type)."""
        try:
            return self.policy.result_type()
        except InvalidInput:
            return None

    def _replay(self, record: OperationRecord) -> Step:
        """The stored outcome (``on_replay`` is told first): a result, or the failure."""
        if log_enabled(INFO):
            self.log.info("settle.operation.replayed", state=record.state.value)
        if self.policy.on_replay is not None:
            self.policy.on_replay(record)
        failure = record.failure
        if failure is not None:
            return Raise(_failed(record.operation_id, failure))
        result_type = self.policy.result_type()
        if record.result is None:  # not for a completed record: value() says what it is
            return Return(record.value(result_type))
        try:
            return Return(_replayed(result_type, record.result))
        except ValidationError as exc:
            return Raise(_mismatch(record.operation_id, result_type, exc), exc)

    def _in_progress(self, outcome: InProgress) -> Step:
        operation_id = outcome.operation_id
        running = _RUNNING.get()
        key = (self.policy.namespace, operation_id, outcome.generation)
        if any(held.key == key for held in running):
            for held in running:  # the attempt called and every one it runs inside
                held.refused = True
            self.log.warning("settle.operation.reentered", generation=outcome.generation)
            return Raise(
                Reentered(
                    f"operation {operation_id!r} was called inside its own attempt "
                    f"{outcome.generation} (recursion, or a task the attempt awaits): it "
                    "would wait for itself. Call it once, or give the inner call an "
                    "operation id of its own",
                    operation_id=operation_id,
                )
            )
        now = self._clock()
        if self._waiting_since is None:
            self._waiting_since = now
        waited = now - self._waiting_since
        if waited >= self.policy.wait:
            self.log.info(
                "settle.operation.in_progress", generation=outcome.generation, waited=waited
            )
            return Raise(
                OperationInProgress(
                    f"operation {outcome.operation_id!r} is being run by attempt "
                    f"{outcome.generation} until {outcome.lease_expires_at.isoformat()}; "
                    "call again later to get its outcome",
                    operation_id=outcome.operation_id,
                    generation=outcome.generation,
                    lease_expires_at_ms=int(outcome.lease_expires_at.timestamp() * 1000),
                )
            )
        backoff = min(_POLL_MAX, _POLL_FIRST * 2**self._polls) * (0.5 + self._rng() / 2)
        self._polls += 1
        return Sleep(min(backoff, self.policy.wait - waited))

    def slept(self) -> Step:
        return self._reserve()

    # -- run -----------------------------------------------------------------------------

    def ran(self, run: Run, ran: Ran) -> Step:
        self._ran = ran
        r = run.reservation
        error = ran.error
        if ran.lost is not None:
            self.log.warning(
                "settle.operation.lease_lost", generation=r.generation, reason=ran.lost.reason
            )
        if error is None:
            return self._complete(r, ran.value)
        if self._held is not None and self._held.refused:
            # A call inside this attempt was refused as made inside its own attempt (of
            # this operation, or of one this attempt runs inside): every retry would meet
            # the same refusal, and whatever the function made of it is no answer.
            self._after_provisional = error
            return Settle(Action.MARK_PROVISIONAL, r, error=error, reason=_reason(ran))
        definite = self._definite(error)
        if definite is not None and not ran.stopped:
            return Settle(Action.FAIL, r, error=definite)
        if ran.lost is not None:
            # No result to report and another worker may own the operation: settle nothing.
            return Read(r.operation_id)
        return Settle(Action.MARK_PROVISIONAL, r, error=error, reason=_reason(ran))

    def _definite(self, error: BaseException) -> BaseException | None:
        """The failure to store for ``error`` when it is a definite answer: a ``terminal``
        exception, or a group (a ``TaskGroup``'s) whose every exception is one: the group's
        one exception itself, or the group of them. None: the outcome is uncertain (a
        group with any other exception in it). A cancellation, an interrupt or an exit (no
        ``Exception``: ``CancelledError``, ``KeyboardInterrupt``, ``SystemExit``, a group
        holding one) is never an answer, whatever ``terminal`` lists (``BaseException``):
        stored, it would replay a Ctrl-C as the operation's outcome forever."""
        terminal = self.policy.terminal
        if not isinstance(error, Exception):
            return None
        if isinstance(error, terminal):
            return error
        if not isinstance(error, BaseExceptionGroup) or not terminal:
            return None
        matched, rest = error.split(terminal)
        if matched is None or rest is not None:
            return None
        while len(matched.exceptions) == 1:
            only = matched.exceptions[0]
            if not isinstance(only, BaseExceptionGroup):
                return only
            matched = only
        return matched

    def _complete(self, r: Reservation, value: Any) -> Settle:
        """Store ``value``, checked first as every replay will read it back (the first call
        must not return what its replays refuse). A value that does not validate into the
        declared type is stored all the same (the effect happened: a retry must not run the
        function again); :meth:`settled` then raises what a replay raises."""
        declared = self._declared()
        # bytes (or a bytearray, a memoryview) are stored as they are only for a function
        # declared -> bytes, the one type a replay hands them back as, unchecked (bytes);
        # any other type reads JSON back.
        if declared is bytes:
            return Settle(Action.COMPLETE, r, result=value, stored=value)
        stored = AsJson(bytes(value)) if isinstance(value, _BYTES_LIKE) else value
        # An unresolved type (None) cannot be checked: the replay says what is wrong.
        if declared is None:
            return Settle(Action.COMPLETE, r, result=value, stored=stored)
        as_is = _replays_as_is(declared, value)
        if as_is and _parses_back_scalar(value):
            return Settle(Action.COMPLETE, r, result=value, stored=stored)
        try:  # the JSON the settlement stores: encoded once, here, and stored as it is
            # A key named twice (codec.repeated_key) is stored all the same: the paid call
            # ran, and a result refused now would leave the operation provisional and run
            # it again. Its check below refuses it, as every replay does.
            data = encode_result(stored, sys.maxsize, r.operation_id, repeated=True)
        except SettleError:  # no JSON form: the settlement refuses it, as it always did
            return Settle(Action.COMPLETE, r, result=value, stored=stored)
        # The check is skipped only for what certainly reads back as it is, which a key
        # named twice (in a model held where any value goes) never does.
        if not (as_is and _parses_back(data) and repeated_key(stored) is None):
            try:
                back = _replayed(declared, data)
            except ValidationError as exc:
                self._mismatch = (_mismatch(r.operation_id, declared, exc), exc)
            else:
                if _read_as_another_arm(declared, value, back):
                    self._ambiguous = (type(value), type(back))
        return Settle(Action.COMPLETE, r, result=value, stored=data)

    # -- settle --------------------------------------------------------------------------

    def settled(self, step: Settle, settlement: Settlement) -> Step:
        if settlement.verdict is Verdict.QUARANTINED:
            self.log.warning(
                "settle.operation.stale",
                generation=step.reservation.generation,
                action=step.action.value,
                kind=settlement.kind.value if settlement.kind is not None else None,
                quarantine_id=settlement.quarantine_id,
            )
            self._stale = settlement
            return Read(step.reservation.operation_id)
        if step.action is Action.COMPLETE:
            if self._mismatch is not None:
                error, cause = self._mismatch
                self.log.warning(
                    "settle.operation.result_mismatch",
                    generation=step.reservation.generation,
                    result_type=repr(self.policy.result_type()),
                    errors=cause.error_count(),
                )
                return Raise(error, cause)
            if self._ambiguous is not None:
                return Raise(self._read_as_another(step.reservation))
            return Return(step.result)
        assert step.error is not None
        if step.action is Action.FAIL:
            failure = settlement.record.failure if settlement.record else None
            failure = failure or StoredFailure(error_type=type(step.error).__name__, message="")
            return Raise(_failed(step.reservation.operation_id, failure), step.error)
        return self._retry_or_raise(step)

    def _read_as_another(self, r: Reservation) -> InvalidInput:
        """What the first call raises when its result, of one arm of the declared union,
        reads back as another: its replays would return the other."""
        assert self._ambiguous is not None
        returned, replayed = (kind.__name__ for kind in self._ambiguous)
        result_type = self.policy.result_type()
        self.log.warning(
            "settle.operation.result_ambiguous",
            generation=r.generation,
            result_type=repr(result_type),
            returned_type=returned,
            replayed_type=replayed,
        )
        return InvalidInput(
            f"the result of operation {r.operation_id!r}, of type {returned}, reads back as "
            f"{replayed} under {result_type!r}, the type its calls return: the union cannot "
            f"tell their stored JSON apart, so its replays would return {replayed}. The "
            "result is stored and the operation will not run again under this id; give the "
            "union a discriminator (a Literal field in each arm, Field(discriminator=...)), "
            "or pass the one type the function returns in result_type=",
            operation_id=r.operation_id,
        )

    def settle_raised(self, step: Settle, error: SettleError) -> Step:
        """The settlement call raised (Redis unreachable: ``BackendError``; too few
        replicas: ``DurabilityError``): the caller gets that error, told what the function
        did, whose outcome may not be stored. Its exception (or the error that says why its
        result cannot be stored) is the error's ``__context__`` (a decline is a definite
        answer the caller would otherwise never see). A
        cancellation, an interrupt or an exit is raised itself, the error its
        ``__context__``: a Ctrl-C turned into a ``BackendError`` is caught as one and the
        program runs on, and a cancelled task must end cancelled."""
        if step.reason == _UNSTORABLE:
            what = f"returned a result that cannot be stored ({type(step.error).__name__})"
        elif step.action is Action.COMPLETE:
            what = "returned a result"
        else:
            what = f"raised {type(step.error).__name__}"
        note = (
            f"settle: the function of this attempt (generation {step.reservation.generation}) "
            f"{what}, and its settlement ({step.action.value}) failed: that outcome may not "
            "be stored. If it was not, the record keeps the attempt's lease until it passes, "
            "and a call after that runs the function again, with the same "
            "Attempt.idempotency_key"
        )
        # Whichever is raised, the other is its __context__ (one way: no cycle).
        raised: BaseException = error
        other = step.error
        if step.error is not None and not isinstance(step.error, Exception):
            raised, other = step.error, error
        if step.action is not Action.COMPLETE:  # what it raised, or why it cannot be stored
            raised.__context__ = other
        raised.add_note(note)
        return Raise(raised)

    def settle_failed(self, step: Settle, error: BaseException) -> Step:
        """The settlement could not even be sent (a result that cannot be stored): the
        outcome is uncertain, so the attempt is marked provisional and the error raised."""
        if step.action is Action.MARK_PROVISIONAL:
            return Raise(error)
        self.log.warning(
            "settle.operation.unstorable",
            generation=step.reservation.generation,
            action=step.action.value,
            error_type=type(error).__name__,
        )
        self._after_provisional = error
        return Settle(Action.MARK_PROVISIONAL, step.reservation, error=error, reason=_UNSTORABLE)

    def _retry_or_raise(self, step: Settle) -> Step:
        error = step.error
        assert error is not None
        if self._after_provisional is not None:
            return Raise(self._after_provisional)
        if not isinstance(error, Exception):  # cancelled or interrupted: the caller stops
            return Raise(error)
        state = self._retry_state
        if state is None:
            state = self._retry_state = tenacity.RetryCallState(self.policy.retry, self._fn, (), {})
            state.start_time = self._started
        state.set_exception((type(error), error, error.__traceback__))
        retrying = self.policy.retry
        if not retrying.retry(state) or retrying.stop(state):
            self.log.warning(
                "settle.operation.gave_up",
                generation=step.reservation.generation,
                attempts=state.attempt_number,
                reason=step.reason,
            )
            return Raise(error)
        delay = float(retrying.wait(state))
        self.log.info(
            "settle.operation.retry_scheduled",
            generation=step.reservation.generation,
            attempt=state.attempt_number,
            reason=step.reason,
            delay=round(delay, 3),
        )
        state.idle_for += delay
        state.prepare_for_next_attempt()
        return Sleep(delay)

    # -- read ----------------------------------------------------------------------------

    def read(self, record: OperationRecord | None) -> Step:
        if self._unconfirmed is not None:
            return self._release(record, self._unconfirmed[0])
        operation_id = self.identity.operation_id
        stale = self._stale
        what = (
            f"its settlement was quarantined ({stale.kind})"
            if stale is not None
            else "its lease was lost"
        )
        advice = (
            "use the authoritative record (StaleAttempt.record), or call again to get the "
            "committed outcome"
        )
        if record is None:
            # Nothing in Redis remembers the operation (a restart without persistence, a
            # FLUSHALL, a failover that lost it, a DEL): no outcome was committed, and a
            # new call reserves afresh and runs the function again.
            advice = (
                "the operation has no record any more (Redis lost it or it was deleted), so "
                "nothing remembers that the function ran: calling again runs it again, with "
                "the same Attempt.idempotency_key for the downstream service to deduplicate"
            )
        error = StaleAttempt(
            f"this attempt of operation {operation_id!r} lost: {what}. Its result was not "
            f"committed; {advice}",
            operation_id=operation_id,
            record=record,
            quarantine_id=stale.quarantine_id if stale is not None else None,
        )
        cause = self._ran.error if self._ran is not None else None
        return Raise(error, cause)


#: The reason an attempt whose result or failure cannot be stored is marked provisional.
_UNSTORABLE = "unstorable_outcome"

#: The reason a reservation whose ``reserve`` raised DurabilityError is marked provisional.
UNCONFIRMED = "unconfirmed_reservation"


def own_reservation(record: OperationRecord | None, attempt_id: str) -> Reservation | None:
    """The reservation ``record`` holds for the attempt ``attempt_id``, still pending: what
    a ``reserve`` that raised :class:`DurabilityError` wrote (a new key, a takeover). None
    for a replay, another caller's attempt, or no record: nothing of this attempt holds
    the key."""
    if record is None or record.state is not State.PENDING or record.attempt_id != attempt_id:
        return None
    return Reservation(**{name: getattr(record, name) for name in Reservation.model_fields})


def _uuid4_hex() -> str:
    """``uuid.uuid4().hex`` without building the UUID: 16 random bytes with the version (4)
    and RFC 4122 variant bits set, as ``uuid4`` sets them."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    return raw.hex()


def _reason(ran: Ran) -> str:
    error = ran.error
    if ran.timed_out or isinstance(error, TimeoutError):
        return "timeout"
    if not isinstance(error, Exception):
        return "cancelled"
    return f"error:{type(error).__name__}"[:256]


_SCALARS = frozenset({str, int, float, bool, type(None)})
_DICT_OF_ANY = dict[str, Any]
_LIST_OF_ANY = list[Any]


def _replays_as_is(declared: Any, value: Any) -> bool:
    """Whether ``value`` certainly validates into ``declared`` once its JSON is parsed
    back (:func:`_parses_back`), so the check can be skipped (the first call's hot path):
    ``Any``; a JSON scalar of exactly the declared type; a dict declared ``dict`` or
    ``dict[str, Any]``, a list declared ``list`` or ``list[Any]`` (its JSON is an object,
    whose keys are strings, or an array, and any value validates into ``Any``). An instance
    of the declared pydantic model is checked all the same: its JSON need not validate back
    (a subclass's extra field where extras are forbidden, a required field with
    ``exclude=True``, an instance from ``model_construct`` or assigned a bad value after it
    was built)."""
    if declared is Any:
        return True
    kind = type(value)
    if kind is dict:
        return declared is dict or declared == _DICT_OF_ANY
    if kind is list:
        return declared is list or declared == _LIST_OF_ANY
    return kind is declared and declared in _SCALARS


#: What pydantic's JSON parser (jiter), which a replay reads the stored JSON with, refuses
#: although pydantic writes it: containers nested more than 200 deep, an integer of more
#: than 4300 digits (its own limit, whatever ``sys.set_int_max_str_digits`` says). Tests hold
#: both limits (tests/decorator/test_result_check.py).
_PARSER_DEPTH = 200
_PARSER_DIGITS = 4300
_PARSER_INT = 10**_PARSER_DIGITS


def _parses_back_scalar(value: Any) -> bool:
    """Whether ``value`` is a JSON scalar the parser reads back (it writes no container,
    and an int is of at most 4300 digits), so it need not be encoded to be sure."""
    kind = type(value)
    if kind is int:
        return bool(-_PARSER_INT < value < _PARSER_INT)
    return kind in _SCALARS


def _read_as_another_arm(declared: Any, value: Any, back: Any) -> bool:
    """Whether ``value``, of one arm of the union ``declared`` (``Wallet | Card``,
    ``UUID | str``, ``list[str] | tuple[str, ...]``, under ``Annotated`` too), was read back
    (``back``) as another."""
    kind = type(value)
    if type(back) is kind:
        return False
    arms = _arm_classes(declared)
    return len(arms) > 1 and any(arm is kind for arm in arms)


def _arm_classes(declared: Any) -> list[Any]:
    """The classes of the arms of ``declared``, a union or not: its ``Annotated`` metadata
    and the unions it holds unwrapped, a generic arm's origin (``dict[str, Any]``:
    ``dict``)."""
    origin = typing.get_origin(declared)
    if origin is typing.Annotated:
        return _arm_classes(typing.get_args(declared)[0])
    if origin in (typing.Union, types.UnionType):
        return [kind for arm in typing.get_args(declared) for kind in _arm_classes(arm)]
    return [origin or declared]


def _parses_back(data: bytes) -> bool:
    """Whether the parser certainly reads ``data`` back: JSON of at most 4300 bytes holds
    no longer integer, and with at most 200 brackets it nests no deeper (two C scans; a
    bracket in a string only sends the result to the full check)."""
    return len(data) <= _PARSER_DIGITS and data.count(b"[") + data.count(b"{") <= _PARSER_DEPTH


def _mismatch(operation_id: str, result_type: Any, exc: ValidationError) -> InvalidInput:
    """What every call of an operation whose stored result does not validate raises."""
    return InvalidInput(
        f"the stored result of operation {operation_id!r} does not validate into "
        f"{result_type!r}, the type its calls return: the function returned something "
        "else, or its return type changed since it was stored. The result is stored and "
        "the operation will not run again under this id; make the function return its "
        "declared type, or pass the type it returns (was stored as) in result_type=: "
        f"{_where_it_fails(exc, result_type)}",
        operation_id=operation_id,
    )


def _failed(operation_id: str, failure: StoredFailure) -> OperationFailed:
    return OperationFailed(
        f"operation {operation_id!r} failed definitely ({failure.error_type}: "
        f"{failure.message}); it will not run again under this id",
        operation_id=operation_id,
        failure=failure,
    )
