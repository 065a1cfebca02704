"""Ambiguous failures (SPEC 11): a connection cut after a script was sent leaves the caller
not knowing whether it ran. settle repeats the call (tenacity, transient errors only, same
attempt id and arguments), and repeating is safe: a settlement that already ran is ABSORBED,
never applied twice or quarantined; a reserve that already ran gives its reservation back.

Every test goes through ``FaultyProxy`` with redis-py's own retries off, checks that the
fault struck, and reads the record, the attempt log and the quarantine back.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

from settle import BackendError, QuarantineKind, Reserved, Settler, State, Verdict
from settle._core.scripts import SCRIPTS, source
from settle._runtime.transient import ATTEMPTS
from settle.models import StoredFailure
from tests.faults.servers import script_needle
from tests.faults.tcp_proxy import FaultyProxy

pytestmark = [pytest.mark.asyncio, pytest.mark.faults]

REQ = {"amount": 1000, "currency": "EUR"}
WHO = "tenant:acme"
RESULT = {"charge": "ch_1", "amount": 1000}


def sha(script: str) -> str:
    return hashlib.sha1(source(script).encode()).hexdigest()


def needle(script: str) -> tuple[str, str]:
    """A proxy cut's needle for ``script`` on either path (EVALSHA or FCALL)."""
    return script_needle(SCRIPTS, script)


def _retries(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "settle.backend.retrying"]


async def _log(api: Any, op: str) -> list[tuple[str, str]]:
    return [(a.action, a.verdict) for a in await api.attempts(op)]


@pytest.mark.parametrize("at", ["after_request", "mid_reply", "stall"])
@pytest.mark.parametrize("action", ["complete", "fail"])
async def test_a_settlement_whose_reply_was_lost_is_absorbed_not_applied_twice(
    api: Any, proxy: FaultyProxy, at: str, action: str
) -> None:
    r = (await api.reserve("op", REQ, principal=WHO)).reservation
    payload = (
        RESULT if action == "complete" else StoredFailure(error_type="CardDeclined", message="no")
    )
    proxy.cut(needle(action), at)  # type: ignore[arg-type]
    with capture_logs() as logs:
        settlement = await getattr(api, action)(r, payload)
    assert proxy.fired == [at]
    assert settlement.verdict is Verdict.ABSORBED  # the lost first try ran; the repeat did not
    retry = _retries(logs)
    assert [(e["script"], e["attempt_id"], e["attempt"]) for e in retry] == [
        (action, r.attempt_id, 1)
    ]
    record = await api.get("op")
    assert record.state is (State.COMPLETED if action == "complete" else State.FAILED)
    assert record.version == 2  # reserve wrote version 1, the settlement version 2, once
    assert record.generation == r.generation
    assert await _log(api, "op") == [
        ("reserve", "reserved"),
        (action, "accepted"),
        (action, "absorbed"),
    ]
    assert await api.quarantine.list() == []


@pytest.mark.parametrize("action", ["complete", "fail", "mark_provisional"])
async def test_a_request_cut_before_it_reached_the_server_runs_once_on_the_repeat(
    api: Any, proxy: FaultyProxy, action: str
) -> None:
    r = (await api.reserve("op", REQ, principal=WHO)).reservation
    proxy.cut(needle(action), "before_request")
    if action == "complete":
        settlement = await api.complete(r, RESULT)
    elif action == "fail":
        settlement = await api.fail(r, StoredFailure(error_type="CardDeclined", message="no"))
    else:
        settlement = await api.mark_provisional(r, reason="timeout")
    assert proxy.fired == ["before_request"]
    assert settlement.verdict is Verdict.ACCEPTED
    assert await _log(api, "op") == [("reserve", "reserved"), (action, "accepted")]
    assert (await api.get("op")).version == 2


@pytest.mark.parametrize("at", ["after_request", "before_request", "stall"])
async def test_a_reserve_whose_reply_was_lost_gets_its_own_reservation_back(
    api: Any, proxy: FaultyProxy, at: str
) -> None:
    proxy.cut(needle("reserve"), at)  # type: ignore[arg-type]
    reserved = await api.reserve("op", REQ, principal=WHO, attempt_id="attempt-1")
    assert proxy.fired == [at]
    assert isinstance(reserved, Reserved)
    assert reserved.reservation.attempt_id == "attempt-1"
    record = await api.get("op")
    assert record.state is State.PENDING
    assert record.generation == reserved.reservation.generation
    assert (record.version, record.reservations) == (1, 1)  # one reservation, not two
    assert await _log(api, "op") == [("reserve", "reserved")]
    # The reservation it got back is the live one: it settles normally.
    assert (await api.complete(reserved.reservation, RESULT)).verdict is Verdict.ACCEPTED
    # Another attempt (another attempt id) is still told the operation is taken.
    again = await api.reserve("op", REQ, principal=WHO, attempt_id="attempt-2")
    assert again.record.state is State.COMPLETED


async def test_a_repeated_mark_provisional_keeps_the_record_provisional(
    api: Any, proxy: FaultyProxy
) -> None:
    r = (await api.reserve("op", REQ, principal=WHO)).reservation
    proxy.cut(needle("mark_provisional"), "after_request")
    settlement = await api.mark_provisional(r, reason="timeout")
    assert proxy.fired == ["after_request"]
    # Today the repeat is ACCEPTED again (a provisional record takes the reason again);
    # never a quarantine, never a lost or changed outcome.
    assert settlement.verdict in (Verdict.ACCEPTED, Verdict.ABSORBED)
    record = await api.get("op")
    assert (record.state, record.reason) == (State.PROVISIONAL, "timeout")
    assert await api.quarantine.list() == []
    # The next attempt takes over under a new generation, exactly as without the fault.
    taken = await api.reserve("op", REQ, principal=WHO)
    assert taken.takeover == "provisional"
    assert taken.reservation.generation > r.generation


async def test_a_repeated_mark_provisional_with_expected_version_is_not_a_conflict(
    api: Any, proxy: FaultyProxy
) -> None:
    r = (await api.reserve("op", REQ, principal=WHO)).reservation
    proxy.cut(needle("mark_provisional"), "after_request")
    settlement = await api.mark_provisional(r, reason="timeout", expected_version=1)
    assert proxy.fired == ["after_request"]
    assert settlement.verdict is not Verdict.QUARANTINED
    assert await api.quarantine.list() == []


async def test_a_quarantined_settlement_repeated_is_still_only_quarantined(
    api: Any, proxy: FaultyProxy
) -> None:
    old = (await api.reserve("op", REQ, principal=WHO)).reservation
    await api.mark_provisional(old, reason="timeout")
    new = (await api.reserve("op", REQ, principal=WHO)).reservation
    proxy.cut(needle("complete"), "after_request")
    late = await api.complete(old, {"late": True})
    assert proxy.fired == ["after_request"]
    assert (late.verdict, late.kind) == (Verdict.QUARANTINED, QuarantineKind.STALE_GENERATION)
    record = await api.get("op")
    assert (record.state, record.generation) == (State.PENDING, new.generation)
    # The repeat is evidence of the same late response, never merged.
    kinds = {e.kind for e in await api.quarantine.list(operation_id="op")}
    assert kinds == {QuarantineKind.STALE_GENERATION}


async def test_quarantine_reads_are_repeated_after_a_cut(api: Any, proxy: FaultyProxy) -> None:
    for i in range(3):
        r = (await api.reserve(f"op-{i}", REQ, principal=WHO)).reservation
        await api.complete(r, RESULT)
        await api.complete(r, {"other": i})  # conflicting: quarantined
    proxy.cut(needle("quarantine_read"), "after_request")
    entries = await api.quarantine.list()
    assert proxy.fired == ["after_request"]
    assert sorted(e.operation_id for e in entries) == ["op-0", "op-1", "op-2"]


async def test_when_every_try_is_cut_the_error_is_typed_and_the_call_stays_repeatable(
    api: Any, proxy: FaultyProxy
) -> None:
    r = (await api.reserve("op", REQ, principal=WHO)).reservation
    proxy.cut(needle("complete"), "after_request", times=ATTEMPTS)
    with capture_logs() as logs, pytest.raises(BackendError) as info:
        await api.complete(r, RESULT)
    assert proxy.fired == ["after_request"] * ATTEMPTS
    assert len(_retries(logs)) == ATTEMPTS - 1
    assert info.value.operation_id == "op"
    assert "safe to repeat" in str(info.value)
    assert isinstance(info.value.__cause__, redis.ConnectionError)
    # The caller repeats later, as the error says: the first try had run, the repeat is absorbed.
    assert (await api.complete(r, RESULT)).verdict is Verdict.ABSORBED
    assert (await api.get("op")).version == 2
    assert await api.quarantine.list() == []


async def test_a_scripts_own_error_is_not_repeated(
    api: Any, redis_url: str, namespace: str
) -> None:
    # The quarantine stream of the ghost's shard is made a string: XADD inside the script fails.
    from settle._core.keys import Keys, shard_of  # noqa: PLC0415

    keys = Keys(namespace, 4)
    raw = redis.Redis.from_url(redis_url)
    raw.set(keys.quarantine(shard_of("ghost", 4)), "not a stream")
    ghost = Settler.from_url(redis_url, namespace=namespace, shards=4)
    reservation = (ghost.reserve("other", REQ, principal=WHO)).reservation
    stray = reservation.model_copy(update={"operation_id": "ghost"})
    with capture_logs() as logs, pytest.raises(BackendError) as info:
        await api.complete(stray, RESULT)
    assert isinstance(info.value.__cause__, redis.ResponseError)
    assert _retries(logs) == []
    assert raw.exists(keys.record("ghost")) == 0  # it ran once and wrote nothing (no attempt log)
    ghost.close()
    raw.close()
