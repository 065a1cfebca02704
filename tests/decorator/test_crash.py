"""Real worker processes: one is killed with SIGKILL mid-call, or frozen with SIGSTOP (its
heartbeat stops), and another worker retries. The provider must see one charge, and the
first worker's late response must never be reported as committed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from settle import QuarantineKind, Reservation, Settler, State, Verdict
from tests.decorator.payments import ChargeRequest, Receipt, sync_charge
from tests.decorator.provider import Provider

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.faults


class Worker:
    def __init__(self, args: list[str], log: Path) -> None:
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.decorator._worker", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )

    def line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        raw = self.proc.stdout.readline()
        assert raw, f"worker exited without output; see {self._log.name}"
        return dict(json.loads(raw))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self._log.close()


@pytest.fixture
def spawn(redis_url: str, namespace: str, provider: Provider, tmp_path: Path) -> Iterator[Any]:
    workers: list[Worker] = []

    def start(mode: str, order: str, lease: float) -> Worker:
        log = tmp_path / f"worker{len(workers)}.log"
        worker = Worker([mode, redis_url, namespace, provider.url, order, str(lease)], log)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_killed_worker_is_taken_over_with_one_effect_and_its_late_completion_quarantined(
    mode: str, spawn: Any, settler: Settler, provider: Provider
) -> None:
    provider.script("k-1", "slow:30")  # charges, then holds the answer
    first = spawn(mode, "k-1", 1.0)
    started = first.line()
    assert started["event"] == "attempt"
    assert provider.charged.wait(30)
    first.proc.send_signal(signal.SIGKILL)  # dies after the provider charged, before settling
    first.proc.wait()

    second = spawn(mode, "k-1", 1.0)
    retried = second.line()
    outcome = second.line()
    assert second.proc.wait(30) == 0

    assert retried["generation"] > started["generation"]
    assert outcome["event"] == "result"
    receipt = Receipt.model_validate(outcome["receipt"])
    assert provider.effects("k-1") == 1
    assert receipt.fencing_token == started["generation"]  # the first attempt's charge
    record = settler.get("charge:k-1")
    assert record is not None
    assert (record.state, record.generation) == (State.COMPLETED, retried["generation"])
    assert record.value(Receipt) == receipt
    details = [o.detail for o in settler.attempts("charge:k-1") if o.action == "reserve"]
    assert "lease_expired" in details

    # The killed worker's response arrives late: settling its old reservation is rejected.
    old = Reservation(
        operation_id="charge:k-1",
        fingerprint=record.fingerprint,
        fingerprint_version=record.fingerprint_version,
        binding=record.binding,
        generation=started["generation"],
        attempt_id=started["attempt_id"],
    )
    late = settler.complete(old, receipt.model_copy(update={"charge_id": "ch_late"}))
    assert late.verdict is Verdict.QUARANTINED
    assert late.kind is QuarantineKind.STALE_GENERATION
    after = settler.get("charge:k-1")
    assert after is not None
    assert after.version == record.version
    assert after.value(Receipt) == receipt
    [entry] = settler.quarantine.list(operation_id="charge:k-1")
    assert entry.ref == late.quarantine_id
    assert entry.presented.generation == started["generation"]
    assert b"ch_late" in entry.payload.data


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_frozen_worker_loses_to_a_takeover_and_its_result_is_not_committed(
    mode: str, spawn: Any, settler: Settler, provider: Provider
) -> None:
    provider.script("f-1", "slow:1")
    first = spawn(mode, "f-1", 0.6)
    started = first.line()
    assert provider.charged.wait(30)
    first.proc.send_signal(signal.SIGSTOP)  # its heartbeat stops (a long pause, a frozen VM)
    try:
        # Another worker retries: it waits out the lease, takes over, and settles.
        charge = sync_charge(settler, provider.url, wait=30.0, lease=5.0)
        receipt = charge(ChargeRequest(order_id="f-1", amount=1250))
    finally:
        first.proc.send_signal(signal.SIGCONT)
    outcome = first.line()
    assert first.proc.wait(30) == 0

    record = settler.get("charge:f-1")
    assert record is not None
    assert record.generation > started["generation"]
    assert record.value(Receipt) == receipt
    assert provider.effects("f-1") == 1
    # The frozen worker woke up with the provider's answer; it was not reported committed.
    assert outcome["event"] == "stale"
    assert (outcome["state"], outcome["generation"]) == ("completed", record.generation)
