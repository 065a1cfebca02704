"""The sync driver: carries out the :class:`~settle.decorator._plan.Plan` with blocking
calls; the heartbeat renews the lease from a thread. No rule lives here."""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from settle._log import logger
from settle.decorator._options import Options
from settle.decorator._plan import (
    Plan,
    Raise,
    Ran,
    Read,
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

__all__ = ["KeySpec", "Operation", "PrincipalSpec", "RequestSpec", "RetrySpec", "TerminalSpec"]

P = ParamSpec("P")
R = TypeVar("R")


class Operation:
    """``@settler.operation(...)`` for plain functions and methods (see ``Settler.operation``)."""

    def __init__(
        self,
        settler: Settler,
        *,
        key: KeySpec,
        principal: PrincipalSpec,
        fingerprint: RequestSpec | None = None,
        result_type: Any = None,
        lease: float | None = None,
        timeout: float | None = None,
        retry: RetrySpec | None = None,
        terminal: TerminalSpec = (),
        wait: float = 5.0,
    ) -> None:
        self._settler = settler
        self._options = Options(
            settler.config,
            key=key,
            principal=principal,
            fingerprint=fingerprint,
            result_type=result_type,
            lease=lease,
            timeout=timeout,
            retry=retry,
            terminal=terminal,
            wait=wait,
        )

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        if inspect.iscoroutinefunction(fn):
            raise InvalidInput(
                f"{fn.__qualname__} is async: decorate it with AsyncSettler.operation"
            )
        # The decorating scope's names resolve annotations of classes defined in it.
        signature, policy = self._options.prepare(fn, dict(sys._getframe(1).f_locals))
        settler = self._settler

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            plan = Plan(policy, signature.identify(args, kwargs), fn=fn)
            return cast("R", _drive(settler, plan, signature, fn, args, kwargs))

        return wrapper


def _drive(
    settler: Settler,
    plan: Plan,
    signature: Signature,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
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
                step = plan.ran(step, _run(settler, step, fn, call_args, call_kwargs))
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
        return settler.complete(step.reservation, step.result)
    if step.action is Action.FAIL:
        return settler.fail(step.reservation, cast("BaseException", step.error))
    return settler.mark_provisional(step.reservation, step.reason)


def _run(
    settler: Settler,
    run: Run,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Ran:
    """Run ``fn`` in this thread while a heartbeat thread renews the lease every
    ``run.heartbeat`` seconds. A lost lease is reported through ``run.attempt.lost``: a
    thread cannot be interrupted, so the function is told and must stop on its own."""
    stop = threading.Event()
    attempt = run.attempt

    def heartbeat() -> None:
        while not stop.wait(run.heartbeat):
            try:
                renewal = settler.renew(run.reservation, lease=run.lease)
            except SettleError as exc:  # transient (BackendError, DurabilityError): beat on
                logger.warning(
                    "settle.operation.heartbeat_failed",
                    operation_id=attempt.operation_id,
                    generation=attempt.generation,
                    error=type(exc).__name__,
                )
                continue
            if not renewal.renewed:
                attempt.mark_lost(renewal)
                return

    beat = threading.Thread(
        target=heartbeat, name=f"settle-heartbeat-{attempt.generation}", daemon=True
    )
    beat.start()
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001  # every outcome is settled, then re-raised
        error: BaseException | None = exc
        value = None
    else:
        error = None
    finally:
        stop.set()
        beat.join()
    deadline = attempt.deadline
    timed_out = error is not None and deadline is not None and time.monotonic() >= deadline
    return Ran(value, error, timed_out, attempt._renewal if attempt.lost else None)
