"""The model checker at CI bounds: every interleaving keeps the invariants, the explored
traces give the same answers on real Redis, and a broken rule is caught with a trace; the
same with Redis losing data in between (a restart that comes back empty, a lost counter, a
failover that drops the previous step's writes).

Deeper bounds: ``python -m tests.modelcheck --depth 8`` (see docs/correctness.md).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from settle._core import reference
from tests.modelcheck.__main__ import main
from tests.modelcheck.explore import Bounds, ModelWorld, Result, explore
from tests.modelcheck.replay import covering_traces, replay, replay_trace, sample
from tests.modelcheck.world import LOSS_STEPS, Step

THREE_WORKERS = Bounds(workers=3, reserves=1, depth=6)
LONGER_SAMPLE = 800  # traces of 5 and 6 steps replayed on Redis (seed 10)
TWO_RETRYING_WORKERS = Bounds(workers=2, reserves=2, depth=6)

# The scripts as shipped, before a test swaps in a broken copy.
ORIGINAL = dict(reference._SCRIPTS)

# Every row of the SPEC §2 tables that one operation can reach: the bounds are only worth
# something if the exploration gets there.
REACHABLE = {
    "reserved/new",
    "reserved/resumed",
    "reserved/lease_expired",
    "reserved/provisional",
    "replay/completed",
    "replay/failed",
    "in_progress",
    "error/FingerprintMismatch",
    "error/BindingMismatch",
    "renew/renewed",
    "renew/lease_expired",
    "renew/not_pending",
    "renew/stale_generation",
    "expired",
    "settlement/accepted",
    "settlement/absorbed",
    "settlement/quarantined/unknown_operation",
    "settlement/quarantined/misbound",
    "settlement/quarantined/stale_generation",
    "settlement/quarantined/version_conflict",
    "settlement/quarantined/conflicting_settlement",
}


@pytest.fixture(scope="module")
def three_workers() -> Result:
    return explore(THREE_WORKERS)


def test_every_interleaving_of_three_workers_keeps_the_six_invariants(
    three_workers: Result,
) -> None:
    assert three_workers.counterexample is None, str(three_workers.counterexample)
    assert three_workers.depth_reached == THREE_WORKERS.depth
    assert three_workers.outcomes >= REACHABLE, REACHABLE - three_workers.outcomes


def test_every_interleaving_of_two_retrying_workers_keeps_the_six_invariants() -> None:
    result = explore(TWO_RETRYING_WORKERS)
    assert result.counterexample is None, str(result.counterexample)
    assert result.outcomes >= REACHABLE, REACHABLE - result.outcomes


def test_explored_traces_give_the_same_answers_on_redis(
    redis_url: str, three_workers: Result
) -> None:
    # Every explored step up to depth 4 (each edge of the graph at least once), then a
    # fixed sample of the longer traces.
    short = covering_traces(three_workers, 4)
    longer = [t for t in covering_traces(three_workers) if len(t) > 4]
    traces = short + sample(longer, LONGER_SAMPLE)
    report = replay(redis_url, THREE_WORKERS, traces)
    assert report.divergences == [], "\n".join(report.divergences)
    assert report.traces == len(traces)


def test_a_record_that_outlives_its_retention_never_gets_an_old_generation_again(
    redis_url: str,
) -> None:
    """Retention passing is a step too: late responses then find no record (unknown
    operation), a new reserve starts a new lifetime, and its generation is still fresh."""
    bounds = Bounds(workers=3, reserves=1, depth=5, retention=True)
    result = explore(bounds)
    assert result.counterexample is None, str(result.counterexample)
    assert {"forgotten", "reserved/new", "settlement/quarantined/unknown_operation"} <= (
        result.outcomes
    )
    forgotten_then_more = [
        t for t in covering_traces(result) if any(s.kind == "retention_passes" for s in t[:-1])
    ]
    chosen = sample(forgotten_then_more, 500)
    report = replay(redis_url, bounds, chosen)
    assert report.divergences == [], "\n".join(report.divergences)
    assert report.traces == len(chosen) == 500


LOSSES = Bounds(workers=2, reserves=1, depth=5, loss=True)
LOSS_SAMPLE = 400  # covering traces with a loss step before their last step (seed 10)


@pytest.fixture(scope="module")
def losses() -> Result:
    return explore(LOSSES)


def test_every_interleaving_with_losses_keeps_the_invariants(losses: Result) -> None:
    """Redis restarts empty, loses the counter, or fails over to a replica that missed the
    previous step, at any point: generations still only go up, a settlement of a generation
    issued before a loss is never accepted on a later record, and a terminal record is never
    overwritten while it exists."""
    assert losses.counterexample is None, str(losses.counterexample)
    assert losses.depth_reached == LOSSES.depth
    assert {
        "lost/restart_empty",
        "lost/counter_lost",
        "lost/failover_drops_latest",
        "renew/unknown_operation",  # a heartbeat after a restart finds nothing
    } <= losses.outcomes
    # Every SPEC §2 row is still reached with the losses in between.
    assert losses.outcomes >= REACHABLE, REACHABLE - losses.outcomes


def test_traces_with_losses_give_the_same_answers_on_redis(redis_url: str, losses: Result) -> None:
    """Each loss step done on Redis too (DEL of the namespace's keys, DEL of the counter,
    RESTORE of what DUMP saw before the previous step) gives the same answers after it."""
    after_a_loss = [t for t in covering_traces(losses) if any(s.kind in LOSS_STEPS for s in t[:-1])]
    chosen = sample(after_a_loss, LOSS_SAMPLE)
    for kind in LOSS_STEPS:  # each loss is replayed, and then more steps follow it
        assert any(s.kind == kind for t in chosen for s in t[:-1]), kind
    report = replay(redis_url, LOSSES, chosen)
    assert report.divergences == [], "\n".join(report.divergences)
    assert report.traces == len(chosen) == LOSS_SAMPLE


def _downgrading_timeout(ks: Any, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    """A broken copy of mark_provisional: a timeout downgrades a completed record."""
    rec, st = reference.load_record(ks, keys[0], keys[1], now)
    if isinstance(rec, dict) and rec[b"state"] == b"completed" and rec[b"gen"] == a[4]:
        fields = {"state": "provisional", "reason": a[9], "ver": int(rec[b"ver"]) + 1}
        reference.write(st, rec, fields)
        reference.save(ks, st, now)
        return [b"accepted", b"", now, b"", reference._row(rec)]
    result: list[Any] = ORIGINAL["mark_provisional"](ks, keys, a, now)
    return result


def _stale_accepting_complete(ks: Any, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    """A broken copy of complete: it forgets to fence, so an old generation settles."""
    rec, _st = reference.load_record(ks, keys[0], keys[1], now)
    args = list(a)
    if isinstance(rec, dict):
        args[4] = rec[b"gen"]
    result: list[Any] = ORIGINAL["complete"](ks, keys, args, now)
    return result


def _newer_accepting_complete(ks: Any, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    """A broken copy of complete: it fences with "not older than the record" instead of
    "the record's own generation". Without losses nobody holds a generation newer than the
    record's, so only a failover that dropped a takeover shows the difference."""
    rec, _st = reference.load_record(ks, keys[0], keys[1], now)
    args = list(a)
    fp = reference.texts(a, 1)[1]  # sent in stored form
    same = isinstance(rec, dict) and (rec[b"fp"], rec[b"bind"]) == (fp, a[3])
    if same and isinstance(rec, dict) and int(a[4]) > int(rec[b"gen"]):
        args[4] = rec[b"gen"]
    result: list[Any] = ORIGINAL["complete"](ks, keys, args, now)
    return result


def _break(monkeypatch: pytest.MonkeyPatch, script: str, broken: Any) -> None:
    """Run the model on a copy of its script table with one rule broken (settle/ untouched)."""
    monkeypatch.setattr(reference, "_SCRIPTS", {**reference._SCRIPTS, script: broken})


def test_a_timeout_that_downgrades_a_completed_record_is_caught_with_a_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _break(monkeypatch, "mark_provisional", _downgrading_timeout)
    result = explore(Bounds(workers=3, reserves=1, depth=4))
    found = result.counterexample
    assert found is not None
    assert found.violation.invariant == "1"
    # Breadth-first: the shortest trace that shows it.
    assert [str(s) for s in found.trace] == ["w0.reserve", "w0.complete", "w0.mark_provisional"]
    assert "w0.mark_provisional" in str(found)
    assert "VIOLATION" in str(found)


def test_a_complete_that_forgets_the_fence_is_caught_with_a_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _break(monkeypatch, "complete", _stale_accepting_complete)
    result = explore(Bounds(workers=3, reserves=1, depth=5))
    found = result.counterexample
    assert found is not None
    assert found.violation.invariant in {"2", "6"}
    kinds = [s.kind for s in found.trace]
    assert "expire" in kinds or "mark_provisional" in kinds  # a takeover happened first
    assert kinds[-1] in {"complete", "late", "duplicate"}


def test_a_counter_that_restarts_at_one_after_it_was_lost_is_caught_with_a_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the hybrid clock, a lost counter starts again at 1 and hands out generations
    that were issued before; the loss steps find it (settle/ untouched)."""
    record_key = ModelWorld(LOSSES).record_key
    original = reference.next_generation

    def forgetful(ks: Any, key: str, now: int) -> int:
        if ks.hget(key, now, "gen") is None and ks.type(record_key, now) == "string":
            ks.hset(key, now, "gen", 1)  # the counter is gone but the record is not: INCR
            return 1
        return original(ks, key, now)

    monkeypatch.setattr(reference, "next_generation", forgetful)
    found = explore(Bounds(workers=2, reserves=1, depth=4, loss=True)).counterexample
    assert found is not None
    assert found.violation.invariant == "3", str(found)
    kinds = [s.kind for s in found.trace]
    assert "counter_lost" in kinds
    assert kinds[-1] in {"reserve", "reserve_again"}
    assert len(kinds) == 4  # reserve, a takeover made possible, the loss, the takeover
    assert "issued generation 1 after" in str(found)


def test_a_fence_that_accepts_newer_generations_is_caught_only_with_a_failover(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _break(monkeypatch, "complete", _newer_accepting_complete)
    bounds = Bounds(workers=1, reserves=1, depth=5)
    assert explore(bounds).counterexample is None  # no loss: the broken fence looks right
    found = explore(replace(bounds, loss=True)).counterexample
    assert found is not None
    assert found.violation.invariant == "2", str(found)
    assert [str(s) for s in found.trace] == [
        "w0.reserve",
        "w0.mark_provisional",
        "w0.reserve_again",  # a takeover, with a newer generation ...
        "failover_drops_latest",  # ... that the new primary never got
        "w0.complete",  # the newer generation is accepted on the older record
    ]


def test_the_replay_tells_the_model_and_redis_apart(
    monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    """A model that differs from the Lua scripts on one trace is reported, step and all."""
    import redis  # noqa: PLC0415 - only this test needs a raw client

    _break(monkeypatch, "mark_provisional", _downgrading_timeout)
    client = redis.Redis.from_url(redis_url)
    try:
        trace = [Step("reserve", 0), Step("complete", 0), Step("mark_provisional", 0)]
        bounds = Bounds(workers=1, reserves=1, depth=3)
        # With the monitor on, the broken model is caught before Redis is even asked.
        with pytest.raises(AssertionError, match="a completed record changed"):
            replay_trace(client, bounds, trace)
        # With it off, the comparison with the Lua scripts catches it at the same step.
        steps, divergence = replay_trace(client, bounds, trace, checked=False)
    finally:
        client.close()
    assert steps == 3
    assert divergence is not None
    assert "step 3 (w0.mark_provisional)" in divergence
    assert "model: settlement accepted" in divergence
    assert "redis: settlement absorbed" in divergence


def test_the_command_line_explores_and_replays(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--depth", "3", "--replay", "50", "--redis-url", redis_url])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "invariants and the SPEC §2 tables held" in out
    assert "0 divergences" in out
