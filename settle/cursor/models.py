"""What a cursor consumer declares and what it gets back.

``ProviderContract`` is declared by the user; ``Event``, ``Coverage`` and ``Page`` are what
``fetch_page`` returns; ``Checkpoint``, ``Witness`` and ``Receipt`` are the durable records
read back from Redis; ``StepResult`` says what one step of the consumer did.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from settle._input import InputModel
from settle.fingerprint import canonical_json

__all__ = [
    "NOTHING_APPLIED",
    "Checkpoint",
    "Classification",
    "Coverage",
    "Disposition",
    "EmptyPageSemantics",
    "Event",
    "EventContext",
    "Page",
    "ProviderContract",
    "Receipt",
    "Recovery",
    "StepOutcome",
    "StepResult",
    "Witness",
    "WitnessEvent",
    "cursor_digest",
]

MAX_POSITION = (1 << 53) - 1
"""Positions are kept as Redis sorted-set scores (doubles): exact up to 2**53 - 1."""
NOTHING_APPLIED = -1
"""The applied boundary of a stream none of whose positions is applied yet, position 0
included: ``start(stream, cursor, boundary=NOTHING_APPLIED)`` for a provider whose positions
start at 0 (the default boundary 0 counts position 0 as applied); also the lowest ``after``
of a :class:`Coverage` marker, which then covers every position from 0."""


def cursor_digest(cursor: bytes) -> str:
    """SHA-256 (hex) of an opaque cursor: what logs and the CLI show instead of the cursor."""
    return hashlib.sha256(cursor).hexdigest()


def ms_datetime(ms: int) -> datetime:
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC)
    except (OverflowError, OSError) as exc:  # a time no clock gives: not what settle wrote
        raise ValueError(f"time out of range: {ms}") from exc


class EmptyPageSemantics(StrEnum):
    """What the provider documents about an empty page (no events)."""

    NONE = "none"
    """Nothing: an empty page proves nothing, the checkpoint stays where it is."""
    CAUGHT_UP = "caught_up"
    """An empty page means no event exists after the input cursor at the time of the
    response, and its successor resumes exactly there."""


class ProviderContract(InputModel):
    """What the provider guarantees; the checks follow it and never assume more.

    A bad value raises :class:`~settle.errors.InvalidInput` naming the field (pydantic's
    ``ValidationError`` is its ``__cause__``), as ``SettleConfig`` does."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rotation_allowed: bool = False
    """A retry of the same cursor may return the same events with a new successor token,
    and that new token is as good as the old one."""
    boundary: Literal["exclusive", "inclusive"] = "exclusive"
    """``inclusive``: every page after the first repeats the last event of the previous
    page (the boundary event); ``exclusive``: a page starts after it."""
    stable_snapshots: bool = False
    """Responses carry a snapshot id; the same cursor under the same snapshot always
    returns the same events, and an empty page under a snapshot ends that snapshot."""
    coverage_watermarks: bool = False
    """Responses may carry a :class:`Coverage` marker: every event with a position in
    ``(after, through]`` is in that response."""
    empty_page: EmptyPageSemantics = EmptyPageSemantics.NONE
    positions: Literal["dense", "sparse"] = "dense"
    """``dense``: positions are consecutive integers (a gap is a lost event); ``sparse``:
    positions only increase, so a gap proves nothing either way."""
    cursor_ttl: float | None = Field(default=None, gt=0)
    """Seconds a cursor stays valid after it was checkpointed (server clock); an older one
    is not sent, :class:`~settle.cursor.CursorExpired` is raised instead."""


@dataclass(frozen=True, slots=True)
class Event:
    """One event of a response: a stable id, its immutable source position, its payload.

    The payload is only digested (SHA-256 of the bytes, whether ``bytes``, ``bytearray``
    or ``memoryview`` holds them, or of the canonical JSON of any other value); it is never
    stored or logged.
    """

    id: str
    position: int
    payload: Any = None
    digest: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.digest:
            # The same bytes have one digest whatever bytes-like type a client hands them in
            # (canonical JSON would take a bytearray for a base64 string).
            data = (
                self.payload if isinstance(self.payload, bytes | bytearray | memoryview) else None
            )
            raw = bytes(data) if data is not None else canonical_json(self.payload)
            object.__setattr__(self, "digest", hashlib.sha256(raw).hexdigest())


@dataclass(frozen=True, slots=True)
class Coverage:
    """The provider's coverage watermark: this response holds every event with a position
    in ``(after, through]`` (``after`` -1: from position 0 on)."""

    after: int
    through: int


@dataclass(frozen=True, slots=True)
class Page:
    """One response of the provider to ``fetch_page(cursor)``."""

    events: Sequence[Event]
    successor: bytes = field(repr=False)
    snapshot: str | None = None
    coverage: Coverage | None = None


class Classification(StrEnum):
    """How a response was classified against the earlier responses to the same cursor."""

    FIRST = "first"
    """No earlier response for (cursor, generation)."""
    EXACT_REPLAY = "exact_replay"
    TOKEN_ROTATION = "token_rotation"  # noqa: S105 - a classification, not a secret
    SHIFTED_PAGE = "shifted_page"
    DIVERGENT = "divergent"
    """Unprovable divergence: recorded as an abandoned witness, never applied."""


class Disposition(StrEnum):
    PENDING = "pending"
    PROMOTED = "promoted"
    ABANDONED = "abandoned"


class Recovery(StrEnum):
    """How to get a stopped stream going again (named by every divergence error)."""

    STABLE_BOUNDARY = "stable_boundary"
    """Ask the provider for a cursor at the applied boundary (a position it can resume
    from) and ``reset`` the checkpoint to it."""
    FRESH_SNAPSHOT = "fresh_snapshot"
    """Start a fresh provider snapshot and ``reset`` to its first cursor; receipts keep
    events applied before from being applied twice."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, ser_json_bytes="base64", val_json_bytes="base64")


class Checkpoint(_Model):
    """The durable checkpoint of one stream."""

    stream: str
    cursor: bytes = Field(repr=False)
    """The opaque cursor, verbatim (kept out of ``repr``: logs and tracebacks show the
    digest)."""
    cursor_digest: str
    generation: int
    boundary: int
    """The applied boundary: the highest position applied (or proven empty) so far; -1
    (``NOTHING_APPLIED``) while none is, position 0 included."""
    created_at: datetime
    updated_at: datetime
    promoted_witness: str | None
    """The attempt id of the witness whose successor this cursor is (None for a start or
    a reset)."""
    pruned: int | None = None
    """The highest position whose receipt ``receipt_horizon`` pruned (None: none was): a
    ``reset`` to a boundary below it is refused unless ``reapply_pruned=True``."""


class WitnessEvent(_Model):
    id: str
    position: int
    digest: str


class Witness(_Model):
    """The durable witness of one response: what it held, exactly, and what became of it."""

    attempt_id: str
    generation: int
    input_cursor: bytes = Field(repr=False)
    input_digest: str
    events: tuple[WitnessEvent, ...]
    successor: bytes = Field(repr=False)
    successor_digest: str
    snapshot: str | None
    coverage: tuple[int, int] | None
    classification: Classification
    next_boundary: int
    disposition: Disposition
    reason: str
    created_at: datetime
    updated_at: datetime


class Receipt(_Model):
    """The durable outcome of one event: satisfied again only by the same id, position
    and digest."""

    event_id: str
    position: int
    digest: str
    generation: int
    attempt_id: str
    outcome: str
    at: datetime


@dataclass(frozen=True, slots=True)
class EventContext:
    """What ``handle_event`` gets with each event. ``key`` is stable across retries,
    restarts and workers: use it as the idempotency key of the event's effect."""

    stream: str
    generation: int
    attempt_id: str
    classification: Classification
    key: str


class StepOutcome(StrEnum):
    PROMOTED = "promoted"
    """The response was applied and its successor is the checkpoint now."""
    HELD = "held"
    """An empty response without evidence: the checkpoint stays, fetch again later."""
    SUPERSEDED = "superseded"
    """Another worker promoted this generation first; nothing of this response was
    published."""
    LOST = "lost"
    """This response lost to another worker's pending response to the same cursor, which
    holds an event this one lacks: nothing of this response was published; the other
    response (or an exact replay of it) is the one that can advance."""
    NO_PROGRESS = "no_progress"
    """A loop: the response brought nothing new and its successor is the cursor held now
    (or one this checkpoint passed before). Nothing was witnessed or promoted: no new
    generation, and the checkpoint never moves back."""


class StepResult(_Model):
    outcome: StepOutcome
    classification: Classification | None
    generation: int
    """The checkpoint's generation after the step."""
    boundary: int
    applied: int = 0
    skipped: int = 0
    """Events not handed to ``handle_event`` because a matching receipt existed."""
    attempt_id: str | None = None
