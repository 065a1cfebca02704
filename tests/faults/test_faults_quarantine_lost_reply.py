"""A quarantine write whose reply was lost (SPEC 3, 11): settle repeats the call, and what it
reports must be what happened. A trim cut after it ran deleted entries the repeat no longer
finds: the count must still say they were deleted, or an operator reconciling an export
with a trim ("exported 3, deleted 0") is told the evidence is still there."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from settle import Reserved, Settler
from settle._core import engine
from settle._core.keys import shard_of
from tests.faults.servers import cut_timeout, sync_client
from tests.faults.tcp_proxy import FaultyProxy
from tests.faults.test_faults_ambiguous import needle

pytestmark = [pytest.mark.faults]

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


@pytest.mark.asyncio
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


@pytest.mark.asyncio
async def test_a_trim_call_that_had_more_to_do_and_lost_its_reply_counts_what_it_deleted(
    api: Any, proxy: FaultyProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a call of a trim that examines its budget and leaves the rest to the
    next call ('more'): its reply is kept too, or the repeat resumes from the start and
    the first call's deletions go uncounted."""
    monkeypatch.setattr(engine, "_QUARANTINE_SCAN_BUDGET", 2)
    # All on shard 0 of 4, whose call is the trim's first: it examines 2 and says 'more'.
    ops = ["op-0", "op-5", "op-8"]
    assert {shard_of(op, 4) for op in ops} == {0}
    refs = [await _late(api, op, {"late": op}) for op in ops]
    for ref in refs:
        await api.quarantine.resolve(ref, note="checked: no second charge")
    proxy.cut(needle("quarantine_trim"), "after_request")  # type: ignore[arg-type]
    done = await api.quarantine.trim()
    assert proxy.fired == ["after_request"]
    assert await api.quarantine.list() == []
    assert (done.removed, done.unresolved) == (3, 0)


@pytest.mark.parametrize("at", ["after_request", "mid_reply"])
def test_evidence_quarantine_maxlen_pushed_out_is_said_when_the_reply_was_lost(
    proxy: FaultyProxy, namespace: str, at: str
) -> None:
    """quarantine_maxlen pushed an unresolved entry out in the call whose reply was lost:
    the repeat found its own entry written and answered 'nothing dropped', so the warning
    that evidence was deleted was never logged."""
    client = sync_client(proxy.port, cut_timeout(at))  # no other call times out
    settler = Settler(client, namespace=namespace, shards=1, quarantine_maxlen=1)
    try:
        first = settler.reserve("op", REQ, principal=WHO)
        assert isinstance(first, Reserved)
        settler.mark_provisional(first.reservation, reason="timeout")
        assert isinstance(settler.reserve("op", REQ, principal=WHO), Reserved)
        kept = settler.complete(first.reservation, {"late": 1}).quarantine_id
        proxy.cut(needle("complete"), at)  # type: ignore[arg-type]
        with capture_logs() as logs:
            late = settler.complete(first.reservation, {"late": 2})
        assert proxy.fired == [at]
        assert [e.ref for e in settler.quarantine.list()] == [late.quarantine_id] != [kept]
        dropped = [e for e in logs if e["event"] == "settle.quarantine.maxlen_dropped_unresolved"]
        assert [(e["dropped"], e["repeated"]) for e in dropped] == [(1, True)]
    finally:
        settler.close()
