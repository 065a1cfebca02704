"""The async driver: carries out the :class:`~settle.decorator._plan.Plan` with awaits;
the heartbeat renews the lease from a task and, when it finds the lease lost (not merely
lapsed: :meth:`~settle.models.Renewal.lapsed`), cancels the function (through the
``timeout`` scope). No rule lives here."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

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
    from settle._async.settler import AsyncSettler
    from settle.attempt import Attempt

__all__ = [
    "AsyncOperation",
    "KeySpec",
    "PrincipalSpec",
    "ReplayHook",
    "RequestSpec",
    "RetrySpec",
    "TerminalSpec",
]

P = ParamSpec("P")
R = TypeVar("R")


class AsyncOperation:
    """``@settler.operation(...)`` for coroutine functions (see ``AsyncSettler.operation``)."""

    def __init__(self, settler: AsyncSettler, options: Options) -> None:
        self._settler = settler
        self._options = options

    def __call__(self, fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        check_decorable(fn)
        if not inspect.iscoroutinefunction(fn):
            raise InvalidInput(
                f"{getattr(fn, '__qualname__', fn)!s} is not a coroutine function: decorate "
                "it with Settler.operation"
            )
        # The decorating scope's names resolve annotations of classes defined in it.
        signature, policy = self._options.prepare(fn, dict(sys._getframe(1).f_locals))
        settler = self._settler

        @functools.wraps(fn)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            plan = Plan(policy, signature.identify(args, kwargs), fn=fn)
            return cast("R", await _drive(settler, plan, signature, fn, args, kwargs))

        return wrapper


async def _drive(
    settler: AsyncSettler,
    plan: Plan,
    signature: Signature,
    fn: Callable[..., Awaitable[Any]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    span = telemetry().operation(settler.config.namespace, fn)
    with span:
        step = plan.start()
        interrupted: BaseException | None = None
        while True:
            match step:
                # The last step first: a class pattern that fails costs about 450
                # instructions, and every call ends here (a replay's second step).
                case Return():
                    if interrupted is not None:
                        raise interrupted  # settled first; the caller asked to stop
                    return step.value
                case Reserve():
                    try:
                        outcome = await settler.reserve(
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
                    ran = await _run(settler, plan, step, fn, call_args, call_kwargs)
                    span.ran(ran)
                    interrupted = ran.interrupted
                    step = plan.ran(step, ran)
                case Settle():
                    try:
                        # Shielded: a cancelled caller still settles what its attempt did.
                        settlement = await asyncio.shield(_settle(settler, step))
                    except InvalidInput as exc:
                        step = plan.settle_failed(step, exc)
                    except SettleError as exc:  # unreachable, too few replicas
                        step = plan.settle_raised(step, exc)
                    else:
                        step = plan.settled(step, settlement)
                case Read():
                    step = await _read(settler, plan, step)
                case Release():
                    # On the primary at least; the caller gets the reserve's error either way.
                    with contextlib.suppress(SettleError):
                        await settler.mark_provisional(step.reservation, step.reason)
                    step = plan.released()
                case Sleep():
                    span.attempt_done()
                    await asyncio.sleep(step.seconds)
                    step = plan.slept()
                case Raise():
                    if interrupted is not None:
                        raise interrupted
                    if step.cause is None:
                        raise step.error
                    raise step.error from step.cause


async def _read(settler: AsyncSettler, plan: Plan, step: Read) -> Step:
    """A :class:`Read` step: the record, as the plan reads it; after a ``reserve`` that
    raised :class:`DurabilityError` (the read is only to release this call's reservation),
    that error, whatever the read answers."""
    try:
        record = await settler.get(step.operation_id)
    except SettleError:
        if not plan.releasing:
            raise
        return plan.released()
    return plan.read(record)


async def _settle(settler: AsyncSettler, step: Settle) -> Settlement:
    if step.action is Action.COMPLETE:
        return await settler.complete(step.reservation, step.stored)
    if step.action is Action.FAIL:
        return await settler.fail(step.reservation, cast("BaseException", step.error))
    return await settler.mark_provisional(step.reservation, step.reason)


async def _run(
    settler: AsyncSettler,
    plan: Plan,
    run: Run,
    fn: Callable[..., Awaitable[Any]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Ran:
    """Await ``fn`` in this task under ``run.timeout``; a heartbeat task renews the lease
    and, if it is lost, expires the timeout scope at once, which cancels the function.

    Whatever ``fn`` did is returned to be settled: a cancellation of the caller that lands
    while the heartbeat is being stopped, after ``fn`` finished, is kept in
    ``Ran.interrupted`` and raised only after the settlement. So is one that lands while
    the ``timeout`` (or the lost lease) stops ``fn`` (in its cleanup, say): the caller has
    gone, so the attempt is cancelled, not timed out, and not retried."""
    loop = asyncio.get_running_loop()
    attempt = run.attempt
    task = asyncio.current_task()
    requested = task.cancelling() if task is not None else 0
    value: Any = None
    error: BaseException | None = None
    interrupted: BaseException | None = None
    scope = asyncio.timeout(run.timeout)
    # The first renewal's due time is taken now, not when the heartbeat task first runs:
    # a function that holds the loop before its first await would push it back that long.
    first = loop.time() + run.first
    async with scope:
        state = _Beat()
        beat = asyncio.create_task(
            _heartbeat(settler, plan, run, first, lambda: scope.reschedule(loop.time()), state)
        )
        try:
            running = plan.enter_run(run.reservation.generation)
            try:
                value = await fn(*args, **kwargs)
            finally:
                plan.leave_run(running)
        except BaseException as exc:  # noqa: BLE001  # every outcome is settled, then re-raised
            error = exc
        finally:
            state.ended = True
            if state.sending:
                # A renewal on its way is not cancelled: it is let finish, and is logged as
                # the sync heartbeat's is (it may have extended the lease on the primary),
                # without holding up the call or stopping the attempt (it has ended).
                _FINISHING.add(beat)
                beat.add_done_callback(_FINISHING.discard)
            else:
                beat.cancel()
                try:
                    await asyncio.wait({beat})
                except asyncio.CancelledError as exc:  # the caller, after fn had finished
                    interrupted = exc
    lost = attempt._renewal if attempt.lost else None
    if scope.expired():  # our own timeout (or the lost lease) cancelled fn
        # The scope withdrew its own cancellation as it ended: one still requested is the
        # caller's, who asked to stop meanwhile. What fn did is settled, then it is raised.
        if task is not None and task.cancelling() > requested:
            if interrupted is None:
                caller = isinstance(error, asyncio.CancelledError)
                interrupted = error if caller else asyncio.CancelledError()
            if error is None:
                return Ran(value, None, False, lost, interrupted)
            return Ran(None, interrupted, False, lost, interrupted, stopped=True)
        interrupted = None
        if isinstance(error, asyncio.CancelledError):
            error = TimeoutError(f"operation {attempt.operation_id!r}: the attempt was stopped")
        timed_out = lost is None and error is not None
        return Ran(None if error else value, error, timed_out, lost, stopped=error is not None)
    return Ran(value, error, False, lost, interrupted, stopped=attempt.stopped_by(error))


#: Heartbeats whose call ended while a renewal was on its way, until it returns (the loop
#: keeps only a weak reference to a task).
_FINISHING: set[asyncio.Task[None]] = set()


class _Beat:
    """What a call's heartbeat task and the call tell each other."""

    __slots__ = ("ended", "sending")

    def __init__(self) -> None:
        self.sending = False
        """A renewal is on its way (the task awaits the settler)."""
        self.ended = False
        """The call's function has ended: nothing is renewed again, nor stopped."""


def _warn(plan: Plan, event: str, attempt: Attempt, **fields: Any) -> None:
    """Log ``event`` for the heartbeat of ``attempt``. A log line that cannot be written (an
    application's processor that raises, a closed stream) is dropped, as the sync
    heartbeat's (``_Beating.warn``): it must not end the task that renews the lease, least
    of all in an outage, when every renewal fails and is logged."""
    with contextlib.suppress(Exception):
        plan.log.warning(event, generation=attempt.generation, **fields)


async def _heartbeat(
    settler: AsyncSettler,
    plan: Plan,
    run: Run,
    due: float,
    on_lost: Callable[[], None],
    state: _Beat,
) -> None:
    """Renew ``run``'s lease, the first time at ``due`` (on the loop's clock), then a
    heartbeat after each renewal was sent, until the call ends (``state.ended``): a renewal
    on its way then is finished and logged, as the sync heartbeat's is, and nothing after."""
    attempt = run.attempt
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(max(0.0, due - loop.time()))
        # The next renewal is due a heartbeat after this one is sent, not after it returns
        # (as the sync heartbeat's): a renewal that waits (min_replicas: up to a heartbeat,
        # Call.wait_ms, for a slow replica) would otherwise push every later one back by
        # its wait, and the lease would lapse between renewals under the running function.
        due = loop.time() + run.heartbeat
        state.sending = True
        try:
            renewal = await settler.renew(run.reservation, lease=run.lease)
        # Transient (BackendError, DurabilityError) or anything else: beat on. A heartbeat
        # that stopped would let the lease lapse under a running function, and a second
        # caller would run it again. (A cancellation is not an Exception: it stops here.)
        except Exception as exc:  # noqa: BLE001
            _warn(plan, "settle.operation.heartbeat_failed", attempt, error=type(exc).__name__)
            renewal = None
        finally:
            state.sending = False
        if renewal is None or renewal.renewed:
            pass
        elif renewal.lapsed(attempt.generation):
            # Nobody took the key over: the function runs on (its settlement is accepted),
            # and a later renewal that finds a takeover stops it.
            _warn(plan, "settle.operation.lease_lapsed", attempt, reason=renewal.reason)
        elif not state.ended:  # a renewal back after the call ended stops nothing
            attempt.mark_lost(renewal)
            on_lost()
            return
        if state.ended:
            return
