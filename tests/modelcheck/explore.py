"""Breadth-first exploration, without repeats, of every interleaving of the world's steps.

The explored system is ``settle.testing.MemorySettler`` (the reference model run through the
same core as the Redis shells) on a :class:`~settle._core.reference.MemoryKeyspace` whose
clock is a :class:`~settle.testing.ManualClock`, so a lease passes only in an ``expire``
step. A state is the keyspace plus every worker's local view plus the monitor's ghost
state; it is hashed *abstractly* (see :func:`ModelWorld.key`): timestamps, the attempt
log (but for which attempts' mark_provisional it accepted: a repeat of one after a takeover
is absorbed) and the quarantine stream are left out because no script reads them to decide
anything, and a pending lease counts only as live or passed. Two states with the same key
therefore have the same futures, which is what makes pruning on the key sound.

With ``Bounds.loss`` Redis may also lose data (``world.LOSS_STEPS``): the world keeps a copy
of the keyspace from before the previous step for a failover to go back to, and the key then
also holds the quarantine's identities and that copy's abstraction (when a failover is
possible), so pruning stays sound; without it the key is what it was.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import structlog

from settle._core import reference
from settle._core.keys import Keys
from settle._core.reference import MemoryKeyspace, _Stream
from settle.testing import ManualClock, MemorySettler
from tests.modelcheck.invariants import Ghost, Observed, Violation, check_step
from tests.modelcheck.spec import Rec
from tests.modelcheck.world import LEASE, LOSS_STEPS, OP, Outcome, Runner, Step, Worker

__all__ = ["Bounds", "Counterexample", "ModelWorld", "Result", "explore", "label", "quiet_logs"]

NAMESPACE = "mc"
LOSS_TAKES = 0.001  # seconds: each loss step advances the clock by 1 ms
# A copy of the keyspace's contents: (data, expire_at).
Keyspace = tuple[dict[str, Any], dict[str, int]]
_STEPS: dict[Step, Step] = {}
_TIMESTAMPS = (b"created", b"updated", b"lease")


@dataclass(frozen=True, slots=True)
class Bounds:
    workers: int = 3
    reserves: int = 1  # new attempts (reserve calls with a new attempt id) per worker
    depth: int = 8  # steps per trace
    retention: bool = False  # also let the record outlive its retention (and be reserved anew)
    loss: bool = False  # also let Redis lose data (world.LOSS_STEPS)


@dataclass(frozen=True, slots=True)
class Snapshot:
    data: dict[str, Any]
    expire_at: dict[str, int]
    now_ms: int
    workers: tuple[Worker, ...]
    ghost: Ghost
    undo: Keyspace | None = None  # the keyspace before the previous step (Bounds.loss)


@dataclass
class Counterexample:
    trace: list[Step]
    violation: Violation
    outcomes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"invariant {self.violation.invariant} violated: {self.violation.message}"]
        lines += [
            f"  {i + 1:2}. {s!s:28} -> {o}"
            for i, (s, o) in enumerate(zip(self.trace, self.outcomes, strict=False))
        ]
        return "\n".join(lines)


@dataclass
class Result:
    bounds: Bounds
    states: int = 0
    transitions: int = 0  # steps taken (edges explored, self-loops and merges included)
    traces: int = 0  # distinct step sequences of length 1..depth covered
    depth_reached: int = 0
    exhausted: bool = False  # no new state at the last depth: every longer trace is covered
    seconds: float = 0.0
    counterexample: Counterexample | None = None
    outcomes: set[str] = field(default_factory=set)  # every kind of answer seen (coverage)
    # (parent state id, step) per state id, and the edges (src, step, dst) for replay.
    parents: list[tuple[int, Step | None]] = field(default_factory=list)
    edges: list[tuple[int, Step, int]] = field(default_factory=list)

    def trace_to(self, state: int) -> list[Step]:
        steps: list[Step] = []
        while state:
            state, step = self.parents[state]
            assert step is not None
            steps.append(step)
        return steps[::-1]


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    """settle logs every call; a million calls need not print a million lines."""
    configured, old = structlog.is_configured(), structlog.get_config()

    def drop(*_: Any) -> Any:
        raise structlog.DropEvent

    structlog.configure(processors=[drop], cache_logger_on_first_use=False)
    try:
        yield
    finally:
        if configured:
            structlog.configure(**old)
        else:
            structlog.reset_defaults()


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):  # the attempt log
        return list(value)
    if isinstance(value, _Stream):
        return _Stream(list(value.entries), value.last)
    return value


class ModelWorld:
    """The reference model, driven through ``MemorySettler`` with a manual clock."""

    def __init__(self, bounds: Bounds, *, checked: bool = True) -> None:
        self.checked = checked
        self.clock = ManualClock()
        self.keyspace = MemoryKeyspace(self.clock)
        self.settler = MemorySettler(
            namespace=NAMESPACE,
            shards=1,
            lease=LEASE,
            clock=self.clock,
            keyspace=self.keyspace,
        )
        self.settler.check()
        keys = Keys(NAMESPACE, 1)
        self.record_key = keys.record(OP)
        self.counter_key = keys.generation(0)
        self.quarantine_key = keys.quarantine(0)
        self.identities_key = keys.identities(0)
        self.meta_key = keys.meta
        retention = self.settler.config.retention
        self.runner = Runner(
            self.settler,
            bounds.workers,
            bounds.reserves,
            lambda _s: self.clock.advance(LEASE),
            (lambda _s: self.clock.advance(retention + LEASE)) if bounds.retention else None,
            self._lose if bounds.loss else None,
        )
        self.ghost = Ghost()
        self.loss = bounds.loss
        self.undo: Keyspace | None = None

    # -- state ---------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        ks = self.keyspace
        return Snapshot(
            {k: _copy(v) for k, v in ks._data.items()},
            dict(ks._expire_at),
            self.clock.now_ms,
            self.runner.workers,
            self.ghost,
            self.undo,
        )

    def restore(self, snap: Snapshot) -> None:
        ks = self.keyspace
        ks._data = {k: _copy(v) for k, v in snap.data.items()}
        ks._expire_at = dict(snap.expire_at)
        self.clock.now_ms = snap.now_ms
        self.runner.workers = snap.workers
        self.ghost = snap.ghost
        self.undo = snap.undo

    def _contents(self) -> Keyspace:
        ks = self.keyspace
        return {k: _copy(v) for k, v in ks._data.items()}, dict(ks._expire_at)

    def _live_contents(self) -> Keyspace:
        """The keys that have not expired (a failover replica has no use for the others)."""
        now = self.clock.now_ms
        data, expire_at = self._contents()
        gone = [k for k, at in expire_at.items() if at <= now]
        for k in gone:
            data.pop(k, None)
            del expire_at[k]
        return data, expire_at

    def _lose(self, kind: str) -> None:
        """A loss step on the model's keyspace; each takes 1 ms."""
        ks = self.keyspace
        if kind == "restart_empty":
            ks.flush()
        elif kind == "counter_lost":
            ks.delete(self.counter_key)
        else:
            assert kind == "failover_drops_latest"
            assert self.undo is not None
            data, expire_at = self.undo
            ks._data = {k: _copy(v) for k, v in data.items()}
            ks._expire_at = dict(expire_at)
        self.clock.advance(LOSS_TAKES)

    def _stored(self) -> reference.Stored:
        """The record key's packed value as a script reads it now (lua/_lib.lua)."""
        return reference.load_record(self.keyspace, self.record_key, None, self.clock.now_ms)[1]

    def _raw(self) -> dict[bytes, bytes] | None:
        """The live record's fields as the scripts see them (the key may hold only the log)."""
        return self._stored().rec

    def pending_live(self, raw: dict[bytes, bytes] | None) -> bool:
        return (
            raw is not None
            and raw.get(b"state") == b"pending"
            and int(raw[b"lease"]) > self.clock.now_ms
        )

    def observe(self) -> Observed:
        raw = self._raw()
        rec = None
        if raw is not None:
            rec = Rec(
                op=raw[b"op"].decode(),
                fp=raw[b"fp"].decode(),
                fpv=int(raw[b"fpv"]),
                bind=raw[b"bind"].decode(),
                gen=int(raw[b"gen"]),
                ver=int(raw[b"ver"]),
                state=raw[b"state"].decode(),
                live=self.pending_live(raw),
                aid=raw[b"aid"].decode() if b"aid" in raw else None,
                rdig=raw[b"rdig"].decode() if b"rdig" in raw else None,
                reason=raw[b"reason"].decode() if b"reason" in raw else None,
            )
        stream = self.keyspace._data.get(self.quarantine_key)
        return Observed(
            raw=raw,
            rec=rec,
            counter=int(self.keyspace.hget(self.counter_key, self.clock.now_ms, "gen") or b"0"),
            now_us=self.keyspace.next_us(self.clock.now_ms),
            provisional_accepts=self.provisional_accepts(),
            quarantine=tuple(stream.entries) if stream is not None else (),
        )

    def provisional_accepts(self) -> frozenset[tuple[str, int]]:
        """(attempt id, generation) of every accepted mark_provisional in the attempt log:
        the one thing in the log a script reads (a repeat of such a settlement after a
        takeover is absorbed, not quarantined)."""
        return _provisional_accepts(reference.entries(self._stored()))

    def key(self) -> tuple[Any, ...]:
        """The abstract state: everything that can change what happens next."""
        raw = self._raw()
        fields = None
        if raw is not None:
            fields = tuple(sorted((k, v) for k, v in raw.items() if k not in _TIMESTAMPS))
        state = self.keyspace._data.get(self.counter_key)
        counter = tuple(sorted(state.items())) if state is not None else None
        workers = tuple(w.key() for w in self.runner.workers)
        key: tuple[Any, ...] = (fields, self.pending_live(raw), counter, workers, self.ghost)
        key += (self.provisional_accepts(),)
        if not self.loss:
            return key
        # With loss steps, two more things decide what can happen next: which rejected
        # responses the quarantine still remembers (the stream can be lost while the monitor
        # remembers them), and what a failover would bring back (the undo copy, abstracted
        # the same way, when a failover is possible at all).
        ks = self.keyspace
        ids = self._abstract(ks._data, ks._expire_at)[-1]
        undo = None
        if self.undo is not None and self._failover_enabled():
            undo = self._abstract(*self.undo)
        return (*key, ids, undo)

    def _abstract(self, data: dict[str, Any], expire_at: dict[str, int]) -> tuple[Any, ...]:
        """A keyspace's contents as ``key`` sees them: the record without timestamps, its
        lease live or not, the counter, the accepted mark_provisional of the attempt log, and
        the quarantine's identities of rejected responses (the dedupe reads them)."""
        now = self.clock.now_ms

        def get(key: str) -> Any:
            at = expire_at.get(key)
            return None if at is not None and at <= now else data.get(key)

        counter, ids = get(self.counter_key), get(self.identities_key)
        copy = MemoryKeyspace(lambda: now)
        if get(self.record_key) is not None:
            copy._data[self.record_key] = data[self.record_key]
            copy._expire_at.update((k, at) for k, at in expire_at.items() if k == self.record_key)
        stored = reference.load_record(copy, self.record_key, None, now)[1]
        rec, log = stored.rec, stored.log
        fields = None
        if isinstance(rec, dict):
            fields = tuple(sorted((k, v) for k, v in rec.items() if k not in _TIMESTAMPS))
        return (
            fields,
            self.pending_live(rec if isinstance(rec, dict) else None),
            tuple(sorted(counter.items())) if isinstance(counter, dict) else None,
            _provisional_accepts(log if isinstance(log, list) else []),
            tuple(sorted(ids)) if isinstance(ids, dict) else None,
        )

    def enabled(self) -> list[Step]:
        raw = self._raw()
        steps = self.runner.enabled(raw is not None, self.pending_live(raw))
        if self.loss:
            live = self._live_contents()[0]
            if set(live) - {self.meta_key}:  # an empty Redis has nothing to lose
                steps.append(Step("restart_empty"))
            if self.counter_key in live:
                steps.append(Step("counter_lost"))
            if self._failover_enabled():
                steps.append(Step("failover_drops_latest"))
        return steps

    def _failover_enabled(self) -> bool:
        """A failover can drop the previous step's writes, if it wrote anything (and it was
        not itself a loss: what a loss dropped does not come back)."""
        return self.undo is not None and self.undo != self._live_contents()

    # -- one step, checked -----------------------------------------------------------------

    def step(self, step: Step) -> Outcome:
        before = self.observe()
        aid = self.runner.attempt_id(step)
        undo = self._live_contents() if self.loss and step.kind not in LOSS_STEPS else None
        out = self.runner.apply(step)
        self.undo = undo
        if self.checked:
            self.ghost = check_step(step, before, out, self.observe(), self.ghost, aid)
        return out


def _provisional_accepts(log: list[bytes]) -> frozenset[tuple[str, int]]:
    out = set()
    for entry in log:
        aid, gen, action, verdict, _detail, _at = entry.decode().split("|")
        if (action, verdict) == ("mark_provisional", "accepted"):
            out.add((aid, int(gen)))
    return frozenset(out)


def label(out: Outcome) -> str:
    """The kind of answer a step got, e.g. ``settlement/quarantined/stale_generation``."""
    return "/".join(x for x in (out.what, out.code, out.kind) if x)


def describe(out: Outcome) -> str:
    bits = [out.what]
    if out.code:
        bits.append(out.code)
    if out.kind:
        bits.append(out.kind)
    if out.generation is not None:
        bits.append(f"gen={out.generation}")
    return " ".join(bits)


def _counterexample(
    world: ModelWorld, result: Result, parent: int, step: Step, violation: Violation
) -> Counterexample:
    """Replay the trace from the start so the counterexample shows every outcome."""
    trace = [*result.trace_to(parent), step]
    fresh = ModelWorld(result.bounds)
    outcomes: list[str] = []
    for s in trace:
        try:
            outcomes.append(describe(fresh.step(s)))
        except Violation as exc:
            outcomes.append(f"VIOLATION: {exc.message}")
            return Counterexample(trace, exc, outcomes)
    return Counterexample(trace, violation, outcomes)


def explore(
    bounds: Bounds,
    *,
    progress: Callable[[int, int, int], None] | None = None,
) -> Result:
    """Every interleaving up to ``bounds.depth`` steps, breadth-first, each state once."""
    started = time.perf_counter()
    result = Result(bounds)
    with quiet_logs():
        world = ModelWorld(bounds)
        seen: dict[tuple[Any, ...], int] = {world.key(): 0}
        result.parents.append((0, None))
        frontier: list[tuple[int, Snapshot]] = [(0, world.snapshot())]
        depth = 0
        while frontier and depth < bounds.depth:
            depth += 1
            next_frontier: list[tuple[int, Snapshot]] = []
            for sid, snap in frontier:
                world.restore(snap)
                for fresh_step in world.enabled():
                    step = _STEPS.setdefault(fresh_step, fresh_step)
                    world.restore(snap)
                    try:
                        result.outcomes.add(label(world.step(step)))
                    except Violation as exc:
                        result.states = len(seen)
                        result.counterexample = _counterexample(world, result, sid, step, exc)
                        result.seconds = time.perf_counter() - started
                        return result
                    result.transitions += 1
                    k = world.key()
                    tid = seen.get(k)
                    if tid is None:
                        tid = len(result.parents)
                        seen[k] = tid
                        result.parents.append((sid, step))
                        next_frontier.append((tid, world.snapshot()))
                    result.edges.append((sid, step, tid))
            result.depth_reached = depth
            frontier = next_frontier
            if progress is not None:
                progress(depth, len(seen), result.transitions)
        result.states = len(seen)
        result.exhausted = not frontier
        result.traces = _count_traces(result, depth)
    result.seconds = time.perf_counter() - started
    return result


def _count_traces(result: Result, depth: int) -> int:
    """Distinct step sequences of length 1..depth that the explored graph covers.

    ``ways[s]`` is the number of sequences of the current length that end in state ``s``;
    each round pushes it along every explored edge (self-loops and merges included).
    """
    out: dict[int, list[int]] = {}
    for src, _step, dst in result.edges:
        out.setdefault(src, []).append(dst)
    ways = {0: 1}
    total = 0
    for _ in range(depth):
        nxt: dict[int, int] = {}
        for s, n in ways.items():
            for dst in out.get(s, ()):
                nxt[dst] = nxt.get(dst, 0) + n
        ways = nxt
        total += sum(ways.values())
    return total
