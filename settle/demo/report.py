"""What ``settle demo`` reports: counted from Redis (records, attempt logs, quarantine), from
the provider (effects) and from what the callers got; plus the checks that must all hold."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from settle._sync.settler import Settler
from settle.demo.charge import Receipt
from settle.demo.plan import Fault, Workload
from settle.demo.provider import ProviderStats
from settle.models import QuarantineKind, State

if TYPE_CHECKING:
    from settle.demo.runner import DemoOptions, Tally

__all__ = ["Check", "DemoReport", "FaultCount", "build_report"]

_QUARANTINE_LIMIT = 100_000


class FaultCount(BaseModel):
    injected: int
    observed: int
    """Orders (or calls) where the fault happened and settle's answer was the right one."""


class Check(BaseModel):
    name: str
    ok: bool
    detail: str


class DemoReport(BaseModel):
    run: str
    seed: int
    namespace: str
    shards: int
    workers: int
    elapsed_seconds: float
    operations: int
    states: dict[str, int]
    calls: int
    attempts: int
    takeovers: dict[str, int]
    replays: int
    quarantined: dict[str, int]
    faults: dict[str, FaultCount]
    provider: dict[str, int]
    duplicate_effects: int
    checks: list[Check]
    ok: bool


def build_report(
    *,
    settler: Settler,
    workload: Workload,
    provider: ProviderStats,
    tally: Tally,
    started: datetime,
    elapsed: float,
    options: DemoOptions,
) -> DemoReport:
    ops = {o.operation_id: o for o in workload.orders}
    records = {op: settler.get(op) for op in ops}
    logs = {op: settler.attempts(op) for op in ops}
    states = Counter({s.value: 0 for s in State})
    for record in records.values():
        if record is not None:
            states[record.state.value] += 1
    takeovers = Counter(
        a.detail
        for log in logs.values()
        for a in log
        if a.action == "reserve" and a.detail in ("lease_expired", "provisional")
    )
    entries = [
        e
        for e in settler.quarantine.list(since=started, limit=_QUARANTINE_LIMIT)
        if e.operation_id in ops
    ]
    quarantined = Counter({k.value: 0 for k in QuarantineKind})
    quarantined.update(e.kind.value for e in entries)
    stale_ops = {e.operation_id for e in entries if e.kind is QuarantineKind.STALE_GENERATION}

    def completed_once(order_id: str, op: str) -> bool:
        record = records[op]
        return (
            record is not None
            and record.state is State.COMPLETED
            and provider.effects_by_order[order_id] == 1
        )

    def observed(fault: Fault) -> int:
        orders = workload.with_fault(fault)
        if fault is Fault.TIMEOUT_AFTER_SUCCESS:
            return sum(
                1
                for o in orders
                if "slow" in provider.behaviours_of_order[o.order_id]
                and provider.deduplicated_by_order[o.order_id] >= 1
                and completed_once(o.order_id, o.operation_id)
            )
        if fault is Fault.PROVIDER_UNAVAILABLE:
            return sum(
                1
                for o in orders
                if "unavailable" in provider.behaviours_of_order[o.order_id]
                and completed_once(o.order_id, o.operation_id)
            )
        if fault is Fault.DECLINED:
            return sum(
                1
                for o in orders
                if (r := records[o.operation_id]) is not None
                and r.state is State.FAILED
                and provider.effects_by_order[o.order_id] == 0
            )
        if fault is Fault.CRASHED_WORKER:
            return sum(
                1
                for o in orders
                if any(a.detail == "lease_expired" for a in logs[o.operation_id])
                and completed_once(o.order_id, o.operation_id)
            )
        if fault is Fault.LATE_STALE_RESPONSE:
            return sum(
                1
                for o in orders
                if o.operation_id in stale_ops
                and tally.process_events.get(o.order_id, {}).get("event") == "stale"
                and completed_once(o.order_id, o.operation_id)
            )
        if fault is Fault.CONCURRENT_DUPLICATE:
            # both callers got the same answer (one ran, the other waited and replayed;
            # or, after an uncertain outcome, the other took over: the provider was still
            # charged once, which the duplicate-effect check counts)
            return sum(
                1
                for a, b in tally.pairs
                if a.outcome in ("result", "failed")
                and (a.outcome, a.receipt, a.error) == (b.outcome, b.receipt, b.error)
            )
        calls = tally.calls_by_fault.get(fault.value, [])
        if fault is Fault.CHANGED_PAYLOAD:
            return sum(1 for c in calls if c.outcome == "fingerprint_mismatch" and not c.ran)
        if fault is Fault.CHANGED_PRINCIPAL:
            return sum(1 for c in calls if c.outcome == "binding_mismatch" and not c.ran)
        # duplicate deliveries: answered from the stored outcome, the function not run
        return sum(1 for c in calls if c.outcome in ("result", "failed") and not c.ran)

    faults = {
        f.value: FaultCount(injected=len(workload.with_fault(f)), observed=observed(f))
        for f in Fault
    }
    checks = _checks(workload, records, provider, tally, faults)
    return DemoReport(
        run=workload.run,
        seed=workload.seed,
        namespace=settler.config.namespace,
        shards=settler.config.shards,
        workers=options.workers,
        elapsed_seconds=round(elapsed, 2),
        operations=len(ops),
        states=dict(states),
        calls=tally.calls,
        attempts=sum(r.reservations for r in records.values() if r is not None),
        takeovers={
            "after_lease_expiry": takeovers["lease_expired"],
            "after_provisional": takeovers["provisional"],
            "total": sum(takeovers.values()),
        },
        replays=tally.replays,
        quarantined=dict(quarantined),
        faults=faults,
        provider={
            "requests": provider.requests,
            "effects": provider.effects,
            "deduplicated": provider.deduplicated,
            "declined": provider.declined,
            "unavailable": provider.unavailable,
            "answered_late": provider.slow,
        },
        duplicate_effects=provider.duplicate_effects,
        checks=checks,
        ok=all(c.ok for c in checks),
    )


def _checks(
    workload: Workload,
    records: dict[str, Any],
    provider: ProviderStats,
    tally: Tally,
    faults: dict[str, FaultCount],
) -> list[Check]:
    mismatched = []
    for order in workload.orders:
        record = records[order.operation_id]
        charges = provider.charge_of_order.get(order.order_id, [])
        if record is None or record.state is not State.COMPLETED:
            continue
        committed = record.value(Receipt).charge_id
        if charges != [committed]:
            mismatched.append(order.operation_id)
    unsettled = [
        op
        for op, r in records.items()
        if r is None or r.state not in (State.COMPLETED, State.FAILED)
    ]
    missed = [name for name, f in faults.items() if f.observed != f.injected]
    return [
        Check(
            name="no duplicate downstream effects",
            ok=provider.duplicate_effects == 0,
            detail=f"{provider.duplicate_effects} charges beyond the first of an order",
        ),
        Check(
            name="every committed receipt is the provider's only charge",
            ok=not mismatched,
            detail=f"{len(mismatched)} mismatched" + (f": {mismatched[:5]}" if mismatched else ""),
        ),
        Check(
            name="every fault met settle's answer",
            ok=not missed,
            detail="all injected faults observed" if not missed else f"short: {missed}",
        ),
        Check(
            name="every operation settled",
            ok=not unsettled and not tally.errors,
            detail=f"{len(unsettled)} unsettled, {len(tally.errors)} unexpected errors"
            + (f": {tally.errors[:3]}" if tally.errors else ""),
        ),
    ]
