"""The SPEC §2 tables as an oracle, written from the tables and not from the scripts.

Given the record as it stood before a call (or None) and what the call presents, each
function says what SPEC §2 requires: the reply code or verdict, the quarantine kind, the
generation. The model checker holds every step of the reference model against it, which is
how "every rejected response is in the quarantine with the right kind" is checked against
something other than the model itself.

One ordering is the implementation's documented choice rather than the table's row order:
a duplicate of the settlement that made a record terminal is absorbed even when it carries
the version it saw before that settlement (``_settle.lua``), so for a terminal record the
absorb rows are read before the ``version_conflict`` row. Likewise a ``mark_provisional``
that repeats the reason a provisional record already has is absorbed (nothing to update),
so that a repeat after a lost reply is safe; and a ``mark_provisional`` this attempt already
had accepted is absorbed even after another attempt took over (its first reply was lost).
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
        if self.state == "pending" and not self.live:
            return "provisional"
        return self.state


@dataclass(frozen=True, slots=True)
class Expected:
    code: str  # reserve: reserved | replay | in_progress | fingerprint_mismatch | binding_mismatch
    # settle: accepted | absorbed | quarantined; renew: renewed | lost
    detail: str = ""  # reserve: new | lease_expired | provisional | resumed; settle: kind
    gen: int | None = None  # the generation a reserve hands out


def expect_reserve(rec: Rec | None, fp: str, bind: str, aid: str, counter: int) -> Expected:
    if rec is None:
        return Expected("reserved", "new", counter + 1)
    if rec.fp != fp:
        return Expected("fingerprint_mismatch")
    if rec.bind != bind:
        return Expected("binding_mismatch")
    state = rec.effective
    if state in ("completed", "failed"):
        return Expected("replay", state)
    if state == "pending":
        if rec.aid == aid:
            return Expected("reserved", "resumed", rec.gen)
        return Expected("in_progress", "", rec.gen)
    takeover = "lease_expired" if rec.state == "pending" else "provisional"
    return Expected("reserved", takeover, counter + 1)


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
        return Expected("quarantined", "unknown_operation")
    if (rec.fp, rec.fpv, rec.bind) != (fp, fpv, bind):
        return Expected("quarantined", "misbound")
    if rec.gen != gen:
        if action == "mark_provisional" and provisional_accepted:
            return Expected("absorbed")  # a repeat of an accepted one, after a takeover
        return Expected("quarantined", "stale_generation")
    state = rec.effective
    version_differs = expected_version is not None and expected_version != rec.ver
    if state in ("completed", "failed"):
        if action == "mark_provisional":
            return Expected("absorbed")  # success is never downgraded
        if TERMINAL_OF[action] == state and rec.rdig == digest:
            return Expected("absorbed")  # a duplicate delivery of the same settlement
        if version_differs:
            return Expected("quarantined", "version_conflict")
        return Expected("quarantined", "conflicting_settlement")
    if action == "mark_provisional" and rec.state == "provisional" and rec.reason == reason:
        return Expected("absorbed")  # the same uncertainty reported again: nothing to update
    if version_differs:
        return Expected("quarantined", "version_conflict")
    return Expected("accepted")


def expect_renew(rec: Rec | None, presented: tuple[str, str, int, str, int]) -> Expected:
    op, fp, fpv, bind, gen = presented
    if rec is None or rec.op != op:
        return Expected("lost", "unknown_operation")
    if (rec.fp, rec.fpv, rec.bind) != (fp, fpv, bind):
        return Expected("lost", "misbound")
    if rec.gen != gen:
        return Expected("lost", "stale_generation")
    if rec.state != "pending":
        return Expected("lost", "not_pending")
    if not rec.live:
        return Expected("lost", "lease_expired")
    return Expected("renewed")
