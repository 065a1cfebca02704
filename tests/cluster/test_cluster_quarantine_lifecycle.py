"""The quarantine's lifecycle (trim, its reply kept for a repeat in the shard's
``quarantine:trimmed`` key, quarantine_maxlen making room and saying what it dropped), run
unchanged against the Redis Cluster of ``conftest.py``: every key a trim or a capped write
touches shares the shard's hash tag (no CROSSSLOT)."""

from __future__ import annotations

import pytest

from tests.integration.test_quarantine_lifecycle import (
    make,
    test_a_repeat_of_a_write_that_pushed_evidence_out_says_it_again,
    test_quarantine_maxlen_drops_the_oldest_with_their_resolutions_and_warns,
    test_trim_deletes_resolved_entries_and_keeps_unresolved_evidence,
)

pytestmark = [pytest.mark.cluster]

__all__ = [
    "make",
    "test_a_repeat_of_a_write_that_pushed_evidence_out_says_it_again",
    "test_quarantine_maxlen_drops_the_oldest_with_their_resolutions_and_warns",
    "test_trim_deletes_resolved_entries_and_keeps_unresolved_evidence",
]
