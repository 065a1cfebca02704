"""The rules of SPEC 9, with no I/O: check a response, classify it against the earlier
responses to the same (cursor, generation), and decide whether it may advance.

``classify`` returns a :class:`Decision`; a divergence is returned (not raised) so that the
shell can first keep the response as an abandoned witness and then raise it.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable
from dataclasses import dataclass

from settle._input import has_control
from settle.cursor.errors import (
    CoverageNotProven,
    CursorDivergence,
    InvalidResponse,
    ReceiptConflict,
    RotationNotAllowed,
)
from settle.cursor.models import (
    MAX_POSITION,
    NOTHING_APPLIED,
    Checkpoint,
    Classification,
    Coverage,
    Disposition,
    EmptyPageSemantics,
    Event,
    Page,
    ProviderContract,
    Receipt,
    Recovery,
    Witness,
    WitnessEvent,
    cursor_digest,
)

__all__ = ["Decision", "View", "check_page", "classify"]

MAX_EVENT_ID_CHARS = 512
MAX_DIGEST_CHARS = 512
#: A receipt holds the digest between spaces (split on ASCII whitespace by the scripts):
#: no ASCII whitespace or control character in it.
_DIGEST = re.compile(f"[^\\x00-\\x20\\x7f]{{1,{MAX_DIGEST_CHARS}}}")
MAX_EVENTS_PER_PAGE = 10_000
MAX_CURSOR_BYTES = 64 << 10
MAX_SNAPSHOT_CHARS = 256
#: The reason of the pending witness an empty response without evidence leaves behind.
HELD_REASON = "held"
#: How many held witnesses one (cursor, generation) keeps as evidence (a rotating provider
#: issues a new successor on every empty answer: the first few prove the point).
MAX_HELD_WITNESSES = 8


@dataclass(frozen=True, slots=True)
class View:
    """What Redis holds for a stream when a response is classified."""

    checkpoint: Checkpoint
    witnesses: tuple[Witness, ...]
    """Every witness of the checkpoint's generation."""
    receipts: dict[str, Receipt]
    """Receipts of the response's event ids and of every position near the boundary."""
    now_ms: int
    passed: frozenset[str] = frozenset()
    """Digests of the cursors this checkpoint held at earlier generations (as far as the
    kept witnesses remember)."""

    @property
    def pending(self) -> list[Witness]:
        """The pending responses that may still be applied (a held empty response is
        evidence only: it constrains nothing)."""
        return [
            w
            for w in self.witnesses
            if w.disposition is Disposition.PENDING and w.reason != HELD_REASON
        ]

    @property
    def held(self) -> list[Witness]:
        """The pending witnesses of empty responses that held for want of evidence."""
        return [
            w
            for w in self.witnesses
            if w.disposition is Disposition.PENDING and w.reason == HELD_REASON
        ]

    def satisfied(self, event: Event) -> bool:
        r = self.receipts.get(event.id)
        return r is not None and r.position == event.position and r.digest == event.digest


@dataclass(frozen=True, slots=True)
class Decision:
    classification: Classification
    next_boundary: int
    resume: str | None = None
    """Attempt id of the witness an exact replay resumes."""
    held: bool = False
    """An empty response with no evidence: do not advance, fetch again later."""
    record: bool = False
    """With ``held``: keep the response as a pending witness (the evidence that it came)."""
    lost: str | None = None
    """The attempt id of a pending response to the same cursor that this one is a shorter
    copy of, with an unsettled event this one lacks: this response lost to it."""
    stalled: bool = False
    """No progress: nothing new, and the successor is the cursor held now or one passed
    before. Nothing is witnessed or promoted."""
    error: CursorDivergence | None = None
    unrecorded: bool = False
    """With ``error``: raise it without keeping this response as an abandoned witness (the
    pending response it falls short of is the evidence)."""


def _bad(stream: str, reason: str, message: str) -> InvalidResponse:
    return InvalidResponse(
        f"fetch_page returned an invalid page: {message}", stream=stream, reason=reason
    )


def check_page(stream: str, contract: ProviderContract, page: object) -> Page:
    """Validate what ``fetch_page`` returned; raise :class:`InvalidResponse` (nothing
    written) when it is not a page the contract allows."""
    if inspect.isawaitable(page):
        # An async fetch_page given to the sync consumer: it never ran (closed, so nothing
        # warns later of a coroutine never awaited).
        if inspect.iscoroutine(page):
            page.close()
        raise _bad(
            stream,
            "awaitable",
            "fetch_page returned an awaitable, which was never awaited: it did not run. An "
            "async fetch_page needs AsyncCursorConsumer",
        )
    if not isinstance(page, Page):
        raise _bad(stream, "not_a_page", f"expected settle.cursor.Page, got {type(page).__name__}")
    successor = page.successor
    if isinstance(successor, bytearray | memoryview):
        successor = bytes(successor)
    if not isinstance(successor, bytes) or len(successor) > MAX_CURSOR_BYTES:
        raise _bad(stream, "successor", f"successor must be bytes of at most {MAX_CURSOR_BYTES}")
    if page.snapshot is not None and (
        not isinstance(page.snapshot, str)
        or not 1 <= len(page.snapshot) <= MAX_SNAPSHOT_CHARS
        or has_control(page.snapshot)  # stored, and shown by the CLI, as event ids are
    ):
        raise _bad(
            stream,
            "snapshot",
            f"snapshot must be a str of 1 to {MAX_SNAPSHOT_CHARS} characters without control "
            "characters",
        )
    cov = page.coverage
    if cov is not None:
        if not contract.coverage_watermarks:
            raise _bad(
                stream,
                "coverage_undeclared",
                "a coverage marker, but the contract declares no watermarks",
            )
        if not isinstance(cov, Coverage):
            raise _bad(
                stream,
                "coverage",
                f"coverage must be settle.cursor.Coverage, got {type(cov).__name__}",
            )
        if (
            not (_is_position(cov.after, low=NOTHING_APPLIED) and _is_position(cov.through))
            or cov.after > cov.through
        ):
            raise _bad(
                stream,
                "coverage",
                "coverage needs integer positions with after <= through (after -1: from "
                "position 0 on)",
            )
    if isinstance(page.events, str | bytes) or not isinstance(page.events, Iterable):
        raise _bad(
            stream, "events", f"events must be a list of Event, got {type(page.events).__name__}"
        )
    events = list(page.events)
    if len(events) > MAX_EVENTS_PER_PAGE:
        raise _bad(stream, "too_many_events", f"more than {MAX_EVENTS_PER_PAGE} events")
    seen: set[str] = set()
    last = -1
    for ev in events:
        if not isinstance(ev, Event):
            raise _bad(
                stream, "events", f"events must be settle.cursor.Event, got {type(ev).__name__}"
            )
        if not isinstance(ev.id, str) or not 1 <= len(ev.id) <= MAX_EVENT_ID_CHARS:
            raise _bad(
                stream, "event_id", f"event ids must be str of 1 to {MAX_EVENT_ID_CHARS} characters"
            )
        if has_control(ev.id):
            raise _bad(stream, "event_id", "event ids must not contain control characters")
        if not _is_position(ev.position):
            raise _bad(
                stream, "position", f"event positions must be integers in [0, {MAX_POSITION}]"
            )
        if not (
            isinstance(ev.digest, str)
            and _DIGEST.fullmatch(ev.digest)
            and not has_control(ev.digest)
            and not any(ch.isspace() for ch in ev.digest)
        ):
            # A receipt holds the digest between spaces: one with a space would not read back.
            # A lone surrogate cannot be sent to Redis at all: it failed the event's receipt
            # (UnicodeEncodeError) after its handler ran, on every retry. Refused with every
            # control, format and line-separator character, as in event ids.
            raise _bad(
                stream,
                "digest",
                f"an event's digest must be text of 1 to {MAX_DIGEST_CHARS} characters without "
                "whitespace or control characters (by default settle computes a SHA-256)",
            )
        if ev.position <= last:
            raise _bad(
                stream,
                "positions_not_increasing",
                "event positions must strictly increase within a page (a provider that lists "
                "newest first, as Stripe's events list does, is reversed by fetch_page)",
            )
        if ev.id in seen:
            raise _bad(stream, "duplicate_event_id", "an event id appears twice in one page")
        seen.add(ev.id)
        last = ev.position
    return Page(tuple(events), successor, page.snapshot, cov)


def _is_position(value: object, *, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= MAX_POSITION


def witness_events(page: Page) -> tuple[WitnessEvent, ...]:
    return tuple(WitnessEvent(id=e.id, position=e.position, digest=e.digest) for e in page.events)


class _Rules:
    """One classification: the inputs and the errors it can produce."""

    def __init__(self, stream: str, contract: ProviderContract, view: View, page: Page) -> None:
        self.stream = stream
        self.contract = contract
        self.view = view
        self.page = page
        self.ck = view.checkpoint
        self.boundary = view.checkpoint.boundary
        cov = page.coverage
        self.coverage: Coverage | None = cov if cov and cov.after <= self.boundary else None
        """The coverage marker, when it reaches back to the applied boundary."""

    def diverge(
        self, kind: type[CursorDivergence], message: str, reason: str, recovery: Recovery
    ) -> CursorDivergence:
        return kind(
            message,
            stream=self.stream,
            recovery=recovery,
            generation=self.ck.generation,
            boundary=self.boundary,
            reason=reason,
        )

    def covered_by_marker(self, position: int) -> bool:
        c = self.coverage
        return c is not None and c.after < position <= c.through

    def receipt_conflict(self) -> CursorDivergence | None:
        by_position: dict[int, list[Receipt]] = {}
        for held in self.view.receipts.values():
            by_position.setdefault(held.position, []).append(held)
        for ev in self.page.events:
            r = self.view.receipts.get(ev.id)
            if r is not None and (r.position, r.digest) != (ev.position, ev.digest):
                what = "payload" if r.position == ev.position else "position"
                return self.diverge(
                    ReceiptConflict,
                    f"event {ev.id!r} at position {ev.position} has another {what} than its "
                    f"durable receipt (position {r.position})",
                    f"changed_{what}",
                    Recovery.FRESH_SNAPSHOT,
                )
            others = [o for o in by_position.get(ev.position, []) if o.event_id != ev.id]
            if others:
                return self.diverge(
                    ReceiptConflict,
                    f"event {ev.id!r} claims position {ev.position}, where event "
                    f"{others[0].event_id!r} was applied",
                    "position_taken",
                    Recovery.FRESH_SNAPSHOT,
                )
            if r is None and ev.position <= self.boundary:
                return self.diverge(
                    CoverageNotProven,
                    f"event {ev.id!r} at position {ev.position} is at or below the applied "
                    f"boundary {self.boundary} and has no receipt",
                    "below_boundary",
                    Recovery.FRESH_SNAPSHOT,
                )
        return None

    def contract_conflict(self) -> CursorDivergence | None:
        events = self.page.events
        # The contract says the page repeats the boundary event, not that it opens with it:
        # events tied on the provider's position (a timestamp) may come before it.
        if (
            self.contract.boundary == "inclusive"
            and events
            and not any(e.position == self.boundary for e in events)
            and any(r.position == self.boundary for r in self.view.receipts.values())
        ):
            return self.diverge(
                CoverageNotProven,
                f"the inclusive provider did not repeat the boundary event at position "
                f"{self.boundary}",
                "boundary_event_missing",
                Recovery.STABLE_BOUNDARY,
            )
        if self.contract.stable_snapshots and self.page.snapshot is not None:
            mine = witness_events(self.page)
            for w in self.view.witnesses:
                if w.snapshot == self.page.snapshot and w.events != mine:
                    return self.diverge(
                        CursorDivergence,
                        f"snapshot {self.page.snapshot!r} returned other events for the same "
                        "cursor, against the stable-snapshot contract",
                        "snapshot_changed",
                        Recovery.FRESH_SNAPSHOT,
                    )
        if self.contract.positions == "dense":
            return self.dense_gap()
        return None

    def dense_gap(self) -> CursorDivergence | None:
        new = [e.position for e in self.page.events if e.position > self.boundary]
        if not new:
            return None
        held = {r.position for r in self.view.receipts.values() if r.position > self.boundary}
        have = held.union(new)
        expected = self.boundary + 1
        for position in sorted(p for p in have if p <= new[-1]):
            if position > expected and not all(
                self.covered_by_marker(p) for p in (expected, position - 1)
            ):
                return self.diverge(
                    CoverageNotProven,
                    f"dense positions skip from {expected - 1} to {position}: the response "
                    f"does not cover position {expected}",
                    "gap",
                    Recovery.STABLE_BOUNDARY,
                )
            expected = position + 1
        return None

    def witnessed_missing(self, *, beyond: bool = True) -> CursorDivergence | None:
        """An event an earlier response to this cursor held and that is not durably
        settled, wherever it sits, must be in this response (same id, position, digest) or
        inside its coverage marker: a successor is opaque, so a shorter retry may point past
        it and skip it for good."""
        present = {(e.id, e.position, e.digest) for e in self.page.events}
        top = max([self.boundary, *(e.position for e in self.page.events)])
        for w in self.view.pending:
            for ev in w.events:
                if not beyond and ev.position > top:
                    continue
                r = self.view.receipts.get(ev.id)
                if r is not None and (r.position, r.digest) == (ev.position, ev.digest):
                    continue
                if (ev.id, ev.position, ev.digest) in present or self.covered_by_marker(
                    ev.position
                ):
                    continue
                return self.diverge(
                    CoverageNotProven,
                    f"event {ev.id!r} at position {ev.position}, witnessed in an earlier "
                    "response to this cursor and not settled, is missing from the retry",
                    "witnessed_event_missing",
                    Recovery.STABLE_BOUNDARY,
                )
        return None

    def truncated_of(self) -> list[tuple[Witness, WitnessEvent]]:
        """The pending responses this one is a strict, shorter prefix of, each with the
        first unsettled event it lists beyond it: the other worker (or an exact replay of
        that response) must go on; this one stands down."""
        mine = witness_events(self.page)
        if not any(e.position > self.boundary for e in mine):
            return []  # nothing new: an empty answer (held, or judged by its evidence)
        found = []
        for w in self.view.pending:
            if len(mine) < len(w.events) and w.events[: len(mine)] == mine:
                for ev in w.events[len(mine) :]:
                    r = self.view.receipts.get(ev.id)
                    if r is None or (r.position, r.digest) != (ev.position, ev.digest):
                        found.append((w, ev))
                        break
        return found

    def idle_ms(self, w: Witness) -> int:
        """How long ``w`` has gone without progress: since it was written or last resumed,
        or since the newest receipt of its events (the view holds every receipt of its
        generation's witnesses' events; server clock)."""
        last = max(
            [
                w.updated_at,
                *(r.at for e in w.events if (r := self.view.receipts.get(e.id)) is not None),
            ]
        )
        return self.view.now_ms - int(last.timestamp() * 1000)

    def sparse_anchor(self) -> bool:
        """A sparse shifted page proves it starts where the applied events end: it opens
        with an applied event (the boundary, or one of this generation) as a contiguous
        slice would, or it carries a coverage marker reaching back to the boundary."""
        if self.coverage is not None:
            return True
        if not self.page.events:
            return False
        # A retry that opens with the very events of a pending response to the same cursor
        # starts where that response started (two workers, one of which saw more).
        mine = witness_events(self.page)
        for w in self.view.pending:
            if w.events and mine[: len(w.events)] == w.events:
                return True
        first = self.page.events[0]
        r = self.view.receipts.get(first.id)
        return (
            r is not None
            and self.view.satisfied(first)
            and (r.position == self.boundary or r.generation == self.ck.generation)
        )

    def empty_evidence(self) -> bool:
        if self.coverage is not None:
            return True
        if self.contract.stable_snapshots and self.page.snapshot is not None:
            return True
        return self.contract.empty_page is EmptyPageSemantics.CAUGHT_UP

    def next_boundary(self) -> int:
        top = max([self.boundary, *(e.position for e in self.page.events)])
        if self.coverage is not None:
            top = max(top, self.coverage.through)
        return top

    def against_earlier(self) -> tuple[Classification, str | None]:
        mine = witness_events(self.page)
        pending = self.view.pending
        same = [w for w in pending if w.events == mine]
        exact = [w for w in same if w.successor == self.page.successor]
        if exact:
            return Classification.EXACT_REPLAY, exact[0].attempt_id
        if same:
            return Classification.TOKEN_ROTATION, None
        if pending:
            return Classification.SHIFTED_PAGE, None
        return Classification.FIRST, None


def classify(
    stream: str, contract: ProviderContract, view: View, page: Page, stand_down_ms: int
) -> Decision:
    """Classify ``page`` (the response to the checkpoint's cursor) for ``view``. A shorter
    copy of a pending response stands down (``lost``) while that response made progress in
    the last ``stand_down_ms``; after that its worker is taken for gone, and the stream
    stops instead of standing down for good."""
    rules = _Rules(stream, contract, view, page)

    def stop(error: CursorDivergence) -> Decision:
        # The same divergent response again is not witnessed twice.
        mine = witness_events(page)
        again = [
            w.attempt_id
            for w in view.witnesses
            if w.classification is Classification.DIVERGENT
            and w.events == mine
            and w.successor == page.successor
        ]
        boundary = view.checkpoint.boundary
        return Decision(
            Classification.DIVERGENT, boundary, resume=again[0] if again else None, error=error
        )

    error = rules.receipt_conflict() or rules.contract_conflict()
    if error is not None:
        return stop(error)
    kind, resume = rules.against_earlier()
    empty = not any(e.position > rules.boundary for e in page.events)
    if empty and not rules.empty_evidence():
        # An empty response advances only with evidence bound to it; without, it holds,
        # and it is kept as a pending witness (once per successor) so the evidence exists.
        held = view.held
        record = len(held) < MAX_HELD_WITNESSES and all(w.successor != page.successor for w in held)
        return Decision(kind, rules.boundary, held=True, record=record)
    nothing_new = rules.next_boundary() == rules.boundary
    successor = cursor_digest(page.successor)
    if nothing_new and (successor == view.checkpoint.cursor_digest or successor in view.passed):
        # A loop: promoting it would make a new generation on every step (or move the
        # checkpoint back to a cursor it passed). Stay, and say so.
        return Decision(kind, rules.boundary, stalled=True)
    if successor in view.passed and successor != view.checkpoint.cursor_digest:
        return stop(
            rules.diverge(
                CursorDivergence,
                "the successor is a cursor this checkpoint already passed: promoting it would "
                "move the checkpoint back",
                "successor_passed",
                Recovery.STABLE_BOUNDARY,
            )
        )
    truncated = sorted(rules.truncated_of(), key=lambda found: rules.idle_ms(found[0]))
    if truncated:
        # Two workers, the other one's response saw more (or a lagging replica truncated a
        # retry): promoting this one could skip what the other holds. Stand down, unless
        # every such response stopped moving: then no retry would ever finish one (their
        # workers died and the provider now answers shorter pages), and standing down would
        # hold the stream silently for good. Nothing is witnessed either way: the pending
        # response is the evidence, and a retry that rotates its token would otherwise
        # leave one more abandoned witness each time.
        other, owed = truncated[0]  # the one that moved last
        idle = rules.idle_ms(other)
        if idle < stand_down_ms:
            return Decision(kind, rules.boundary, lost=other.attempt_id)
        return Decision(
            Classification.DIVERGENT,
            view.checkpoint.boundary,
            unrecorded=True,
            error=rules.diverge(
                CoverageNotProven,
                f"event {owed.id!r} at position {owed.position}, witnessed in an earlier "
                f"response to this cursor that made no progress for {idle / 1000:.1f} s, "
                "is missing from the retry, a shorter page: fetch pages as long as that "
                "response's, or reset from a stable boundary",
                "witnessed_event_missing",
                Recovery.STABLE_BOUNDARY,
            ),
        )
    if kind is Classification.TOKEN_ROTATION and not contract.rotation_allowed:
        return stop(
            rules.diverge(
                RotationNotAllowed,
                "a retry returned the same events with a new successor, and the contract "
                "does not allow token rotation",
                "rotation_not_allowed",
                Recovery.STABLE_BOUNDARY,
            )
        )
    # Within the retry's reach first (the named reason), then beyond its last position.
    error = rules.witnessed_missing(beyond=False)
    if error is None and (
        kind is Classification.SHIFTED_PAGE
        and not empty
        and contract.positions == "sparse"
        and not rules.sparse_anchor()
    ):
        error = rules.diverge(
            CoverageNotProven,
            "a retry returned other events at sparse positions with no coverage marker "
            "and no overlap with applied events: nothing proves it covers the next "
            "required position",
            "sparse_unproven",
            Recovery.STABLE_BOUNDARY,
        )
    error = error or rules.witnessed_missing()
    if error is not None:
        return stop(error)
    return Decision(kind, rules.next_boundary(), resume=resume)
