"""A quarantine write whose reply was lost (SPEC 3, 11): settle repeats the call, and what it
reports must be what happened. A trim cut after it ran deleted entries the repeat no longer
finds: the count must still say they were deleted, or an operator reconciling an export
with a trim ("exported 3, deleted 0") is told the evidence is still there."""

from __future__ import annotations

from typing import Any

import pytest

from settle import Reserved
from tests.faults.tcp_proxy import FaultyProxy
from tests.faults.test_faults_ambiguous import needle

pytestmark = [pytest.mark.asyncio, pytest.mark.faults]

REQ = {"amount": 1000}
WHO = "tenant:acme"


async def _late(api: Any, op: str, late: Any) -> str:
    """A stale worker's late completion of ``op``: quarantined; its ref."""
    first = await api.reserve(op, REQ, principal=WHO)
    assert isinstance(first, Reserved)
    await api.mark_provisional(first.reservation, reason="timeout")
    assert isinstance(await api.reserve(op, REQ, principal=WHO), Reserved)
    ref = (await api.complete(first.reservation, late)).quarantine_id
    assert ref
    return str(ref)


@pytest.mark.parametrize("at", ["after_request", "mid_reply", "stall"])
async def test_a_trim_whose_reply_was_lost_counts_what_it_deleted(
    api: Any, proxy: FaultyProxy, at: str
) -> None:
    refs = [await _late(api, f"op-{i}", {"late": i}) for i in range(3)]
    for ref in refs:
        await api.quarantine.resolve(ref, note="checked: no second charge")
    proxy.cut(needle("quarantine_trim"), at)  # type: ignore[arg-type]
    done = await api.quarantine.trim()
    assert proxy.fired == [at]
    assert await api.quarantine.list() == []
    assert (done.removed, done.unresolved) == (3, 0)
