"""The demo's workload, drawn from a seed: orders, and which faults each one meets.

Every fault kind is given to at least one order (``--ops`` is at least ``MIN_OPS``), so a
run always exercises all of them; the same seed gives the same workload.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import StrEnum

from settle.demo.charge import ChargeRequest

__all__ = ["MIN_OPS", "Fault", "Order", "Workload", "draw"]


class Fault(StrEnum):
    """What the demo does to an order. The first six decide how the first delivery goes
    (at most one each); the last four are extra deliveries after it."""

    TIMEOUT_AFTER_SUCCESS = "timeout_after_success"
    """The provider charges, then answers too late: the client times out and retries."""
    PROVIDER_UNAVAILABLE = "provider_unavailable"
    """The provider answers 503 before charging; the retry charges."""
    DECLINED = "declined"
    """The provider declines: stored as a definite failure and replayed."""
    CRASHED_WORKER = "crashed_worker"
    """A worker process is SIGKILLed after the provider charged; another worker takes over
    once its lease expires."""
    LATE_STALE_RESPONSE = "late_stale_response"
    """A worker process is frozen (SIGSTOP) after the provider charged; another worker takes
    over and completes; the frozen one resumes (SIGCONT) and presents its result late: it
    is quarantined (stale_generation) and that worker gets StaleAttempt."""
    DUPLICATE_DELIVERY = "duplicate_delivery"
    """The same call is made again after it finished: it replays, nothing runs."""
    CONCURRENT_DUPLICATE = "concurrent_duplicate"
    """The same call is made twice at the same time: one runs, the other waits and replays."""
    CHANGED_PAYLOAD = "changed_payload"
    """The order id is reused with another amount: FingerprintMismatch, nothing runs."""
    CHANGED_PRINCIPAL = "changed_principal"
    """The order id is reused by another merchant: BindingMismatch, nothing runs."""


FIRST_DELIVERY = (
    Fault.TIMEOUT_AFTER_SUCCESS,
    Fault.PROVIDER_UNAVAILABLE,
    Fault.DECLINED,
    Fault.CRASHED_WORKER,
    Fault.LATE_STALE_RESPONSE,
)
IN_WORKER_PROCESS = (Fault.CRASHED_WORKER, Fault.LATE_STALE_RESPONSE)
EXTRA_DELIVERY = (
    Fault.DUPLICATE_DELIVERY,
    Fault.CONCURRENT_DUPLICATE,
    Fault.CHANGED_PAYLOAD,
    Fault.CHANGED_PRINCIPAL,
)

#: Share of the orders given each fault; worker-process faults are capped (each costs a
#: lease of waiting, in parallel).
_SHARE = {
    Fault.TIMEOUT_AFTER_SUCCESS: 0.08,
    Fault.PROVIDER_UNAVAILABLE: 0.05,
    Fault.DECLINED: 0.04,
    Fault.CRASHED_WORKER: 0.03,
    Fault.LATE_STALE_RESPONSE: 0.03,
    Fault.DUPLICATE_DELIVERY: 0.10,
    Fault.CONCURRENT_DUPLICATE: 0.04,
    Fault.CHANGED_PAYLOAD: 0.04,
    Fault.CHANGED_PRINCIPAL: 0.04,
}
_PROCESS_CAP = 8
MIN_OPS = len(FIRST_DELIVERY) + 1


@dataclass(frozen=True)
class Order:
    request: ChargeRequest
    merchant: str
    faults: frozenset[Fault] = field(default_factory=frozenset)

    @property
    def order_id(self) -> str:
        return self.request.order_id

    @property
    def operation_id(self) -> str:
        return f"charge:{self.order_id}"

    @property
    def first(self) -> Fault | None:
        return next((f for f in FIRST_DELIVERY if f in self.faults), None)


@dataclass(frozen=True)
class Workload:
    run: str
    seed: int
    orders: list[Order]

    def with_fault(self, fault: Fault) -> list[Order]:
        return [o for o in self.orders if fault in o.faults]

    def injected(self) -> dict[str, int]:
        return {f.value: len(self.with_fault(f)) for f in Fault}


def _count(fault: Fault, ops: int) -> int:
    n = max(1, round(_SHARE[fault] * ops))
    return min(n, _PROCESS_CAP) if fault in IN_WORKER_PROCESS else n


def draw(ops: int, seed: int, run: str) -> Workload:
    """``ops`` orders of run ``run`` (a tag that keeps the ids of two runs apart)."""
    if ops < MIN_OPS:
        raise ValueError(f"the demo needs at least {MIN_OPS} operations")
    rng = random.Random(seed)  # noqa: S311 - a reproducible workload, not a secret
    faults: list[set[Fault]] = [set() for _ in range(ops)]
    indexes = list(range(ops))
    rng.shuffle(indexes)
    # The first delivery meets at most one fault; one order at least stays plain.
    cursor = 0
    for k, fault in enumerate(FIRST_DELIVERY):
        still_to_place = len(FIRST_DELIVERY) - k - 1
        n = max(1, min(_count(fault, ops), ops - 1 - cursor - still_to_place))
        for i in indexes[cursor : cursor + n]:
            faults[i].add(fault)
        cursor += n
    # Extra deliveries go to orders settled by this process (not the worker processes).
    here = [i for i in range(ops) if not faults[i] & set(IN_WORKER_PROCESS)]
    for fault in EXTRA_DELIVERY:
        for i in rng.sample(here, min(_count(fault, ops), len(here))):
            faults[i].add(fault)
    orders = [
        Order(
            request=ChargeRequest(
                order_id=f"{run}-{i + 1:04d}",
                customer_id=f"cus_{rng.randrange(1, 40):03d}",
                amount=rng.randrange(100, 50_000),
            ),
            merchant=f"m{rng.randrange(1, 6)}",
            faults=frozenset(faults[i]),
        )
        for i in range(ops)
    ]
    return Workload(run=run, seed=seed, orders=orders)
