"""Cursor checkpoints that bind each successor cursor to its exact response (SPEC 9).

Declare what the provider guarantees (:class:`ProviderContract`), write ``fetch_page`` and
``handle_event``, and let :class:`CursorConsumer` (or :class:`AsyncCursorConsumer`) run:
each response is witnessed durably before its events are handled, each handled event gets a
durable receipt, retries of a cursor are classified against earlier responses to it, and
the checkpoint advances only by one compare-and-swap to the successor of the exact response
whose events are all settled.
"""

from settle.cursor._async import AsyncCursorConsumer, AsyncCursorStore
from settle.cursor._sync import CursorConsumer, CursorStore
from settle.cursor.errors import (
    CoverageNotProven,
    CursorDivergence,
    CursorError,
    CursorExpired,
    ProviderCursorExpired,
)
from settle.cursor.models import (
    Checkpoint,
    Coverage,
    EmptyPageSemantics,
    Event,
    EventContext,
    Page,
    ProviderContract,
    Receipt,
    StepOutcome,
    StepResult,
    Witness,
)

__all__ = [
    "AsyncCursorConsumer",
    "AsyncCursorStore",
    "Checkpoint",
    "Coverage",
    "CoverageNotProven",
    "CursorConsumer",
    "CursorDivergence",
    "CursorError",
    "CursorExpired",
    "CursorStore",
    "EmptyPageSemantics",
    "Event",
    "EventContext",
    "Page",
    "ProviderContract",
    "ProviderCursorExpired",
    "Receipt",
    "StepOutcome",
    "StepResult",
    "Witness",
]
