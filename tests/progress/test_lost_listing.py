"""Which listed deliveries may be taken for lost (sans-I/O, the core's own rule): only those
the group handed out, not pending, and within what the pending listing proves."""

from __future__ import annotations

from settle.progress import DeliveryId
from settle.progress._core import ProgressCore


def listing(*ids: str) -> list[tuple[bytes, dict[bytes, bytes]]]:
    return [(i.encode(), {b"emission_id": b"x"}) for i in ids]


def rows(*ids: str) -> list[dict[str, object]]:
    return [{"message_id": i.encode(), "times_delivered": 1} for i in ids]


def test_only_delivered_and_not_pending_entries_are_candidates() -> None:
    got = ProgressCore.lost_candidates(
        listing("1-0", "2-0", "3-0", "4-0"), DeliveryId("3-0"), rows("2-0"), 512
    )
    assert got == [DeliveryId("1-0"), DeliveryId("3-0")]  # 4-0 was never handed out


def test_a_pending_listing_cut_at_its_limit_proves_nothing_past_its_last_row() -> None:
    got = ProgressCore.lost_candidates(
        listing("1-0", "2-0", "3-0", "4-0"), DeliveryId("4-0"), rows("1-0", "2-0"), 2
    )
    assert got == []  # 3-0 and 4-0 may be pending beyond the cut


def test_nothing_is_lost_before_the_group_delivered_anything() -> None:
    assert ProgressCore.lost_candidates(listing("1-0"), None, [], 512) == []
