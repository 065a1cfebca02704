"""One step of a cursor consumer as a sans-I/O procedure.

``procedure`` is a generator that yields instructions (run this script call, fetch this
cursor, hand over this event) and receives their results; the sync and async shells are
small loops that carry them out, as tenacity's drivers do. Every decision lives here and in
``_classify``: the shells only do I/O.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from settle._input import refuse_unawaited
from settle._runtime import RunScript
from settle.cursor._classify import Decision, View
from settle.cursor._core import CursorCore, WitnessesChanged
from settle.cursor.errors import CursorError, ProviderCursorExpired
from settle.cursor.models import Event, EventContext, Page, ProviderContract, StepResult

__all__ = ["Done", "FetchPage", "HandleEvent", "Instruction", "RunScript", "procedure"]


@dataclass(frozen=True, slots=True)
class FetchPage:
    """Call ``fetch_page(cursor)``; throw :class:`ProviderCursorExpired` back in if raised."""

    cursor: bytes


@dataclass(frozen=True, slots=True)
class HandleEvent:
    """Call ``handle_event(event, context)``; throw its exception back in if it raises."""

    event: Event
    context: EventContext


@dataclass(frozen=True, slots=True)
class Done:
    result: StepResult


Instruction = RunScript | FetchPage | HandleEvent | Done


#: How often one step classifies again because another worker witnessed meanwhile.
_RECLASSIFY = 8


def _resume(
    core: CursorCore, stream: str, view: View, attempt_id: str
) -> Generator[Instruction, Any, bool]:
    """Mark a pending response resumed: that is its progress, so a shorter copy of it
    stands down from now on (``stand_down_for``), however long it lay idle before. False
    when the checkpoint moved on meanwhile."""
    call = core.plan_resume(stream, attempt_id, view.checkpoint.generation)
    return core.decode_resume(call, (yield RunScript(call)))


def _hand_over(
    core: CursorCore, stream: str, view: View, aid: str, decision: Decision, page: Page
) -> Generator[Instruction, Any, tuple[int, int, bool]]:
    """Hand each event without a matching receipt to ``handle_event``, then record its
    receipt: (applied, skipped, live); not live when the checkpoint moved on meanwhile."""
    applied = skipped = 0
    for event in page.events:
        if view.satisfied(event):
            skipped += 1
            continue
        handing = HandleEvent(event, core.context(stream, view, aid, decision, event))
        try:
            handled = yield handing
        except Exception as exc:
            # The step stops here, its response pending: the next step resumes it and hands
            # this event over again (the ones before it have their receipts).
            core.handler_failed(stream, aid, event, exc)
            raise
        # An awaitable back (an async handler in the sync shell) never ran: no receipt.
        refuse_unawaited(handled, "handle_event", "AsyncCursorConsumer", stream)
        call = core.plan_outcome(stream, aid, event)
        outcome = core.decode_outcome(call, (yield RunScript(call)), view)
        applied += 1
        if not outcome.live:
            return applied, skipped, False
    return applied, skipped, True


def procedure(
    core: CursorCore, stream: str, contract: ProviderContract, stand_down_ms: int
) -> Generator[Instruction, Any, None]:
    """Read the checkpoint, fetch its page, classify, witness, hand over each event that
    has no matching receipt and record its receipt, then promote (SPEC 9)."""
    call = core.plan_load(stream)
    first = core.decode_load(call, (yield RunScript(call)))
    core.check_expiry(stream, contract, first)
    try:
        raw_page = yield FetchPage(first.checkpoint.cursor)
    except ProviderCursorExpired as exc:
        raise core.expired(stream, first.checkpoint, str(exc)) from exc
    page = core.check_page(stream, contract, raw_page)
    for _ in range(_RECLASSIFY):
        call = core.plan_load(stream, page, first.checkpoint.boundary)
        view = core.decode_load(call, (yield RunScript(call)))
        if core.moved(first, view):
            yield Done(core.superseded(view, None))
            return
        decision = core.classify(stream, contract, view, page, stand_down_ms)
        if decision.unrecorded:
            raise core.diverged(decision, None)
        if decision.stalled or decision.lost is not None:
            yield Done(core.stalled(view, decision))
            return
        if decision.held and not decision.record:
            yield Done(core.held(view, decision))
            return
        aid = decision.resume
        if aid is not None:
            if decision.error is None and not (yield from _resume(core, stream, view, aid)):
                yield Done(core.superseded(view, decision))
                return
            break
        call = core.plan_witness(stream, view, page, decision)
        try:
            aid = core.decode_witness(call, (yield RunScript(call)))
        except WitnessesChanged:
            continue  # another worker's response to this cursor is durable now: look again
        if aid is None:
            yield Done(core.superseded(view, decision))
            return
        if decision.held:  # the empty response is on record, pending: it does not advance
            yield Done(core.held(view, decision))
            return
        break
    else:
        raise CursorError(
            f"stream {stream!r}: other workers kept witnessing responses to the same cursor; "
            "nothing was written by this step, run it again",
            stream=stream,
        )
    if decision.error is not None:
        raise core.diverged(decision, aid)
    applied, skipped, live = yield from _hand_over(core, stream, view, aid, decision, page)
    if not live:
        yield Done(core.superseded(view, decision, applied, skipped))
        return
    call = core.plan_promote(stream, view, aid)
    yield Done(core.decode_promote(call, (yield RunScript(call)), decision, applied, skipped))
