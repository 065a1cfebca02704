"""tests/stopwatch.py's clock never reads a wait as shorter than it was: what it takes off
the wall time is only the time the measuring thread itself was ready to run and kept
waiting for a CPU, never another process's (a server's waits overlap the test's own, and
taking them off let four 0.3 s WAITs, 1.2 s at least, read as 1.175 s, near the 1.1 s
bound meant to tell them from one)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.stopwatch import Stopwatch, run_delay

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/thread-self/schedstat"), reason="the kernel counts no run delay"
)


@pytest.fixture
def starved() -> Iterator[list[int]]:
    """Two busy processes on one CPU: each waits for it about half of the time."""
    cpu = min(os.sched_getaffinity(0))
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(2)
    ]
    try:
        for p in busy:
            os.sched_setaffinity(p.pid, {cpu})
        yield [p.pid for p in busy]
    finally:
        for p in busy:
            p.kill()
            p.wait()


def test_a_sleep_reads_no_shorter_beside_processes_waiting_for_a_cpu(starved: list[int]) -> None:
    before = sum(run_delay(f"/proc/{pid}/schedstat") for pid in starved)
    clock = Stopwatch()
    time.sleep(0.5)
    took = clock.unloaded()
    waited = sum(run_delay(f"/proc/{pid}/schedstat") for pid in starved) - before
    assert waited > 0.2, waited  # the others did wait for a CPU meanwhile
    assert 0.5 <= took < 0.5 + 0.2, took  # this thread slept 0.5 s: none of it was load


def test_the_clock_takes_no_other_process() -> None:
    with pytest.raises(TypeError):
        Stopwatch(os.getpid())  # type: ignore[call-arg]
