"""The SPEC §2 tables as an oracle, written from the tables and not from the scripts.

Given the record as it stood before a call (or None) and what the call presents, each
function says what SPEC §2 requires: the reply code or verdict, the quarantine kind, the
generation. The model checker holds every step of the reference model against it, which is
how "every rejected response is in the quarantine with the right kind" is checked against
something other than the model itself.

Each rule carries its id from docs/concepts.md ("Rules") as ``# rule: <id>`` at the branch
that decides it, as the Lua and the reference model do (``tests/unit/test_rule_ids.py``).

Some rules are the implementation's documented choices rather than rows of the SPEC tables:
a duplicate of the settlement that made a record terminal is absorbed even when it carries
the version it saw before that settlement (S11, ``_settle.lua``), so for a terminal record
the absorb rows are read before the ``version_conflict`` row. Likewise a ``mark_provisional``
that repeats the reason a provisional record already has is absorbed (S12: nothing to
update), so that a repeat after a lost reply is safe; a ``mark_provisional`` this attempt
already had accepted is absorbed even after another attempt took over (S13: its first reply
was lost); and the same attempt reserving again while its lease is live gets its own
reservation back (R9).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Expected", "Rec", "expect_renew", "expect_reserve", "expect_settle"]

TERMINAL_OF = {"complete": "completed", "fail": "failed"}


@dataclass(frozen=True, slots=True)
class Rec:
    """The stored record, as the oracle needs it."""

    op: str
    fp: str
    fpv: int
    bind: str
    gen: int
    ver: int
    state: str  # stored state
    live: bool  # pending with a lease that has not passed
    aid: str | None
    rdig: str | None
    reason: str | None = None

    @property
    def effective(self) -> str:
        # rule: L1
        if self.state == "pending" and not self.live:
            return "provisional"
        return self.state


@dataclass(frozen=True, slots=True)
class Expected:
    code: str  # reserve: reserved | replay | in_progress | fingerprint_mismatch | binding_mismatch
    # settle: accepted | absorbed | quarantined; renew: renewed | lost
    detail: str = ""  # reserve: new | lease_expired | provisional | resumed; settle: kind
    gen: int | None = None  # the generation a reserve hands out


def next_generation(counter: int, now_us: int) -> int:
    """SPEC §1: a generation is never issued twice, also after the counter was lost; settle
    takes max(last + 1, the server clock in microseconds) (docs/concepts.md, "Generations")."""
    return max(counter + 1, now_us)


def expect_reserve(
    rec: Rec | None, fp: str, bind: str, aid: str, counter: int, now_us: int
) -> Expected:
    if rec is None:
        return Expected("reserved", "new", next_generation(counter, now_us))  # rule: R1
    if rec.fp != fp:
        return Expected("fingerprint_mismatch")  # rule: R2
    if rec.bind != bind:
        return Expected("binding_mismatch")  # rule: R3
    state = rec.effective
    if state in ("completed", "failed"):
        return Expected("replay", state)  # rule: R4, R5
    if state == "pending":
        if rec.aid == aid:
            return Expected("reserved", "resumed", rec.gen)  # rule: R9
        return Expected("in_progress", "", rec.gen)  # rule: R6
    # rule: R7, R8
    takeover = "lease_expired" if rec.state == "pending" else "provisional"
    return Expected("reserved", takeover, next_generation(counter, now_us))


def expect_settle(
    rec: Rec | None,
    action: str,
    presented: tuple[str, str, int, str, int],
    expected_version: int | None,
    digest: str,
    reason: str | None = None,
    provisional_accepted: bool = False,
) -> Expected:
    op, fp, fpv, bind, gen = presented
    if rec is None or rec.op != op:
        return Expected("quarantined", "unknown_operation")  # rule: S1
    if (rec.fp, rec.fpv, rec.bind) != (fp, fpv, bind):
        return Expected("quarantined", "misbound")  # rule: S2
    if rec.gen != gen:
        if action == "mark_provisional" and provisional_accepted:
            return Expected("absorbed")  # rule: S13 (a repeat of an accepted one, after a takeover)
        return Expected("quarantined", "stale_generation")  # rule: S3
    state = rec.effective
    version_differs = expected_version is not None and expected_version != rec.ver
    if state in ("completed", "failed"):
        # rule: S11 (the absorb rows S10 and S8 are read before S4)
        if action == "mark_provisional":
            return Expected("absorbed")  # rule: S10 (success is never downgraded)
        if TERMINAL_OF[action] == state and rec.rdig == digest:
            return Expected("absorbed")  # rule: S8 (a duplicate delivery of the same settlement)
        if version_differs:
            return Expected("quarantined", "version_conflict")  # rule: S4
        return Expected("quarantined", "conflicting_settlement")  # rule: S9
    if action == "mark_provisional" and rec.state == "provisional" and rec.reason == reason:
        return Expected("absorbed")  # rule: S12 (the same uncertainty again: nothing to update)
    if version_differs:
        return Expected("quarantined", "version_conflict")  # rule: S4
    if action == "mark_provisional":
        return Expected("accepted")  # rule: S6, S7
    return Expected("accepted")  # rule: S5


def expect_renew(rec: Rec | None, presented: tuple[str, str, int, str, int]) -> Expected:
    op, fp, fpv, bind, gen = presented
    if rec is None or rec.op != op:
        return Expected("lost", "unknown_operation")  # rule: N1
    if (rec.fp, rec.fpv, rec.bind) != (fp, fpv, bind):
        return Expected("lost", "misbound")  # rule: N2
    if rec.gen != gen:
        return Expected("lost", "stale_generation")  # rule: N3
    if rec.state != "pending":
        return Expected("lost", "not_pending")  # rule: N4
    if not rec.live:
        return Expected("lost", "lease_expired")  # rule: N5
    return Expected("renewed")  # rule: N6
