"""The invariants of issues 10 and 20 (losses), checked on every step the model checker takes.

The monitor keeps a little ghost state (what was accepted, what was quarantined, the highest
generation issued) that is part of the explored state, because the invariants talk about
history. Each step is also held against the SPEC §2 tables (``spec.py``): that is how a
rejected response is known to carry "the right kind" without trusting the model.

1. at most one terminal outcome is accepted per operation, and once completed or failed the
   record's state, generation and result never change again;
2. every accepted settlement carries the record's current generation and its exact tuple;
3. generations issued are strictly increasing and never repeat;
4. no quarantined payload is ever visible in the record or in a replay;
5. a response is never both accepted and quarantined, and every rejected one is in the
   quarantine (exactly one entry, the presented payload) with the right kind; the same
   rejected response delivered again keeps its first entry;
6. after a takeover, the old generation changes nothing;
7. across what Redis may lose (Bounds.loss: a restart that comes back empty, a lost counter, a
   failover that drops the latest writes): generations still only go up (3), and a settlement
   presented with a generation issued before a loss is never accepted on a record of a
   generation issued after it; a terminal record is never overwritten while it exists (1),
   but a loss may end it, and then the operation may run again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from settle._core import codec
from settle.models import Replay, Settlement
from tests.modelcheck.spec import Rec, expect_renew, expect_reserve, expect_settle
from tests.modelcheck.world import FP, OP, PRINCIPAL, Outcome, Sent, Step

__all__ = ["Ghost", "Observed", "Violation", "check_step"]

MAX_BYTES = 1 << 20


class Violation(AssertionError):
    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"[{invariant}] {message}")
        self.invariant = invariant
        self.message = message


@dataclass(frozen=True, slots=True)
class Ghost:
    """History the invariants need, kept as part of the explored state."""

    terminal: tuple[str, int, bytes, bytes] | None = None  # state, generation, result, digest
    issued: int = 0  # the highest generation handed out so far
    quarantined: frozenset[bytes] = frozenset()  # identities of quarantined responses
    quarantined_payloads: frozenset[bytes] = frozenset()  # their result / failure bytes
    accepted: frozenset[bytes] = frozenset()  # identities of accepted responses
    fence: int = 0  # the highest generation issued before the latest loss (Bounds.loss)


@dataclass(frozen=True, slots=True)
class Observed:
    """The model's keyspace around one step, read from the reference keyspace."""

    raw: dict[bytes, bytes] | None  # the record hash as stored (with timestamps)
    rec: Rec | None
    counter: int  # the shard's last generation (0 when its state is missing)
    now_us: int  # the server clock, in the microseconds generations are made of
    quarantine: tuple[tuple[bytes, list[bytes]], ...]  # the shard's quarantine stream
    provisional_accepts: frozenset[tuple[str, int]] = frozenset()

    @property
    def result(self) -> bytes | None:
        return None if self.raw is None else self.raw.get(b"result")


def payload_of(sent: Sent) -> bytes:
    op = sent.reservation.operation_id
    if sent.action == "complete":
        return codec.encode_result(sent.value, MAX_BYTES, op)
    if sent.action == "fail":
        return codec.encode_failure(sent.value, MAX_BYTES, op)
    return b""


def identity(sent: Sent) -> bytes:
    """What tells one response apart: action, attempt, generation and payload (or reason)."""
    body = payload_of(sent) if sent.action != "mark_provisional" else str(sent.value).encode()
    r = sent.reservation
    return f"{sent.action}|{r.attempt_id}|{r.generation}|".encode() + body


def _fields(flat: list[bytes]) -> dict[bytes, bytes]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


def check_step(
    step: Step, before: Observed, out: Outcome, after: Observed, ghost: Ghost, aid: str | None
) -> Ghost:
    """Raise :class:`Violation` if the step broke a rule; return the ghost after it."""
    if out.what not in ("forgotten", "lost"):  # what the history so far demands of the new state
        _check_terminal(after, ghost)
    ghost = _check_by_kind(step, before, out, after, ghost, aid)
    _check_state(after, ghost)  # and with this step's own outcome added
    return ghost


def _unchanged(before: Observed, after: Observed, why: str, invariant: str) -> None:
    if before.raw != after.raw or before.counter != after.counter:
        raise Violation(
            invariant, f"{why}, yet the record changed: {before.raw!r} -> {after.raw!r}"
        )


def _no_new_quarantine(before: Observed, after: Observed, why: str) -> None:
    if len(after.quarantine) != len(before.quarantine):
        raise Violation("5", f"{why}, yet a quarantine entry was written")


def _check_by_kind(
    step: Step, before: Observed, out: Outcome, after: Observed, ghost: Ghost, aid: str | None
) -> Ghost:
    if out.what == "expired":
        _unchanged(before, after, "time passed", "6")
        return ghost
    if out.what == "forgotten":
        if after.raw is not None or after.counter != before.counter:
            raise Violation("3", "retention passed, yet the record or the counter is still there")
        _no_new_quarantine(before, after, "retention passing is not a response")
        # A new lifetime of the operation id: invariant 1 holds within retention (SPEC §1),
        # while generations (3) and quarantined payloads (4) are checked across lifetimes.
        return replace(ghost, terminal=None, accepted=frozenset())
    if out.what == "lost":
        return _check_loss(step, before, after, ghost)
    if out.what == "error" or step.kind in ("reserve_other_request", "reserve_other_principal"):
        fp = FP if step.kind == "reserve_other_principal" else "other"
        bind = PRINCIPAL if step.kind == "reserve_other_request" else "other"
        want = expect_reserve(before.rec, fp, bind, "x", before.counter, before.now_us)
        want_error = {"fingerprint_mismatch": "FingerprintMismatch"}.get(want.code)
        want_error = want_error or {"binding_mismatch": "BindingMismatch"}.get(want.code)
        if out.what != "error" or out.code != want_error:
            raise Violation("spec", f"{step}: expected {want_error}, got {out}")
        _unchanged(before, after, f"{step} was rejected", "spec")
        _no_new_quarantine(before, after, "a rejected reserve is not a response")
        return ghost
    if out.what in ("reserved", "replay", "in_progress"):
        return _check_reserve(step, before, out, after, ghost, aid)
    if out.what == "renew":
        assert out.presented_generation is not None
        want = expect_renew(before.rec, (OP, FP, 1, PRINCIPAL, out.presented_generation))
        if (want.detail or want.code) != out.code:
            raise Violation("spec", f"{step}: renew expected {want}, got {out.code}")
        _no_new_quarantine(before, after, "a heartbeat is not a response")
        if out.code != "renewed":
            _unchanged(before, after, f"renew was lost ({out.code})", "6")
        elif before.raw is not None and after.raw is not None:
            changed = {k for k in after.raw if before.raw.get(k) != after.raw[k]}
            if changed - {b"lease"}:
                raise Violation("6", f"renew changed more than the lease: {sorted(changed)}")
        return ghost
    assert out.what == "settlement"
    assert out.sent is not None
    return _check_settlement(step, before, out, after, ghost)


def _check_loss(step: Step, before: Observed, after: Observed, ghost: Ghost) -> Ghost:
    """Redis lost data (Bounds.loss). Invariant 1 holds while a terminal record exists: a
    total loss, or a failover that dropped the write that made it terminal, ends that record
    and the operation may run again (docs/correctness.md). Generations (3), quarantined
    payloads (4) and stale responses (5, 6, 7) are checked across the loss."""
    if step.kind == "restart_empty":
        if after.raw is not None or after.counter or after.quarantine:
            raise Violation("loss", "a restart came back empty, yet a key is still there")
    elif step.kind == "counter_lost" and (
        after.raw != before.raw or after.counter or after.quarantine != before.quarantine
    ):
        raise Violation("loss", "only the counter was lost, yet something else changed")
    ghost = replace(ghost, fence=ghost.issued)
    if ghost.terminal is None:
        return ghost
    if _terminal_of(after) == ghost.terminal:
        return ghost  # the terminal record survived the loss
    return replace(ghost, terminal=None, accepted=frozenset())


def _check_reserve(
    step: Step, before: Observed, out: Outcome, after: Observed, ghost: Ghost, aid: str | None
) -> Ghost:
    assert aid is not None
    want = expect_reserve(before.rec, FP, PRINCIPAL, aid, before.counter, before.now_us)
    if out.what != want.code or (want.code == "reserved" and out.code != want.detail):
        raise Violation("spec", f"{step}: reserve expected {want}, got {out.what}/{out.code}")
    _no_new_quarantine(before, after, "reserve is not a response")
    if out.what == "replay":
        # Invariant 4: a replay never shows a quarantined payload.
        record = out.raw.record if isinstance(out.raw, Replay) else None
        if record is not None and record.result and _is_quarantined_result(record.result, ghost):
            raise Violation("4", f"{step}: a replay shows a quarantined payload")
        _unchanged(before, after, "a replay writes nothing", "1")
        return ghost
    if out.what == "in_progress" or out.code == "resumed":
        _unchanged(before, after, f"reserve answered {out.what}/{out.code}", "6")
        current = before.rec.gen if before.rec is not None else None
        if out.code == "resumed" and out.generation != current:
            raise Violation("3", f"{step}: a resumed reservation has another generation")
        return ghost
    # A new generation was issued (invariant 3).
    gen = out.generation
    assert gen is not None
    if gen <= ghost.issued or gen != want.gen:
        raise Violation(
            "3", f"{step}: issued generation {gen} after {ghost.issued} (expected {want.gen})"
        )
    if after.rec is None or after.rec.gen != gen or after.rec.state != "pending":
        raise Violation("3", f"{step}: the record does not carry the new generation {gen}")
    if ghost.terminal is not None:
        raise Violation("1", f"{step}: a terminal record was reserved again")
    return replace(ghost, issued=gen)


def _is_quarantined_result(result: bytes, ghost: Ghost) -> bool:
    return result in ghost.quarantined_payloads


def _check_settlement(
    step: Step, before: Observed, out: Outcome, after: Observed, ghost: Ghost
) -> Ghost:
    sent = out.sent
    assert sent is not None
    r = sent.reservation
    presented = (r.operation_id, r.fingerprint, r.fingerprint_version, r.binding, r.generation)
    payload = payload_of(sent)
    want = expect_settle(
        before.rec if r.operation_id == (before.rec.op if before.rec else None) else None,
        sent.action,
        presented,
        sent.expected_version,
        codec.digest(payload),
        sent.value if sent.action == "mark_provisional" else None,
        (r.attempt_id, r.generation) in before.provisional_accepts,
    )
    current = None
    if before.rec is not None:
        rec = before.rec
        current = (rec.op, rec.fp, rec.fpv, rec.bind, rec.gen)
    if out.code == "accepted" and current and r.generation <= ghost.fence < current[-1]:
        raise Violation(
            "7",
            f"{step}: generation {r.generation}, issued before a loss, was accepted on a record"
            f" of generation {current[-1]}, issued after it",
        )
    if out.code == "accepted" and presented != current:
        raise Violation("2", f"{step}: accepted {presented}, the record was {current}")
    if (out.code, out.kind) != (want.code, want.detail):
        raise Violation(
            "5",
            f"{step}: expected {want.code}/{want.detail or '-'}, got {out.code}/{out.kind or '-'}",
        )
    me = identity(sent)
    stale = before.rec is not None and r.generation != before.rec.gen
    if out.code == "quarantined":
        # One entry per response: a new one, or the one this very response got before.
        added = len(after.quarantine) - len(before.quarantine)
        assert isinstance(out.raw, Settlement)
        qid = (out.raw.quarantine_id or "").rpartition("/")[2].encode()
        entries = dict(after.quarantine)
        if not out.quarantined or added not in (0, 1) or qid not in entries:
            raise Violation("5", f"{step}: quarantined but not in exactly one entry")
        if added == 0 and me not in ghost.quarantined:
            raise Violation("5", f"{step}: a new rejected response was given an old entry")
        if added == 1 and after.quarantine[-1][0] != qid:
            raise Violation("5", f"{step}: the new entry is not the one returned")
        entry = _fields(entries[qid])
        expect = {
            b"payload": payload,
            b"aid": r.attempt_id.encode(),
            b"gen": str(r.generation).encode(),
        }
        if added == 1:
            expect[b"kind"] = out.kind.encode()
        got = {k: entry.get(k) for k in expect}
        if got != expect:
            raise Violation("5", f"{step}: quarantine entry {got} != {expect}")
        if out.kind in ("misbound", "unknown_operation") and out.record is not None:
            raise Violation("spec", f"{step}: a {out.kind} caller was shown the record")
        if me in ghost.accepted and sent.action != "mark_provisional":
            raise Violation("5", f"{step}: a response accepted earlier is now quarantined")
        _unchanged(before, after, f"{step} was quarantined", "6" if stale else "5")
        payloads = ghost.quarantined_payloads | ({payload} if payload else set())
        return replace(ghost, quarantined=ghost.quarantined | {me}, quarantined_payloads=payloads)
    if out.quarantined or len(after.quarantine) != len(before.quarantine):
        raise Violation("5", f"{step}: {out.code} and yet quarantined")
    if out.code == "absorbed":
        _unchanged(before, after, f"{step} was absorbed", "1")
        return ghost
    # Accepted.
    assert before.rec is not None
    assert after.rec is not None
    assert after.raw is not None
    if me in ghost.quarantined:
        raise Violation("5", f"{step}: a response quarantined earlier is now accepted")
    if (after.rec.gen, after.rec.op, after.rec.fp, after.rec.bind) != (
        r.generation,
        r.operation_id,
        r.fingerprint,
        r.binding,
    ):
        raise Violation("2", f"{step}: the accepted record does not carry the tuple")
    if after.rec.ver != before.rec.ver + 1:
        raise Violation("spec", f"{step}: version {before.rec.ver} -> {after.rec.ver}")
    ghost = replace(ghost, accepted=ghost.accepted | {me})
    if sent.action == "mark_provisional":
        if after.rec.state != "provisional" or ghost.terminal is not None:
            raise Violation("1", f"{step}: mark_provisional accepted into {after.rec.state}")
        return ghost
    if ghost.terminal is not None:
        raise Violation("1", f"{step}: a second terminal outcome was accepted")
    state = "completed" if sent.action == "complete" else "failed"
    if after.rec.state != state or after.result != payload:
        raise Violation("1", f"{step}: accepted {sent.action} but the record is {after.raw!r}")
    assert isinstance(out.raw, Settlement)
    return replace(ghost, terminal=(state, r.generation, payload, after.raw.get(b"rdig", b"")))


def _check_state(after: Observed, ghost: Ghost) -> None:
    """What must hold in every state, whatever led to it."""
    _check_terminal(after, ghost)
    if after.result is not None and _is_quarantined_result(after.result, ghost):
        raise Violation("4", "the record shows a quarantined payload")
    if after.rec is not None and after.rec.gen > ghost.issued:
        raise Violation("3", f"the record carries generation {after.rec.gen}, never issued")


def _terminal_of(after: Observed) -> tuple[str, int, bytes | None, bytes | None] | None:
    if after.rec is None or after.raw is None:
        return None
    return (after.rec.state, after.rec.gen, after.result, after.raw.get(b"rdig"))


def _check_terminal(after: Observed, ghost: Ghost) -> None:
    if ghost.terminal is not None:
        now = _terminal_of(after)
        if now != ghost.terminal:
            raise Violation("1", f"a {ghost.terminal[0]} record changed: {ghost.terminal} -> {now}")
