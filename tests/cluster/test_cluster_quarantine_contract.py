"""The core contract suite for SPEC 3 (quarantine list, filters, get, resolve, follow, the
payload cap), run unchanged against the Redis Cluster of ``conftest.py``."""

from __future__ import annotations

import pytest

from tests.integration.test_quarantine import (
    test_follow_sync_in_a_thread,
    test_follow_yields_entries_written_after_it_started,
    test_get_and_resolve_unknown_ids_raise_typed_errors,
    test_list_filters_by_kind_operation_and_resolution,
    test_list_filters_by_time,
    test_payload_is_capped_with_full_size_and_digest,
    test_resolve_keeps_the_evidence_and_the_first_note,
)

pytestmark = [pytest.mark.cluster]

__all__ = [
    "test_follow_sync_in_a_thread",
    "test_follow_yields_entries_written_after_it_started",
    "test_get_and_resolve_unknown_ids_raise_typed_errors",
    "test_list_filters_by_kind_operation_and_resolution",
    "test_list_filters_by_time",
    "test_payload_is_capped_with_full_size_and_digest",
    "test_resolve_keeps_the_evidence_and_the_first_note",
]
