"""The demo's parts without the command line: the provider really counts a second charge
of an order as a duplicate, and the runner is usable as a library."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from settle import Settler
from settle.attempt import Attempt
from settle.cli.demo import _bounded_url, _run, _unreachable
from settle.demo import DemoOptions, Fault, run_demo
from settle.demo.charge import ChargeRequest, ProviderError, post_charge
from settle.demo.plan import draw
from settle.demo.processes import DemoError, WorkerProcess
from settle.demo.provider import Provider
from settle.models import QuarantineKind


def _attempt(key: str, generation: int = 1) -> Attempt:
    return Attempt(
        operation_id="charge:o-1",
        generation=generation,
        number=generation,
        idempotency_key=key,
        attempt_id=f"a{generation}",
    )


def test_provider_deduplicates_a_key_and_counts_a_second_key_as_a_duplicate() -> None:
    order = ChargeRequest(order_id="o-1", customer_id="c-1", amount=1250)
    with Provider() as provider:
        first = post_charge(provider.url, order, _attempt("key-1"))
        again = post_charge(provider.url, order, _attempt("key-1", generation=2))
        assert again == first  # the same key: the same charge, no new effect
        assert provider.stats.effects == 1
        assert provider.stats.duplicate_effects == 0
        # the same order under another key (what an unstable key would do): charged twice
        other = post_charge(provider.url, order, _attempt("key-2"))
        assert other.charge_id != first.charge_id
        assert provider.stats.duplicate_effects == 1
        # a key reused with another request is refused, not charged
        changed = order.model_copy(update={"amount": 99})
        with pytest.raises(ProviderError, match="422"):
            post_charge(provider.url, changed, _attempt("key-1"))
        assert provider.stats.effects == 2


def test_run_demo_as_a_library(redis_url: str, namespace: str) -> None:
    advanced: list[int] = []
    report = run_demo(
        DemoOptions(redis_url=redis_url, namespace=namespace, shards=4, ops=6, workers=3),
        advance=advanced.append,
    )
    assert sum(advanced) == 6
    assert report.ok, report.checks
    assert report.duplicate_effects == 0
    assert report.operations == 6
    for fault in Fault:
        assert report.faults[fault.value].observed == report.faults[fault.value].injected == 1


def test_a_worker_process_gets_the_redis_url_outside_its_command_line(
    redis_url: str, namespace: str
) -> None:
    # The URL may hold a password; any user of the machine reads a command line (ps).
    url = redis_url.replace("redis://", "redis://app:s3cret-in-url@")  # never connects here
    worker = WorkerProcess(
        redis_url=url, namespace=namespace, shards=4, provider_url="http://127.0.0.1:9", lease=1
    )
    try:
        worker.start([])  # no orders: it waits on stdin, running
        cmdline = Path(f"/proc/{worker.process.pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{worker.process.pid}/environ").read_bytes()
    finally:
        worker.kill()
    assert b"s3cret-in-url" not in cmdline
    assert f"SETTLE_DEMO_REDIS_URL={url}".encode() in environ.split(b"\0")


def test_the_report_counts_what_redis_and_the_callers_saw(redis_url: str, namespace: str) -> None:
    """Every number of the report recounted: attempts and takeovers from the attempt logs,
    quarantined responses from the quarantine, calls of the decorated function from the
    workload (one per order, one more per extra delivery, and the call each crashed or frozen
    worker process made: it ran the function and charged the provider)."""
    report = run_demo(
        DemoOptions(redis_url=redis_url, namespace=namespace, shards=4, ops=30, workers=4, seed=3)
    )
    assert report.ok, report.checks
    settler = Settler.from_url(redis_url, namespace=namespace, shards=4)
    try:
        ops = draw(30, 3, report.run).orders
        reserves = Counter(
            a.detail for o in ops for a in settler.attempts(o.operation_id) if a.action == "reserve"
        )
        kinds = Counter(e.kind.value for e in settler.quarantine.list(limit=1000))
    finally:
        settler.close()
    assert report.attempts == sum(reserves.values())
    assert report.takeovers["after_lease_expiry"] == reserves["lease_expired"]
    assert report.takeovers["after_provisional"] == reserves["provisional"]
    assert report.quarantined == {k.value: kinds[k.value] for k in QuarantineKind}
    extra = (
        Fault.DUPLICATE_DELIVERY,
        Fault.CONCURRENT_DUPLICATE,
        Fault.CHANGED_PAYLOAD,
        Fault.CHANGED_PRINCIPAL,
        Fault.CRASHED_WORKER,
        Fault.LATE_STALE_RESPONSE,
    )
    injected = {f: report.faults[f.value].injected for f in Fault}
    assert report.calls == len(ops) + sum(injected[f] for f in extra)


def test_a_worker_process_starts_without_a_warning() -> None:
    """The worker's stderr is what the demo quotes when a worker process fails: runpy's
    warning (``settle.demo.worker`` imported by the package before it ran) stood in for the
    reason."""
    done = subprocess.run(
        [sys.executable, "-m", "settle.demo.worker", "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_a_worker_process_gone_before_it_is_told_to_go_is_a_demo_error(
    redis_url: str, namespace: str
) -> None:
    """A worker process that exited before ``resume`` wrote "go" to it raised
    BrokenPipeError, which the command line takes for a reader of its output that stopped:
    ``settle demo`` ended with exit 0 and no report. It is a DemoError (exit 1), saying so."""
    worker = WorkerProcess(
        redis_url=redis_url,
        namespace=namespace,
        shards=4,
        provider_url="http://127.0.0.1:9",
        lease=1,
    )
    try:
        worker.start([])  # no orders: it waits on stdin, running
        os.kill(worker.process.pid, signal.SIGKILL)  # dies on its own (not reaped: a zombie)
        time.sleep(0.5)
        with pytest.raises(DemoError, match=r"worker process exited \(killed by SIGKILL\)"):
            worker.resume(1)
    finally:
        worker.kill()


@pytest.mark.parametrize(
    ("url", "bounded"),
    [
        ("unix:///tmp/r.sock", "unix:///tmp/r.sock?socket_timeout=5.0&socket_connect_timeout=5.0"),
        (
            "unix:///tmp/r.sock?db=1",
            "unix:///tmp/r.sock?db=1&socket_timeout=5.0&socket_connect_timeout=5.0",
        ),
        (
            "rediss://u:p%23x%40y@h:6380/2?socket_timeout=9",
            "rediss://u:p%23x%40y@h:6380/2?socket_timeout=9&socket_connect_timeout=5.0",
        ),
        (
            "redis://:pw@h/0?socket_timeout=&client_name=a",
            "redis://:pw@h/0?socket_timeout=&client_name=a&socket_timeout=5.0"
            "&socket_connect_timeout=5.0",
        ),
        ("redis://h/0#x", "redis://h/0?socket_timeout=5.0&socket_connect_timeout=5.0#x"),
    ],
)
def test_the_redis_timeout_is_added_to_the_url_and_nothing_else_changes(
    url: str, bounded: str
) -> None:
    """The run's and the worker processes' URL is the user's, byte for byte, with
    ``--redis-timeout`` added where the URL gives none (``unix:///path`` lost its ``//``)."""
    assert _bounded_url(url, 5.0) == bounded


def test_redis_that_stops_answering_ends_the_run_with_exit_3_and_no_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Redis gone when the run's own Redis call (not a worker process's) meets it first:
    ``cannot reach Redis at URL during the run``, exit 3, the password hidden; not a
    traceback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once the socket is closed
    url = f"redis://:s3cret@127.0.0.1:{port}/0"
    bounded = _bounded_url(url, 0.5)
    options = DemoOptions(redis_url=bounded, namespace="demo", shards=4, ops=5, workers=2)
    with pytest.raises(SystemExit) as exited:
        _run(options, lambda: _unreachable(bounded, url))
    assert exited.value.code == 3
    err = capsys.readouterr().err
    assert err.startswith(f"settle: cannot reach Redis at redis://:***@127.0.0.1:{port}/0 during")
    assert "s3cret" not in err
