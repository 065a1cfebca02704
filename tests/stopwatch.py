"""A clock for the upper bounds of tests on a loaded machine.

An upper bound on how long something took tells a timeout from a hang, or one wait from
two; on a CI worker beside three busy ones, wall time also counts every moment the test
was ready to run and waited for a CPU, and a bound with a second of slack was passed by
that alone. :meth:`Stopwatch.unloaded` is the wall time less that wait, which Linux counts
per thread (the run delay, the second field of ``/proc/<id>/schedstat``): the time the
thing measured took, however loaded the machine. Where the kernel does not count it, it is
the wall time, as before. Lower bounds take :meth:`Stopwatch.elapsed`: load only lengthens.

Only the measuring thread's wait is taken off, never a server's: a server's waits for a CPU
(its timer's wake-ups every 1/hz, say) mostly overlap the time the test spends blocked on
its reply, so taking them off as well took off time the wait really lasted (four 0.3 s
WAITs, 1.2 s at the least, read 1.175 s beside busy loops, where 1.1 s tells one try from
four). A thread blocked on a timer or a socket accrues no run delay: a late or doubled
timer, or the test's own busy CPU, stays in the reading.
"""

from __future__ import annotations

import time

__all__ = ["Stopwatch", "run_delay"]


def run_delay(path: str = "/proc/thread-self/schedstat") -> float:
    """Seconds the thread (or process) of ``path`` has waited for a CPU; 0.0 unknown."""
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class Stopwatch:
    """Started when made, on the calling thread's time: read it from the thread that made
    it (the run delay is that thread's)."""

    def __init__(self) -> None:
        self._wall = time.monotonic()
        self._delay = run_delay()

    def elapsed(self) -> float:
        """Wall time since the start."""
        return time.monotonic() - self._wall

    def unloaded(self) -> float:
        """Wall time since the start, less the time spent waiting for a CPU since."""
        wall = self.elapsed()
        return max(0.0, wall - (run_delay() - self._delay))
