"""Writing quarantine evidence with the Python API, for the CLI to read."""

from __future__ import annotations

import time

from settle import Reserved, Settler


def stale_settlement(settler: Settler, operation_id: str) -> str:
    """A late response of an old generation after a takeover: returns its quarantine id."""
    first = settler.reserve(operation_id, {"amount": 1250}, principal="tenant:acme", lease=0.05)
    assert isinstance(first, Reserved)
    time.sleep(0.1)  # the first attempt's lease passes
    second = settler.reserve(operation_id, {"amount": 1250}, principal="tenant:acme", lease=5)
    assert isinstance(second, Reserved)
    settler.complete(second.reservation, {"charge_id": "ch_new"})
    late = settler.complete(first.reservation, {"charge_id": "ch_late"})
    assert late.quarantine_id is not None
    return late.quarantine_id
