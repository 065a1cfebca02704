"""The classification rules on their own (no Redis, no HTTP): one case per row of the table
in docs/cursor-checkpoints.md."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from settle.cursor import (
    Checkpoint,
    Coverage,
    CoverageNotProven,
    CursorDivergence,
    EmptyPageSemantics,
    Event,
    Page,
    ProviderContract,
    Receipt,
    Witness,
)
from settle.cursor._classify import View, classify
from settle.cursor.errors import ReceiptConflict, RotationNotAllowed
from settle.cursor.models import Classification, Disposition, Recovery, WitnessEvent

NOW = datetime(2026, 1, 1, tzinfo=UTC)
NOW_MS = int(NOW.timestamp() * 1000)
G = 9
#: ``stand_down_for`` in these cases (ms): a minute.
STAND_DOWN_MS = 60_000


def ev(i: int, payload: object = None) -> Event:
    return Event(f"e{i}", i, {"v": i} if payload is None else payload)


def receipt(e: Event, generation: int = G - 1) -> Receipt:
    return Receipt(
        event_id=e.id,
        position=e.position,
        digest=e.digest,
        generation=generation,
        attempt_id="a",
        outcome="applied",
        at=NOW,
    )


def witness(events: list[Event], successor: bytes, aid: str = "w1", **kw: object) -> Witness:
    fields: dict[str, object] = {
        "attempt_id": aid,
        "generation": G,
        "input_cursor": b"C41",
        "input_digest": "d",
        "events": tuple(
            WitnessEvent(id=e.id, position=e.position, digest=e.digest) for e in events
        ),
        "successor": successor,
        "successor_digest": "s",
        "snapshot": None,
        "coverage": None,
        "classification": Classification.FIRST,
        "next_boundary": 0,
        "disposition": Disposition.PENDING,
        "reason": "",
        "created_at": NOW,
        "updated_at": NOW,
    }
    fields.update(kw)
    return Witness(**fields)


def view(boundary: int, witnesses=(), receipts=(), now_ms: int = NOW_MS) -> View:
    ck = Checkpoint(
        stream="s",
        cursor=b"C41",
        cursor_digest="d",
        generation=G,
        boundary=boundary,
        created_at=NOW,
        updated_at=NOW,
        promoted_witness=None,
    )
    return View(ck, tuple(witnesses), {r.event_id: r for r in receipts}, now_ms)


def run(v: View, page: Page, **contract: object):
    return classify("s", ProviderContract(**contract), v, page, STAND_DOWN_MS)


def test_first_response() -> None:
    d = run(view(500), Page([ev(501), ev(502)], b"N7"))
    assert (d.classification, d.next_boundary, d.error) == (Classification.FIRST, 502, None)


def test_exact_replay_resumes_the_witness() -> None:
    v = view(500, [witness([ev(501), ev(502)], b"N7")], [receipt(ev(501), G)])
    d = run(v, Page([ev(501), ev(502)], b"N7"))
    assert (d.classification, d.resume) == (Classification.EXACT_REPLAY, "w1")


def test_token_rotation_needs_the_contract() -> None:
    v = view(500, [witness([ev(501), ev(502)], b"N7")])
    allowed = run(v, Page([ev(501), ev(502)], b"N8"), rotation_allowed=True)
    assert allowed.classification is Classification.TOKEN_ROTATION
    refused = run(v, Page([ev(501), ev(502)], b"N8"))
    assert isinstance(refused.error, RotationNotAllowed)


def test_shifted_page_overlapping_its_receipts() -> None:
    v = view(500, [witness([ev(501), ev(502)], b"N7")], [receipt(ev(501), G)])
    d = run(v, Page([ev(501), ev(502), ev(503)], b"N8"))
    assert (d.classification, d.next_boundary) == (Classification.SHIFTED_PAGE, 503)


def test_changed_payload_against_a_receipt() -> None:
    v = view(500, [], [receipt(ev(501), G)])
    d = run(v, Page([ev(501, {"v": "changed"})], b"N"))
    assert isinstance(d.error, ReceiptConflict)
    assert (d.error.reason, d.error.recovery) == ("changed_payload", Recovery.FRESH_SNAPSHOT)


def test_moved_position_and_taken_position() -> None:
    v = view(500, [], [receipt(ev(501), G)])
    moved = run(v, Page([Event("e501", 502, {"v": 501})], b"N"))
    assert moved.error is not None
    assert moved.error.reason == "changed_position"
    taken = run(v, Page([Event("other", 501, {"v": 1})], b"N"))
    assert taken.error is not None
    assert taken.error.reason == "position_taken"


def test_unknown_event_below_the_boundary() -> None:
    d = run(view(500), Page([ev(499), ev(501)], b"N"), positions="sparse")
    assert isinstance(d.error, CoverageNotProven)
    assert d.error.reason == "below_boundary"


def test_dense_gap_unless_a_coverage_marker_attests_it() -> None:
    gap = run(view(500), Page([ev(502)], b"N"))
    assert gap.error is not None
    assert gap.error.reason == "gap"
    covered = run(
        view(500), Page([ev(502)], b"N", coverage=Coverage(500, 502)), coverage_watermarks=True
    )
    assert covered.error is None
    assert covered.next_boundary == 502


def test_witnessed_event_missing_from_a_retry() -> None:
    v = view(500, [witness([ev(501), ev(502)], b"N7")])
    d = run(v, Page([ev(501), ev(503)], b"N8"), positions="sparse")
    assert d.error is not None
    assert d.error.reason == "witnessed_event_missing"


def test_sparse_shift_needs_an_anchor_or_coverage() -> None:
    v = view(500, [witness([ev(510)], b"N7")])
    unproven = run(v, Page([ev(505), ev(510)], b"N8"), positions="sparse")
    assert unproven.error is not None
    assert unproven.error.reason == "sparse_unproven"
    anchored = view(500, [witness([ev(510)], b"N7")], [receipt(ev(500))])
    ok = run(anchored, Page([ev(500), ev(505), ev(510)], b"N8"), positions="sparse")
    assert ok.classification is Classification.SHIFTED_PAGE
    assert ok.error is None
    marker = run(
        v,
        Page([ev(505), ev(510)], b"N8", coverage=Coverage(500, 510)),
        positions="sparse",
        coverage_watermarks=True,
    )
    assert marker.error is None


def test_inclusive_page_must_repeat_the_boundary_event() -> None:
    v = view(500, [], [receipt(ev(500))])
    ok = run(v, Page([ev(500), ev(501)], b"N"), boundary="inclusive")
    assert ok.error is None
    missing = run(v, Page([ev(501)], b"N"), boundary="inclusive")
    assert missing.error is not None
    assert missing.error.reason == "boundary_event_missing"


def test_stable_snapshot_that_changed() -> None:
    v = view(500, [witness([ev(501)], b"N7", snapshot="snap")])
    d = run(v, Page([ev(501), ev(502)], b"N8", snapshot="snap"), stable_snapshots=True)
    assert type(d.error) is CursorDivergence
    assert (d.error.reason, d.error.recovery) == ("snapshot_changed", Recovery.FRESH_SNAPSHOT)
    other = run(v, Page([ev(501), ev(502)], b"N8", snapshot="snap2"), stable_snapshots=True)
    assert other.error is None


@pytest.mark.parametrize(
    ("page", "contract", "held", "boundary"),
    [
        (Page([], b"N"), {}, True, 500),
        (Page([], b"N", coverage=Coverage(500, 520)), {"coverage_watermarks": True}, False, 520),
        (Page([], b"N", coverage=Coverage(510, 520)), {"coverage_watermarks": True}, True, 500),
        (Page([], b"N", snapshot="s"), {"stable_snapshots": True}, False, 500),
        (Page([], b"N", snapshot="s"), {}, True, 500),
        (Page([], b"N"), {"empty_page": EmptyPageSemantics.CAUGHT_UP}, False, 500),
        (Page([], b"N"), {"positions": "sparse"}, True, 500),
    ],
    ids=[
        "no-evidence",
        "watermark",
        "watermark-not-reaching-the-boundary",
        "stable-snapshot",
        "snapshot-without-the-contract",
        "documented-semantics",
        "sparse-positions-alone",
    ],
)
def test_empty_pages_advance_only_with_evidence(page, contract, held, boundary) -> None:
    d = run(view(500), page, **contract)
    assert d.held is held
    assert d.error is None
    assert d.next_boundary == boundary


def test_a_repeated_divergent_response_reuses_its_witness() -> None:
    bad = Page([ev(502)], b"N")
    first = run(view(500), bad)
    assert first.resume is None
    seen = witness(
        [ev(502)],
        b"N",
        aid="w9",
        classification=Classification.DIVERGENT,
        disposition=Disposition.ABANDONED,
    )
    again = run(view(500, [seen]), bad)
    assert again.error is not None
    assert again.resume == "w9"


def test_an_empty_retry_without_evidence_holds_even_after_a_witnessed_page() -> None:
    # Found by the stateful test: a crash before e1's effect, then a lagging replica
    # answers the retry with nothing. That proves nothing either way: hold, do not stop.
    v = view(0, [witness([ev(1)], b"N7")])
    d = run(v, Page([], b"N-head"))
    assert d.held
    assert d.error is None
    with_marker = run(v, Page([], b"N-head", coverage=Coverage(0, 1)), coverage_watermarks=True)
    assert with_marker.error is None  # the marker attests e1 is gone
    assert with_marker.next_boundary == 1
    documented = run(v, Page([], b"N-head"), empty_page=EmptyPageSemantics.CAUGHT_UP)
    assert documented.error is not None
    assert documented.error.reason == "witnessed_event_missing"


@pytest.mark.parametrize("idle_ms", [0, STAND_DOWN_MS - 1])
def test_a_shorter_copy_of_a_moving_pending_response_stands_down(idle_ms: int) -> None:
    """The other worker saw more, or a lagging replica truncated the retry: the full
    response goes on (LOST), nothing is witnessed."""
    v = view(500, [witness([ev(501), ev(502), ev(503)], b"N7")], now_ms=NOW_MS + idle_ms)
    d = run(v, Page([ev(501), ev(502)], b"N5"))
    assert (d.lost, d.error) == ("w1", None)


def test_a_shorter_copy_of_a_pending_response_that_stopped_moving_stops_the_stream() -> None:
    """Its worker died and the provider now answers shorter pages (a smaller page size):
    no retry would ever finish that response, so standing down would hold the stream
    silently for good. The stream stops, naming the recovery."""
    v = view(500, [witness([ev(501), ev(502), ev(503)], b"N7")], now_ms=NOW_MS + STAND_DOWN_MS)
    d = run(v, Page([ev(501), ev(502)], b"N5"))
    assert d.lost is None
    assert isinstance(d.error, CoverageNotProven)
    assert (d.error.reason, d.error.recovery) == (
        "witnessed_event_missing",
        Recovery.STABLE_BOUNDARY,
    )
    assert "'e503' at position 503" in str(d.error)
    assert d.classification is Classification.DIVERGENT


def test_a_receipt_of_the_pending_response_counts_as_its_progress() -> None:
    """A slow worker applying a long page writes a receipt per event: while they come, a
    shorter copy stands down, however old the response itself is."""
    w = witness([ev(501), ev(502), ev(503)], b"N7")
    late = receipt(ev(501), G).model_copy(
        update={"at": datetime.fromtimestamp((NOW_MS + STAND_DOWN_MS) / 1000, UTC)}
    )
    v = view(500, [w], [late], now_ms=NOW_MS + STAND_DOWN_MS + 10)
    assert run(v, Page([ev(501), ev(502)], b"N5")).lost == "w1"
    v = view(500, [w], [late], now_ms=NOW_MS + 2 * STAND_DOWN_MS)
    assert isinstance(run(v, Page([ev(501), ev(502)], b"N5")).error, CoverageNotProven)
