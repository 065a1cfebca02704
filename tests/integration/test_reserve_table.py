"""SPEC 2, the reserve table: one test per row, on the sync shell, the async shell and the model."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from settle import (
    BindingMismatch,
    FingerprintMismatch,
    InProgress,
    Replay,
    Reserved,
    State,
)
from settle._core.keys import shard_of
from settle._core.reference import MemoryKeyspace
from settle.testing import ManualClock, MemorySettler

pytestmark = pytest.mark.asyncio

REQ = {"amount": 1000, "currency": "EUR", "card": "tok_visa"}
WHO = "tenant:acme/user:42"
SHORT = 0.05  # seconds; tests wait past it to let a lease pass on the server clock


async def _snapshot(api: Any, op: str) -> tuple[Any, Any]:
    return await api.get(op), await api.attempts(op)


async def test_none_reserves_a_new_pending_record_at_version_1(api: Any) -> None:
    r = await api.reserve("op-1", REQ, principal=WHO, lease=30)
    assert isinstance(r, Reserved)
    assert r.takeover is None
    rec = await api.get("op-1")
    assert rec.state is State.PENDING
    assert rec.version == 1
    assert rec.generation == r.reservation.generation >= 1
    assert rec.binding == WHO
    assert rec.fingerprint == r.reservation.fingerprint
    assert rec.reservations == 1


@pytest.mark.parametrize("state", ["none", "pending", "completed"])
async def test_changed_fingerprint_raises_and_writes_nothing(api: Any, state: str) -> None:
    if state != "none":
        r = await api.reserve("op-1", REQ, principal=WHO)
        if state == "completed":
            await api.complete(r.reservation, {"ok": True})
        before = await _snapshot(api, "op-1")
        with pytest.raises(FingerprintMismatch) as info:
            await api.reserve("op-1", {**REQ, "amount": 1001}, principal=WHO)
        assert info.value.operation_id == "op-1"
        assert await _snapshot(api, "op-1") == before
    else:
        # With no record there is nothing to mismatch: a new request simply reserves.
        assert isinstance(await api.reserve("op-1", REQ, principal=WHO), Reserved)


@pytest.mark.parametrize("state", ["pending", "completed", "failed"])
async def test_changed_principal_raises_and_writes_nothing(api: Any, state: str) -> None:
    r = await api.reserve("op-1", REQ, principal=WHO)
    if state == "completed":
        await api.complete(r.reservation, {"secret": "receipt"})
    elif state == "failed":
        await api.fail(r.reservation, ValueError("declined"))
    before = await _snapshot(api, "op-1")
    with pytest.raises(BindingMismatch) as info:
        await api.reserve("op-1", REQ, principal="tenant:evil/user:1")
    assert "secret" not in str(info.value)
    assert await _snapshot(api, "op-1") == before


async def test_completed_replays_the_stored_result_and_writes_nothing(api: Any) -> None:
    r = await api.reserve("op-1", REQ, principal=WHO)
    await api.complete(r.reservation, {"receipt": "rcpt_1", "amount": 1000})
    before = await _snapshot(api, "op-1")
    replay = await api.reserve("op-1", REQ, principal=WHO)
    assert isinstance(replay, Replay)
    assert replay.completed
    assert replay.value() == {"receipt": "rcpt_1", "amount": 1000}
    assert await _snapshot(api, "op-1") == before


async def test_failed_replays_the_stored_failure_and_writes_nothing(api: Any) -> None:
    r = await api.reserve("op-1", REQ, principal=WHO)
    await api.fail(r.reservation, ValueError("card declined"))
    before = await _snapshot(api, "op-1")
    replay = await api.reserve("op-1", REQ, principal=WHO)
    assert isinstance(replay, Replay)
    assert not replay.completed
    assert replay.failure.error_type == "builtins.ValueError"
    assert replay.failure.message == "card declined"
    assert await _snapshot(api, "op-1") == before


async def test_live_pending_reports_in_progress_with_owner_and_lease(api: Any) -> None:
    r = await api.reserve("op-1", REQ, principal=WHO, lease=30)
    before = await _snapshot(api, "op-1")
    other = await api.reserve("op-1", REQ, principal=WHO, lease=30)
    assert isinstance(other, InProgress)
    assert other.generation == r.reservation.generation
    assert other.lease_expires_at == r.record.lease_expires_at
    assert await _snapshot(api, "op-1") == before


async def test_same_attempt_asking_again_gets_its_reservation_back(api: Any) -> None:
    first = await api.reserve("op-1", REQ, principal=WHO, attempt_id="a1")
    again = await api.reserve("op-1", REQ, principal=WHO, attempt_id="a1")
    assert isinstance(again, Reserved)
    assert again.reservation == first.reservation
    assert (await api.get("op-1")).version == 1


async def test_passed_lease_is_taken_over_with_a_new_generation(api: Any) -> None:
    old = await api.reserve("op-1", REQ, principal=WHO, lease=SHORT)
    await asyncio.sleep(SHORT + 0.03)
    rec = await api.get("op-1")
    assert rec.state is State.PROVISIONAL
    assert rec.reason == "lease_expired"
    new = await api.reserve("op-1", REQ, principal=WHO, lease=30)
    assert isinstance(new, Reserved)
    assert new.takeover == "lease_expired"
    assert new.reservation.generation > old.reservation.generation
    assert new.record.state is State.PENDING
    assert new.record.version == 2
    log = await api.attempts("op-1")
    assert [(o.action, o.detail) for o in log] == [("reserve", "new"), ("reserve", "lease_expired")]


async def test_provisional_is_reserved_again_under_a_new_generation(api: Any) -> None:
    old = await api.reserve("op-1", REQ, principal=WHO)
    await api.mark_provisional(old.reservation, reason="timeout")
    new = await api.reserve("op-1", REQ, principal=WHO)
    assert isinstance(new, Reserved)
    assert new.takeover == "provisional"
    assert new.reservation.generation > old.reservation.generation
    rec = await api.get("op-1")
    assert rec.state is State.PENDING
    assert rec.reason is None
    assert rec.reservations == 2


async def test_no_two_operations_get_the_same_generation_in_a_namespace(api: Any) -> None:
    """SPEC §1: a generation is never issued twice in a namespace, whichever shard issues
    it; reserves in quick succession land on every shard within the same millisecond. The
    model issued each shard's clock-based number as it was: shards reserving in the same
    millisecond got the same generation (8 distinct of 40), where Redis never does."""
    reserved = [await api.reserve(f"op-{i}", REQ, principal=WHO) for i in range(40)]
    generations = [r.reservation.generation for r in reserved]
    assert len(set(generations)) == len(generations)


async def test_the_model_issues_distinct_generations_with_a_clock_that_does_not_move() -> None:
    """As one server runs one script at a time, each at a later microsecond, the model's
    shards never issue the same generation, even with a ManualClock never advanced; each
    shard's generations still strictly increase."""
    settler = MemorySettler(namespace="frozen-clock", shards=8, clock=ManualClock())
    by_shard: dict[int, list[int]] = {}
    for i in range(64):
        r = settler.reserve(f"op-{i}", REQ, principal=WHO)
        assert isinstance(r, Reserved)
        by_shard.setdefault(shard_of(f"op-{i}", 8), []).append(r.reservation.generation)
    issued = [g for gens in by_shard.values() for g in gens]
    assert len(set(issued)) == 64
    assert len(by_shard) > 1
    for gens in by_shard.values():
        assert gens == sorted(gens)


async def test_the_model_never_reissues_a_generation_past_a_thousand_calls_in_a_millisecond() -> (
    None
):
    """A ManualClock never advanced: the model's microseconds went back to the millisecond's
    first after its 1000th call, and its shards then issued again the generations they had
    issued (1195 distinct of 2500 reserves). A real server's clock never goes back, and a
    user's unit test may reserve thousands of operations without advancing the clock."""
    clock = ManualClock()
    settler = MemorySettler(namespace="frozen-clock", shards=8, clock=clock)
    issued: list[int] = []
    for i in range(2500):
        r = settler.reserve(f"op-{i}", REQ, principal=WHO)
        assert isinstance(r, Reserved)
        issued.append(r.reservation.generation)
    assert len(set(issued)) == len(issued)
    clock.advance(0.001)  # the clock moves on: generations go on above every one issued
    r = settler.reserve("op-after", REQ, principal=WHO)
    assert isinstance(r, Reserved)
    assert r.reservation.generation > max(issued)


async def test_the_model_s_microseconds_go_back_when_its_clock_steps_back() -> None:
    """As a real server's TIME: a clock stepped back gives the earlier microseconds (the
    quarantine orders entries by them), while each shard's generations still increase."""
    clock = ManualClock()
    keyspace = MemoryKeyspace(clock)
    settler = MemorySettler(namespace="stepped-back", shards=1, keyspace=keyspace)
    first = settler.reserve("op-a", REQ, principal=WHO)
    clock.advance(-0.5)
    second = settler.reserve("op-b", REQ, principal=WHO)
    assert isinstance(first, Reserved)
    assert isinstance(second, Reserved)
    assert second.reservation.generation == first.reservation.generation + 1
    assert keyspace.next_us(clock.now_ms) == clock.now_ms * 1000 + 1
