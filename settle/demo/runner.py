"""Runs the demo workload: worker threads in this process and, for the crash and freeze
faults, worker processes that are really killed (SIGKILL) or frozen (SIGSTOP/SIGCONT).

Every call goes through ``@settler.operation`` (:mod:`settle.demo.charge`).
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from settle._sync.settler import Settler
from settle.attempt import Attempt
from settle.demo.charge import ChargeRequest, Receipt, make_charge
from settle.demo.plan import Fault, Order, Workload, draw
from settle.demo.processes import WorkerProcess
from settle.demo.provider import Provider
from settle.demo.report import DemoReport, build_report
from settle.demo.server import server_now
from settle.errors import BindingMismatch, FingerprintMismatch, OperationFailed, SettleError

__all__ = ["DemoOptions", "Tally", "run_demo"]


@dataclass(frozen=True)
class DemoOptions:
    redis_url: str
    namespace: str = "demo"
    shards: int | None = None
    ops: int = 200
    workers: int = 8
    seed: int = 1
    lease: float = 1.0
    """Seconds: how soon a crashed or frozen worker's lease expires."""


@dataclass
class Call:
    """What one call of the decorated charge gave."""

    outcome: str  # result | failed | fingerprint_mismatch | binding_mismatch | error
    ran: bool
    receipt: Receipt | None = None
    error: str | None = None


@dataclass
class Tally:
    """What the demo process saw (thread-safe through ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: int = 0
    replays: int = 0
    calls_by_fault: dict[str, list[Call]] = field(default_factory=lambda: defaultdict(list))
    first_calls: dict[str, Call] = field(default_factory=dict)
    pairs: list[tuple[Call, Call]] = field(default_factory=list)
    """Concurrent duplicates: the two calls made at the same time."""
    process_events: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def add(self, order: Order, call: Call, fault: Fault | None = None) -> None:
        with self.lock:
            self.calls += 1
            if not call.ran and call.outcome in ("result", "failed"):
                self.replays += 1
            if fault is None:
                self.first_calls.setdefault(order.order_id, call)
            else:
                self.calls_by_fault[fault.value].append(call)
            if call.outcome == "error":
                self.errors.append(f"{order.operation_id}: {call.error}")


class _Runs(threading.local):
    ran = False


def run_demo(
    options: DemoOptions,
    *,
    advance: Callable[[int], None] | None = None,
) -> DemoReport:
    """Run the workload against ``options.redis_url`` and report what happened.
    ``advance(n)`` is called as orders finish (for a progress bar)."""
    run = uuid.uuid4().hex[:6]
    workload = draw(options.ops, options.seed, run)
    shards: dict[str, Any] = {} if options.shards is None else {"shards": options.shards}
    settler = Settler.from_url(options.redis_url, namespace=options.namespace, **shards)
    children: list[WorkerProcess] = []
    try:
        settler.check()
        started = server_now(settler)
        clock = time.monotonic()
        with Provider() as provider:
            _script(provider, workload)
            tally = Tally()
            runs = _Runs()

            def before(request: ChargeRequest, attempt: Attempt) -> None:
                del request, attempt
                runs.ran = True

            charge = make_charge(
                settler,
                provider.url,
                lease=options.lease,
                wait=10 * options.lease + 5,
                before=before,
            )

            def call(request: ChargeRequest, merchant: str) -> Call:
                runs.ran = False
                try:
                    receipt = charge(request, merchant)
                except OperationFailed as exc:
                    return Call("failed", runs.ran, error=exc.failure.error_type)
                except FingerprintMismatch:
                    return Call("fingerprint_mismatch", runs.ran)
                except BindingMismatch:
                    return Call("binding_mismatch", runs.ran)
                except (SettleError, OSError, Exception) as exc:  # noqa: BLE001 - counted
                    return Call("error", runs.ran, error=f"{type(exc).__name__}: {exc}")
                return Call("result", runs.ran, receipt=receipt)

            runner = _Runner(options, settler, provider, workload, tally, call, advance, children)
            runner.run()
            elapsed = time.monotonic() - clock
            return build_report(
                settler=settler,
                workload=workload,
                provider=provider.stats,
                tally=tally,
                started=started,
                elapsed=elapsed,
                options=options,
            )
    finally:
        for child in children:
            child.kill()
        settler.close()


def _script(provider: Provider, workload: Workload) -> None:
    behaviour = {
        Fault.TIMEOUT_AFTER_SUCCESS: "slow",
        Fault.PROVIDER_UNAVAILABLE: "unavailable",
        Fault.DECLINED: "decline",
    }
    for order in workload.orders:
        first = order.first
        if first in behaviour:
            provider.script(order.order_id, behaviour[first])


CallFn = Callable[[ChargeRequest, str], Call]


class _Runner:
    def __init__(
        self,
        options: DemoOptions,
        settler: Settler,
        provider: Provider,
        workload: Workload,
        tally: Tally,
        call: CallFn,
        advance: Callable[[int], None] | None,
        children: list[WorkerProcess],
    ) -> None:
        self.options = options
        self.settler = settler
        self.provider = provider
        self.workload = workload
        self.tally = tally
        self.call = call
        self.advance = advance or (lambda _n: None)
        self.children = children
        self._left = len(workload.orders)
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._failure: BaseException | None = None

    def run(self) -> None:
        jobs: queue.Queue[Order] = queue.Queue()
        in_process = [
            o
            for o in self.workload.orders
            if not o.faults & {Fault.CRASHED_WORKER, Fault.LATE_STALE_RESPONSE}
        ]
        for order in in_process:
            jobs.put(order)
        threads = [
            threading.Thread(target=self._process_worker, args=(mode, fault), daemon=True)
            for mode, fault in (
                ("crash", Fault.CRASHED_WORKER),
                ("freeze", Fault.LATE_STALE_RESPONSE),
            )
        ]
        threads += [
            threading.Thread(target=self._worker, args=(jobs,), daemon=True, name=f"demo-{i}")
            for i in range(self.options.workers)
        ]
        for t in threads:
            t.start()
        while not self._done.wait(0.1):  # interruptible: Ctrl-C lands here
            pass
        if self._failure is not None:
            raise self._failure

    def _finished(self, n: int = 1) -> None:
        self.advance(n)
        with self._lock:
            self._left -= n
            if self._left <= 0:
                self._done.set()

    def _abort(self, exc: BaseException) -> None:
        with self._lock:
            if self._failure is None:
                self._failure = exc
        self._done.set()

    # -- this process -----------------------------------------------------------------

    def _worker(self, jobs: queue.Queue[Order]) -> None:
        while True:
            try:
                order = jobs.get_nowait()
            except queue.Empty:
                return
            try:
                self._deliver(order)
            except BaseException as exc:  # noqa: BLE001 - surfaced by run()
                self._abort(exc)
                return
            self._finished()

    def _deliver(self, order: Order) -> None:
        request, merchant = order.request, order.merchant
        if Fault.CONCURRENT_DUPLICATE in order.faults:
            barrier = threading.Barrier(2)
            twin: list[Call] = []

            def duplicate() -> None:
                barrier.wait()
                twin.append(self.call(request, merchant))

            thread = threading.Thread(target=duplicate, daemon=True)
            thread.start()
            barrier.wait()
            first = self.call(request, merchant)
            thread.join()
            self.tally.add(order, first)
            self.tally.add(order, twin[0], Fault.CONCURRENT_DUPLICATE)
            with self.tally.lock:
                self.tally.pairs.append((first, twin[0]))
        else:
            self.tally.add(order, self.call(request, merchant))
        if Fault.DUPLICATE_DELIVERY in order.faults:
            self.tally.add(order, self.call(request, merchant), Fault.DUPLICATE_DELIVERY)
        if Fault.CHANGED_PAYLOAD in order.faults:
            changed = request.model_copy(update={"amount": request.amount + 1})
            self.tally.add(order, self.call(changed, merchant), Fault.CHANGED_PAYLOAD)
        if Fault.CHANGED_PRINCIPAL in order.faults:
            other = f"{merchant}-other"
            self.tally.add(order, self.call(request, other), Fault.CHANGED_PRINCIPAL)

    # -- worker processes ---------------------------------------------------------------

    def _process_worker(self, mode: str, fault: Fault) -> None:
        orders = self.workload.with_fault(fault)
        if not orders:
            return
        try:
            self._run_process(mode, orders)
        except BaseException as exc:  # noqa: BLE001 - surfaced by run()
            self._abort(exc)
            return
        self._finished(len(orders))

    def _run_process(self, mode: str, orders: list[Order]) -> None:
        opts = self.options
        worker = WorkerProcess(
            redis_url=opts.redis_url,
            namespace=opts.namespace,
            shards=self.settler.config.shards,
            provider_url=self.provider.url,
            lease=opts.lease,
        )
        self.children.append(worker)
        worker.start(orders)
        with self.tally.lock:  # each ran the function (the provider charged it): calls too
            self.tally.calls += len(orders)
        if mode == "crash":
            worker.crash()
            self._take_over(orders)
            return
        worker.freeze()
        self._take_over(orders)
        for event in worker.resume(len(orders)):
            with self.tally.lock:
                self.tally.process_events[event["order_id"]] = event

    def _take_over(self, orders: list[Order]) -> None:
        """Another worker (a thread here) retries each order: it waits for the dead or
        frozen worker's lease to expire, takes over under a new generation and completes."""
        threads = [
            threading.Thread(
                target=lambda o=o: self.tally.add(o, self.call(o.request, o.merchant)),
                daemon=True,
            )
            for o in orders
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
