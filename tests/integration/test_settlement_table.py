"""SPEC 2, the settlement table (complete / fail / mark_provisional) and renew: one test per
row, on the sync shell, the async shell and the model."""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import pytest

from settle import QuarantineKind, Reservation, State, Verdict
from settle.models import Action

pytestmark = pytest.mark.asyncio

REQ = {"amount": 1000, "currency": "EUR"}
WHO = "tenant:acme/user:42"


async def _reserved(api: Any, op: str = "op-1", **kw: Any) -> Reservation:
    r = await api.reserve(op, REQ, principal=WHO, **kw)
    return r.reservation  # type: ignore[no-any-return]


async def _assert_quarantined(
    api: Any, s: Any, kind: QuarantineKind, payload: bytes | None
) -> None:
    assert s.verdict is Verdict.QUARANTINED
    assert s.kind is kind
    entry = await api.quarantine.get(s.quarantine_id)
    assert entry.kind is kind
    assert entry.operation_id == s.operation_id
    if payload is not None:
        assert entry.payload.data == payload
    assert entry.payload.size == len(entry.payload.data)
    assert entry.payload.sha256 == hashlib.sha256(entry.payload.data).hexdigest()
    assert entry.action is s.action
    log = await api.attempts(s.operation_id)
    assert (log[-1].verdict, log[-1].detail) == ("quarantined", kind.value)


async def test_unknown_operation_is_quarantined(api: Any) -> None:
    ghost = Reservation(
        operation_id="never-reserved",
        fingerprint="0" * 64,
        fingerprint_version=1,
        binding=WHO,
        generation=7,
        attempt_id="late",
    )
    s = await api.complete(ghost, {"late": True})
    assert s.record is None
    await _assert_quarantined(api, s, QuarantineKind.UNKNOWN_OPERATION, b'{"late":true}')
    assert await api.get("never-reserved") is None
    entry = await api.quarantine.get(s.quarantine_id)
    assert entry.current is None
    assert entry.presented.generation == 7


@pytest.mark.parametrize("field", ["fingerprint", "binding"])
async def test_misbound_response_is_quarantined_without_revealing_the_record(
    api: Any, field: str
) -> None:
    r = await _reserved(api)
    forged = r.model_copy(update={field: "f" * 64 if field == "fingerprint" else "tenant:other"})
    before = await api.get("op-1")
    s = await api.complete(forged, {"x": 1})
    assert s.record is None  # a misbound caller never sees the record
    await _assert_quarantined(api, s, QuarantineKind.MISBOUND, b'{"x":1}')
    assert await api.get("op-1") == before


async def test_stale_generation_is_quarantined_and_changes_nothing(api: Any) -> None:
    old = await _reserved(api)
    await api.mark_provisional(old, reason="timeout")
    new = await _reserved(api)
    before = await api.get("op-1")
    s = await api.complete(old, {"late": "success"})
    await _assert_quarantined(api, s, QuarantineKind.STALE_GENERATION, b'{"late":"success"}')
    assert s.record == before  # the authoritative record, untouched
    assert s.record.generation == new.generation
    entry = await api.quarantine.get(s.quarantine_id)
    assert entry.current.generation == new.generation
    assert entry.presented.generation == old.generation


async def test_expected_version_mismatch_is_a_version_conflict(api: Any) -> None:
    r = await _reserved(api)
    await api.mark_provisional(r, reason="timeout")  # version 1 -> 2
    before = await api.get("op-1")
    s = await api.complete(r, {"v": 1}, expected_version=1)
    await _assert_quarantined(api, s, QuarantineKind.VERSION_CONFLICT, b'{"v":1}')
    assert await api.get("op-1") == before
    ok = await api.complete(r, {"v": 1}, expected_version=2)
    assert ok.verdict is Verdict.ACCEPTED


@pytest.mark.parametrize("provisional", [False, True])
async def test_complete_on_pending_or_provisional_is_accepted(api: Any, provisional: bool) -> None:
    r = await _reserved(api)
    if provisional:
        await api.mark_provisional(r, reason="timeout")
    s = await api.complete(r, {"receipt": "r1"})
    assert s.verdict is Verdict.ACCEPTED
    assert s.record.state is State.COMPLETED
    assert s.record.value() == {"receipt": "r1"}
    assert s.quarantine_id is None


@pytest.mark.parametrize("provisional", [False, True])
async def test_fail_on_pending_or_provisional_is_accepted(api: Any, provisional: bool) -> None:
    r = await _reserved(api)
    if provisional:
        await api.mark_provisional(r, reason="timeout")
    s = await api.fail(r, ValueError("card declined"))
    assert s.verdict is Verdict.ACCEPTED
    assert s.record.state is State.FAILED
    assert s.record.failure.message == "card declined"


async def test_mark_provisional_on_pending_is_accepted_with_reason(api: Any) -> None:
    r = await _reserved(api)
    s = await api.mark_provisional(r, reason="timeout")
    assert s.verdict is Verdict.ACCEPTED
    assert (s.record.state, s.record.reason, s.record.version) == (State.PROVISIONAL, "timeout", 2)


async def test_mark_provisional_on_provisional_updates_the_reason(api: Any) -> None:
    r = await _reserved(api)
    await api.mark_provisional(r, reason="timeout")
    s = await api.mark_provisional(r, reason="cancelled")
    assert s.verdict is Verdict.ACCEPTED
    assert (s.record.state, s.record.reason, s.record.version) == (
        State.PROVISIONAL,
        "cancelled",
        3,
    )


async def test_the_same_uncertainty_reported_again_is_absorbed(api: Any) -> None:
    r = await _reserved(api)
    first = await api.mark_provisional(r, reason="timeout", expected_version=1)
    again = await api.mark_provisional(r, reason="timeout", expected_version=1)
    assert again.verdict is Verdict.ABSORBED
    assert again.record == first.record
    assert await api.quarantine.list() == []


@pytest.mark.parametrize(
    "settler_options",
    [{}, {"attempt_log_size": 2}],  # the default log, and the shortest one allowed
    ids=["default-log", "shortest-log"],
)
async def test_an_accepted_mark_provisional_repeated_after_a_takeover_is_absorbed(
    api: Any,
) -> None:
    """Its first reply was lost; the repeat arrives after another attempt took over (the
    takeover's entry is the log's newest, the accepted one just before it)."""
    old = await _reserved(api)
    await api.mark_provisional(old, reason="timeout")
    new = await _reserved(api)
    again = await api.mark_provisional(old, reason="timeout")
    assert again.verdict is Verdict.ABSORBED
    assert again.record.generation == new.generation
    assert await api.quarantine.list() == []
    # A stale attempt that never had one accepted is still quarantined.
    other = await api.mark_provisional(new.model_copy(update={"generation": 1}), reason="x")
    assert other.kind is QuarantineKind.STALE_GENERATION


async def test_owner_completing_after_its_lease_passed_but_before_takeover_is_accepted(
    api: Any,
) -> None:
    r = await _reserved(api, lease=0.05)
    await asyncio.sleep(0.08)
    s = await api.complete(r, {"late": "but still the owner"})
    assert s.verdict is Verdict.ACCEPTED
    assert s.record.state is State.COMPLETED


@pytest.mark.parametrize("terminal", ["complete", "fail"])
async def test_duplicate_of_the_same_settlement_is_absorbed(api: Any, terminal: str) -> None:
    r = await _reserved(api)
    first = await getattr(api, terminal)(r, {"same": "payload"})
    again = await getattr(api, terminal)(r, {"same": "payload"})
    assert again.verdict is Verdict.ABSORBED
    assert again.record == first.record
    # also when the duplicate carries the version it saw before the first settlement
    third = await getattr(api, terminal)(r, {"same": "payload"}, expected_version=1)
    assert third.verdict is Verdict.ABSORBED
    assert await api.quarantine.list() == []


@pytest.mark.parametrize(
    ("first", "second"),
    [("complete", "complete"), ("complete", "fail"), ("fail", "fail"), ("fail", "complete")],
)
async def test_different_result_or_other_terminal_action_conflicts(
    api: Any, first: str, second: str
) -> None:
    r = await _reserved(api)
    done = await getattr(api, first)(r, {"n": 1})
    s = await getattr(api, second)(r, {"n": 2})
    await _assert_quarantined(api, s, QuarantineKind.CONFLICTING_SETTLEMENT, None)
    entry = await api.quarantine.get(s.quarantine_id)
    assert b'"n":2' in entry.payload.data  # the rejected response is kept as evidence...
    assert s.record == done.record  # ...and never merged into the record


@pytest.mark.parametrize("terminal", ["complete", "fail"])
async def test_mark_provisional_never_downgrades_a_terminal_record(api: Any, terminal: str) -> None:
    r = await _reserved(api)
    done = await getattr(api, terminal)(r, {"n": 1})
    s = await api.mark_provisional(r, reason="timeout")
    assert s.verdict is Verdict.ABSORBED
    assert s.action is Action.MARK_PROVISIONAL
    assert await api.get("op-1") == done.record


async def test_every_settlement_call_is_observed_in_the_capped_attempt_log(api: Any) -> None:
    r = await _reserved(api)
    await api.mark_provisional(r, reason="timeout")
    await api.complete(r, {"n": 1})
    await api.complete(r, {"n": 1})
    await api.complete(r, {"n": 2})
    log = await api.attempts("op-1")
    assert [(o.action, o.verdict) for o in log] == [
        ("reserve", "reserved"),
        ("mark_provisional", "accepted"),
        ("complete", "accepted"),
        ("complete", "absorbed"),
        ("complete", "quarantined"),
    ]
    assert {o.generation for o in log} == {r.generation}
    assert {o.attempt_id for o in log} == {r.attempt_id}


async def test_renew_extends_a_live_lease(api: Any) -> None:
    # The renewal must come within the first lease: at 0.2 s a loaded CI worker could hold
    # the test past it, and the renewal was lost (lease_expired). The wait is then for the
    # end of the first lease, which began before ``lapsed`` was taken.
    r = await _reserved(api, lease=1.5)
    lapsed = time.monotonic() + 1.5 + 0.05
    renewal = await api.renew(r, lease=30)
    assert renewal.renewed
    await asyncio.sleep(max(0.0, lapsed - time.monotonic()))
    rec = await api.get("op-1")
    assert rec.state is State.PENDING
    assert rec.version == 1  # a heartbeat is not a transition


@pytest.mark.parametrize("why", ["lease_expired", "stale_generation", "not_pending", "misbound"])
async def test_renew_reports_lost_and_quarantines_nothing(api: Any, why: str) -> None:
    r = await _reserved(api, lease=0.05 if why == "lease_expired" else 30)
    if why == "lease_expired":
        await asyncio.sleep(0.08)
    elif why == "stale_generation":
        await api.mark_provisional(r, reason="timeout")
        await _reserved(api)
    elif why == "not_pending":
        await api.complete(r, {"n": 1})
    else:
        r = r.model_copy(update={"binding": "tenant:other"})
    renewal = await api.renew(r, lease=30)
    assert not renewal.renewed
    assert renewal.reason == why
    assert await api.quarantine.list() == []
    # Only a lease that passed with the record still at this attempt's generation lapsed
    # (nobody took the key over: settle's heartbeats let the attempt run on); an attempt
    # of another generation, or a record taken over, settled or of another caller, is lost.
    assert renewal.lapsed(r.generation) is (why == "lease_expired")
    assert not renewal.lapsed(r.generation + 1)
