"""Replay explored traces against the real Lua scripts and require the same answers.

Each trace runs twice, step by step: on a fresh ``MemorySettler`` (the model) and on a
``Settler`` over a real Redis in a fresh namespace, with the same attempt ids and payloads.
Every step must give the same verdict, quarantine kind, generation and record (timestamps
aside); at the end the record, the attempt log and the quarantine entries must match too.

Generations: Redis makes them from its own clock in microseconds, the model from its manual
clock, so each new generation Redis issues is paired with the model's, in the order they are
issued (strictly increasing on both sides, checked), and Redis's answers are compared in the
model's numbers.

Lease expiry on Redis: every lease is long (``LEASE``), so none passes by accident; an
``expire`` step renews the current reservation with a 1 ms lease through the public API and
then waits until the server's own ``TIME`` is past that lease. The model's ``expire`` step
advances its manual clock past the lease. Both then agree that exactly this lease passed.

Losses on Redis (``Bounds.loss``), on the namespace's own keys so that a shared server is
safe: ``restart_empty`` deletes every key of the namespace (what a restart without
persistence or a FLUSHALL leaves of it; the script cache survives, which changes no answer:
its reload after a real restart is tested in tests/faults), ``counter_lost`` deletes the
shard's generation state, and ``failover_drops_latest`` puts back every key as DUMP saw it
before the previous step (RESTORE ... REPLACE ABSTTL, deleting the keys that did not exist
then). Each then waits until the server's clock moved by 1 ms, as the model's does.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis

from settle import Settler
from settle._core.keys import Keys
from settle.models import Reservation
from tests.modelcheck.explore import Bounds, ModelWorld, Result, describe, quiet_logs
from tests.modelcheck.world import (
    GHOST_OP,
    LEASE,
    LOSS_STEPS,
    OP,
    Outcome,
    Runner,
    Step,
    norm_record,
)

__all__ = [
    "RedisLoss",
    "ReplayReport",
    "covering_traces",
    "namespace_keys",
    "replay",
    "replay_trace",
]


@dataclass
class ReplayReport:
    traces: int = 0
    steps: int = 0
    seconds: float = 0.0
    divergences: list[str] = field(default_factory=list)


def covering_traces(result: Result, max_depth: int | None = None) -> list[list[Step]]:
    """Traces that together take every explored step (edge) at least once.

    A tree edge into a state that has tree children is covered by a longer trace through it,
    so the set is: every non-tree edge appended to its source's path, and every tree leaf.
    """
    depth = [0] * len(result.parents)
    has_child = [False] * len(result.parents)
    for sid in range(1, len(result.parents)):
        parent, _ = result.parents[sid]
        depth[sid] = depth[parent] + 1
        has_child[parent] = True
    limit = max_depth if max_depth is not None else result.depth_reached
    traces: list[list[Step]] = []
    for src, step, dst in result.edges:
        if depth[src] + 1 > limit:
            continue
        tree_edge = dst != 0 and result.parents[dst] == (src, step)
        if tree_edge and has_child[dst] and depth[dst] < limit:
            continue
        traces.append([*result.trace_to(src), step])
    return traces


def sample(traces: list[list[Step]], count: int | None, seed: int = 10) -> list[list[Step]]:
    if count is None or count >= len(traces):
        return traces
    return random.Random(seed).sample(traces, count)


def _server_ms(client: redis.Redis) -> int:
    sec, usec = client.time()
    return int(sec) * 1000 + int(usec) // 1000


def _redis_expire(client: redis.Redis) -> Any:
    def expire(settler: Settler) -> None:
        record = settler.get(OP)
        assert record is not None
        assert record.state.value == "pending", record
        current = Reservation(
            operation_id=record.operation_id,
            fingerprint=record.fingerprint,
            fingerprint_version=record.fingerprint_version,
            binding=record.binding,
            generation=record.generation,
            attempt_id=record.attempt_id or "",
        )
        renewal = settler.renew(current, lease=0.001)
        assert renewal.renewed, renewal
        assert renewal.lease_expires_at is not None
        end = int(renewal.lease_expires_at.timestamp() * 1000)
        while _server_ms(client) < end:
            time.sleep(0.001)

    return expire


def _redis_forget(client: redis.Redis, namespace: str) -> Any:
    """Retention passing, on Redis: every key that has a TTL (records, attempt logs; never
    the generation counter or the quarantine) gets 1 ms left, then we wait until it is gone:
    what the retention TTL does when it runs out. The model advances its clock past it."""

    def forget(settler: Settler) -> None:
        del settler
        keys = Keys(namespace, 1)
        candidates = [keys.record(op) for op in (OP, GHOST_OP)]
        candidates += [keys.attempt_log(op) for op in (OP, GHOST_OP)]
        expiring = [key for key in candidates if client.pttl(key) > 0]
        for key in expiring:
            client.pexpire(key, 1)
        while expiring and client.exists(*expiring):
            time.sleep(0.001)

    return forget


def namespace_keys(namespace: str) -> list[str]:
    """Every key a trace can write in its namespace (one shard)."""
    keys = Keys(namespace, 1)
    return [
        keys.meta,
        *(k for op in (OP, GHOST_OP) for k in (keys.record(op), keys.attempt_log(op))),
        keys.generation(0),
        *keys.quarantine_keys(0),
    ]


class RedisLoss:
    """The loss steps on Redis, for one namespace: see the module docstring."""

    def __init__(self, client: redis.Redis, namespace: str) -> None:
        self.client = client
        self.keys = namespace_keys(namespace)
        self.counter = Keys(namespace, 1).generation(0)
        self.undo: list[tuple[str, bytes, int]] | None = None

    def before(self, step: Step) -> None:
        """Keep what a failover after ``step`` would bring back (a loss keeps nothing)."""
        if step.kind not in LOSS_STEPS:
            self.undo = self._dump()

    def _dump(self) -> list[tuple[str, bytes, int]]:
        pipe = self.client.pipeline(transaction=True)
        pipe.time()
        for key in self.keys:
            pipe.dump(key)
            pipe.pttl(key)
        (sec, usec), *replies = pipe.execute()
        now = int(sec) * 1000 + int(usec) // 1000
        saved = []
        for key, payload, ttl in zip(self.keys, replies[::2], replies[1::2], strict=True):
            if payload is not None:
                saved.append((key, payload, now + ttl if ttl > 0 else 0))
        return saved

    def __call__(self, kind: str) -> None:
        start = _server_ms(self.client)
        if kind == "restart_empty":
            self.client.delete(*self.keys)
        elif kind == "counter_lost":
            self.client.delete(self.counter)
        else:
            assert kind == "failover_drops_latest"
            assert self.undo is not None
            kept = {key for key, _, _ in self.undo}
            pipe = self.client.pipeline(transaction=True)
            gone = [key for key in self.keys if key not in kept]
            if gone:
                pipe.delete(*gone)
            for key, payload, at in self.undo:
                pipe.restore(key, at, payload, replace=True, absttl=at > 0)
            pipe.execute()
        self.undo = None
        while _server_ms(self.client) < start + 1:
            time.sleep(0.0005)


class Generations:
    """Redis generation -> model generation, paired as both sides issue them."""

    def __init__(self) -> None:
        self.pairs: dict[int, int] = {}

    def pair(self, real: int, model: int) -> None:
        if real not in self.pairs:
            if self.pairs and (real < max(self.pairs) or model <= max(self.pairs.values())):
                raise AssertionError(f"a generation went backwards: {real} / {model}")
            self.pairs[real] = model

    def of(self, g: int | None) -> int | None:
        return None if g is None else self.pairs.get(g, g)

    def record(self, rec: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
        if rec is None:
            return None
        return tuple((k, self.of(v) if k == "generation" else v) for k, v in rec)

    def outcome(self, out: Outcome) -> tuple[Any, ...]:
        what, code, kind, gen, quarantined, rec = out.comparable()
        return (what, code, kind, self.of(gen), quarantined, self.record(rec))

    def final(self, final: tuple[Any, ...]) -> tuple[Any, ...]:
        record, attempts, quarantine = final
        attempts = tuple((a[0], self.of(a[1]), *a[2:]) for a in attempts)
        quarantine = tuple(
            (
                *q[:3],
                q[3].model_copy(update={"generation": self.of(q[3].generation)}),
                q[4] and q[4].model_copy(update={"generation": self.of(q[4].generation)}),
                *q[5:],
            )
            for q in quarantine
        )
        return self.record(record), attempts, quarantine


def _final(settler: Settler) -> tuple[Any, ...]:
    record = norm_record(settler.get(OP))
    attempts = tuple(
        (a.attempt_id, a.generation, a.action, a.verdict, a.detail)
        for op in (OP, GHOST_OP)
        for a in settler.attempts(op)
    )
    quarantine = tuple(
        (
            e.operation_id,
            e.kind.value,
            e.action.value,
            e.presented,
            e.current,
            e.payload,
            e.reason,
            e.attempt_id,
        )
        for e in settler.quarantine.list(newest_first=False, limit=10_000)
    )
    return record, attempts, quarantine


def replay_trace(
    client: redis.Redis, bounds: Bounds, trace: list[Step], *, checked: bool = True
) -> tuple[int, str | None]:
    """Run one trace on the model and on Redis; return (steps, divergence or None).

    ``checked``: also hold the model to the invariants on the way (a violation raises).
    """
    namespace = f"mc{uuid.uuid4().hex[:12]}"
    model = ModelWorld(bounds, checked=checked)
    real = Settler(client, namespace=namespace, shards=1, lease=LEASE)
    forget = _redis_forget(client, namespace) if bounds.retention else None
    lose = RedisLoss(client, namespace) if bounds.loss else None
    runner = Runner(real, bounds.workers, bounds.reserves, _redis_expire(client), forget, lose)
    gens = Generations()
    try:
        for n, step in enumerate(trace, 1):
            if lose is not None:
                lose.before(step)
            want: Outcome = model.step(step)
            got = runner.apply(step)
            if want.what == got.what == "reserved" and want.generation and got.generation:
                gens.pair(got.generation, want.generation)
            if want.comparable() != gens.outcome(got):
                return n, _report(trace, n, want, got)
        want_final, got_final = _final(model.settler), gens.final(_final(real))
        if want_final != got_final:
            names = ("record", "attempt log", "quarantine")
            diff = [
                f"{name}:\n    model: {w}\n    redis: {g}"
                for name, w, g in zip(names, want_final, got_final, strict=True)
                if w != g
            ]
            return len(trace), f"{_trace_text(trace)}\n  at the end, " + "\n  ".join(diff)
        return len(trace), None
    finally:
        client.delete(*namespace_keys(namespace))


def _trace_text(trace: list[Step]) -> str:
    return "trace: " + " ; ".join(str(s) for s in trace)


def _report(trace: list[Step], n: int, want: Outcome, got: Outcome) -> str:
    return (
        f"{_trace_text(trace)}\n  step {n} ({trace[n - 1]}):\n"
        f"    model: {describe(want)} record={want.record}\n"
        f"    redis: {describe(got)} record={got.record}"
    )


def replay(
    url: str, bounds: Bounds, traces: Iterable[list[Step]], *, stop_after: int = 5
) -> ReplayReport:
    """Replay ``traces``; collect up to ``stop_after`` divergences."""
    started = time.perf_counter()
    report = ReplayReport()
    client = redis.Redis.from_url(url, decode_responses=False)
    try:
        with quiet_logs():
            for trace in _iter(traces):
                steps, divergence = replay_trace(client, bounds, trace)
                report.traces += 1
                report.steps += steps
                if divergence is not None:
                    report.divergences.append(divergence)
                    if len(report.divergences) >= stop_after:
                        break
    finally:
        client.close()
    report.seconds = time.perf_counter() - started
    return report


def _iter(traces: Iterable[list[Step]]) -> Iterator[list[Step]]:
    yield from traces
