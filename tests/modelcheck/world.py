"""The world the model checker explores: one operation, a few workers, a clock.

A :class:`Step` is one thing that can happen next: a worker reserves, renews, settles
(complete, complete with an expected version, fail, mark_provisional), re-delivers its last
settlement, presents a late response under its previous reservation, presents a misbound
response (changed fingerprint or principal), or the lease passes; optionally retention passes,
or Redis loses data (a restart that comes back empty, a lost counter, a failover that drops
the latest writes). :class:`Runner` carries a
step out on any :class:`~settle.Settler` (the reference model or real Redis) through the
public surface only, and returns a normalised :class:`Outcome` two runners can compare.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from settle import Settler
from settle.errors import SettleError
from settle.fingerprint import fingerprint
from settle.models import (
    InProgress,
    OperationRecord,
    Replay,
    Reservation,
    Reserved,
    Settlement,
    StoredFailure,
)

__all__ = [
    "GHOST_OP",
    "LEASE",
    "LOSS_STEPS",
    "OP",
    "PRINCIPAL",
    "REQUEST",
    "Outcome",
    "Runner",
    "Sent",
    "Step",
    "Worker",
    "norm_record",
]

OP = "order-42"
GHOST_OP = "order-never-reserved"
PRINCIPAL = "tenant:acme/user:42"
OTHER_PRINCIPAL = "tenant:mallory/user:7"
REQUEST = {"amount": 4200, "currency": "EUR", "to": "acct-1"}
OTHER_REQUEST = {"amount": 9900, "currency": "EUR", "to": "acct-666"}
# The fingerprints are computed once and passed to reserve (the fingerprint= parameter).
FP = fingerprint(REQUEST)
OTHER_FP = fingerprint(OTHER_REQUEST)
LEASE = 600.0  # seconds; expiry is an explicit step, never a side effect of slow code

# Worker steps. "reserve" asks for a new attempt (a new attempt id); "reserve_again" is a
# duplicate delivery of the worker's last reserve (same attempt id: its reply was lost).
WORKER_STEPS = (
    "reserve",
    "reserve_again",
    "renew",
    "complete",
    "complete_v",  # complete with expected_version = the version seen at reserve
    "fail",
    "mark_provisional",
    "duplicate",  # the last settlement delivered again, byte for byte
    "late",  # a response of the previous reservation arriving after a new one
    "misbound_fp",  # the held reservation presented with another request's fingerprint
    "misbound_principal",  # ... and with another principal
)
SETTLE_STEPS = ("complete", "complete_v", "fail", "mark_provisional")
# What Redis forgets (optional: Bounds.loss). Each takes 1 ms of the clock: a loss takes time,
# and the hybrid-clock generations assume the clock does not step back across it.
LOSS_STEPS = (
    "restart_empty",  # a restart without persistence (or FLUSHALL): every key is gone
    "counter_lost",  # the shard's generation state is deleted (DEL, eviction)
    "failover_drops_latest",  # a failover to a replica that missed the previous step's writes
)
# Steps of the environment.
WORLD_STEPS = (
    "expire",  # the pending lease passes (clock.advance on the model)
    "reserve_other_request",  # the same key with a changed request: FingerprintMismatch
    "reserve_other_principal",  # the same key from another principal: BindingMismatch
    "unknown_operation",  # a response for an operation that was never reserved
    "retention_passes",  # the record and its attempt log expire (optional: Bounds.retention)
    *LOSS_STEPS,
)


@dataclass(frozen=True, slots=True)
class Step:
    kind: str
    worker: int | None = None

    def __str__(self) -> str:
        return self.kind if self.worker is None else f"w{self.worker}.{self.kind}"

    @staticmethod
    def parse(text: str) -> Step:
        if text.startswith("w") and "." in text:
            who, kind = text.split(".", 1)
            return Step(kind, int(who[1:]))
        return Step(text)


@dataclass(frozen=True, slots=True)
class Sent:
    """A settlement exactly as it was sent, so it can be delivered again."""

    action: str
    reservation: Reservation
    value: Any  # result (complete), StoredFailure (fail), reason (mark_provisional)
    expected_version: int | None = None


@dataclass(frozen=True, slots=True)
class Worker:
    reserves: int = 0  # attempts asked for so far (attempt ids w<i>.<n>)
    held: Reservation | None = None
    seen_version: int | None = None  # the record's version when ``held`` was reserved
    settled: frozenset[str] = frozenset()  # the settle steps already taken with ``held``
    previous: Reservation | None = None  # the reservation held before ``held``
    last: Sent | None = None
    # Names of ``held`` and ``previous`` in payloads, the same on Redis and on the model (their
    # generations are not: each side makes them from its own clock); ``holds`` counts them.
    holds: int = 0
    held_tag: str = ""
    previous_tag: str = ""

    def tag(self, previous: bool = False) -> str:
        return self.previous_tag if previous else self.held_tag

    def key(self) -> tuple[Any, ...]:
        def r(res: Reservation | None) -> tuple[int, str] | None:
            return None if res is None else (res.generation, res.attempt_id)

        last = None
        if self.last is not None:
            last = (self.last.action, r(self.last.reservation), self.last.expected_version)
        held, previous = r(self.held), r(self.previous)
        tags = (self.holds, self.held_tag, self.previous_tag)
        return (self.reserves, held, self.seen_version, self.settled, previous, last, tags)


def norm_record(record: OperationRecord | None) -> tuple[Any, ...] | None:
    """A record without its timestamps (server clocks differ; everything else must not)."""
    if record is None:
        return None
    data = record.model_dump(exclude={"created_at", "updated_at", "lease_expires_at"})
    return tuple(sorted(data.items()))


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a step returned, normalised so the model and Redis can be compared."""

    what: str  # reserved | replay | in_progress | error | settlement | renew | expired
    code: str = ""  # takeover detail, verdict, error class, renew reason
    kind: str = ""  # quarantine kind
    generation: int | None = None
    quarantined: bool = False
    record: tuple[Any, ...] | None = None
    payload: bytes | None = None  # the presented payload (settlements)
    presented_generation: int | None = None
    sent: Sent | None = None  # the settlement call made (for the monitor)
    raw: Any = None  # the public result object (not compared)

    def comparable(self) -> tuple[Any, ...]:
        return (
            self.what,
            self.code,
            self.kind,
            self.generation,
            self.quarantined,
            self.record,
        )


def _result(res: Reservation, tag: str, variant: str) -> dict[str, str | int]:
    """A distinct payload for every response, so any leak of one can be told apart. ``tag``
    names the reservation (Worker.tag); its generation is left out because Redis and the
    model make generations from different clocks."""
    return {"charge": f"ch-{tag}", "by": res.attempt_id, "variant": variant}


class Runner:
    """Carries steps out on one settler, keeping each worker's local view."""

    def __init__(
        self,
        settler: Settler,
        workers: int,
        reserves: int,
        expire: Callable[[Settler], None],
        forget: Callable[[Settler], None] | None = None,
        lose: Callable[[str], None] | None = None,
    ) -> None:
        self.settler = settler
        self.reserves = reserves
        self.workers: tuple[Worker, ...] = tuple(Worker() for _ in range(workers))
        self._expire = expire
        self._forget = forget
        self._lose = lose  # carries out a loss step (LOSS_STEPS) on this side

    # -- what can happen next ------------------------------------------------------------

    def enabled(self, record_exists: bool, record_pending_live: bool) -> list[Step]:
        steps: list[Step] = []
        for i, w in enumerate(self.workers):
            holding = w.held is not None and not w.settled
            if w.reserves < self.reserves and not holding:
                steps.append(Step("reserve", i))
            if w.held is not None:
                steps.append(Step("reserve_again", i))
                steps.append(Step("renew", i))
                steps.append(Step("misbound_fp", i))
                steps.append(Step("misbound_principal", i))
                # Each settlement once per reservation, in any order: a timed-out attempt's
                # real response may still arrive, a timeout may fire after a success, and a
                # confused worker may send a second, different outcome.
                steps += [Step(k, i) for k in SETTLE_STEPS if k not in w.settled]
            if w.last is not None:
                steps.append(Step("duplicate", i))
            if w.previous is not None:
                steps.append(Step("late", i))
        if record_pending_live:
            steps.append(Step("expire"))
        if record_exists:  # a changed request for a key nobody holds is simply a new record
            steps += [Step("reserve_other_request"), Step("reserve_other_principal")]
        if self._forget is not None and record_exists and not record_pending_live:
            steps.append(Step("retention_passes"))
        steps.append(Step("unknown_operation"))
        return steps

    # -- carrying a step out -------------------------------------------------------------

    def apply(self, step: Step) -> Outcome:
        if step.worker is None:
            return self._world_step(step.kind)
        i = step.worker
        w = self.workers[i]
        kind = step.kind
        if kind in ("reserve", "reserve_again"):
            return self._reserve(i, w, new=kind == "reserve")
        if kind == "renew":
            assert w.held is not None
            renewal = self.settler.renew(w.held, lease=LEASE)
            return Outcome(
                "renew",
                "renewed" if renewal.renewed else (renewal.reason or ""),
                record=norm_record(renewal.record),
                presented_generation=w.held.generation,
                raw=renewal,
            )
        if kind == "duplicate":
            assert w.last is not None
            return self._send(i, w.last, remember=False)
        if kind == "late":
            assert w.previous is not None
            late = Sent("complete", w.previous, _result(w.previous, w.tag(previous=True), "late"))
            return self._send(i, late, remember=False)
        if kind in ("misbound_fp", "misbound_principal"):
            assert w.held is not None
            change = {"fingerprint": OTHER_FP} if kind == "misbound_fp" else {}
            if kind == "misbound_principal":
                change = {"binding": OTHER_PRINCIPAL}
            res = w.held.model_copy(update=change)
            sent = Sent("complete", res, _result(w.held, w.tag(), kind))
            return self._send(i, sent, remember=False)
        assert w.held is not None
        tag = w.tag()
        if kind == "complete":
            sent = Sent("complete", w.held, _result(w.held, w.tag(), "complete"))
        elif kind == "complete_v":
            sent = Sent("complete", w.held, _result(w.held, w.tag(), "complete_v"), w.seen_version)
        elif kind == "fail":
            sent = Sent("fail", w.held, StoredFailure(error_type="card_declined", message=tag))
        else:
            sent = Sent("mark_provisional", w.held, f"timeout:{tag}")
        return self._send(i, sent, remember=True, kind=kind)

    def _world_step(self, kind: str) -> Outcome:
        if kind == "expire":
            self._expire(self.settler)
            return Outcome("expired")
        if kind == "retention_passes":
            assert self._forget is not None
            self._forget(self.settler)
            return Outcome("forgotten")
        if kind in LOSS_STEPS:
            assert self._lose is not None
            self._lose(kind)
            return Outcome("lost", kind)
        if kind in ("reserve_other_request", "reserve_other_principal"):
            fp = OTHER_FP if kind == "reserve_other_request" else FP
            principal = OTHER_PRINCIPAL if kind == "reserve_other_principal" else PRINCIPAL
            try:
                got = self.settler.reserve(
                    OP,
                    principal=principal,
                    fingerprint=fp,
                    lease=LEASE,
                    attempt_id=f"x.{kind}",
                )
            except SettleError as exc:
                return Outcome("error", type(exc).__name__)
            raise AssertionError(f"{kind} was not rejected: {got!r}")
        assert kind == "unknown_operation"
        res = Reservation(
            operation_id=GHOST_OP,
            fingerprint=FP,
            fingerprint_version=1,
            binding=PRINCIPAL,
            generation=1,
            attempt_id="x.ghost",
        )
        return self._send(
            None, Sent("complete", res, _result(res, "ghost", "unknown")), remember=False
        )

    def attempt_id(self, step: Step) -> str | None:
        """The attempt id a reserve step sends (None for other steps)."""
        if step.worker is None or step.kind not in ("reserve", "reserve_again"):
            return None
        w = self.workers[step.worker]
        if step.kind == "reserve_again":
            assert w.held is not None
            return w.held.attempt_id
        return f"w{step.worker}.{w.reserves + 1}"

    def _reserve(self, i: int, w: Worker, *, new: bool) -> Outcome:
        aid = self.attempt_id(Step("reserve" if new else "reserve_again", i))
        assert aid is not None
        if new:
            w = replace(w, reserves=w.reserves + 1)
        try:
            got = self.settler.reserve(
                OP, principal=PRINCIPAL, fingerprint=FP, lease=LEASE, attempt_id=aid
            )
        except SettleError as exc:  # pragma: no cover - the tuple always matches here
            return Outcome("error", type(exc).__name__)
        if isinstance(got, Reserved):
            res = got.reservation
            resumed = w.held is not None and w.held.generation == res.generation
            if resumed:
                w = replace(w, held=res)  # the same attempt, the same reservation
            else:
                w = replace(
                    w,
                    held=res,
                    holds=w.holds + 1,
                    held_tag=f"{res.attempt_id}#{w.holds + 1}",
                    seen_version=got.record.version,
                    settled=frozenset(),
                    previous=w.held if w.held is not None else w.previous,
                    previous_tag=w.held_tag if w.held is not None else w.previous_tag,
                )
            self._set(i, w)
            return Outcome(
                "reserved",
                got.takeover or ("resumed" if resumed else "new"),
                generation=res.generation,
                record=norm_record(got.record),
                raw=got,
            )
        # Replay or InProgress: this attempt ends here without a reservation.
        self._set(
            i,
            replace(
                w,
                held=None,
                held_tag="",
                settled=frozenset(),
                previous=w.held if w.held is not None else w.previous,
                previous_tag=w.held_tag if w.held is not None else w.previous_tag,
            ),
        )
        if isinstance(got, Replay):
            return Outcome(
                "replay", got.record.state.value, record=norm_record(got.record), raw=got
            )
        assert isinstance(got, InProgress)
        return Outcome(
            "in_progress", generation=got.generation, record=norm_record(got.record), raw=got
        )

    def _send(self, i: int | None, sent: Sent, *, remember: bool, kind: str = "") -> Outcome:
        s = self.settler
        if sent.action == "complete":
            out: Settlement = s.complete(
                sent.reservation, sent.value, expected_version=sent.expected_version
            )
        elif sent.action == "fail":
            out = s.fail(sent.reservation, sent.value, expected_version=sent.expected_version)
        else:
            out = s.mark_provisional(
                sent.reservation, sent.value, expected_version=sent.expected_version
            )
        if remember and i is not None:
            w = self.workers[i]
            self._set(i, replace(w, settled=w.settled | {kind}, last=sent))
        return Outcome(
            "settlement",
            out.verdict.value,
            out.kind.value if out.kind else "",
            quarantined=out.quarantine_id is not None,
            record=norm_record(out.record),
            presented_generation=sent.reservation.generation,
            sent=sent,
            raw=out,
        )

    def _set(self, i: int, w: Worker) -> None:
        self.workers = (*self.workers[:i], w, *self.workers[i + 1 :])
