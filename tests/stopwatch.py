"""A clock for the upper bounds of tests on a loaded machine.

An upper bound on how long something took tells a timeout from a hang, or one wait from
two; on a CI worker beside three busy ones, wall time also counts every moment the test
was ready to run and waited for a CPU, and a bound with a second of slack was passed by
that alone. :meth:`Stopwatch.unloaded` is the wall time less that wait, which Linux counts
per thread (the run delay, the second field of ``/proc/<id>/schedstat``): the time the
thing measured took, however loaded the machine. Where the kernel does not count it, it is
the wall time, as before. Lower bounds take :meth:`Stopwatch.elapsed`: load only lengthens.
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
    """Started when made: the calling thread's time, and the main threads' of the processes
    ``pids`` (a server the measured wait depends on: its replies are late on a loaded
    machine too). Read it from the thread that made it."""

    def __init__(self, *pids: int) -> None:
        self._paths = ["/proc/thread-self/schedstat", *(f"/proc/{p}/schedstat" for p in pids)]
        self._wall = time.monotonic()
        self._delay = self._delays()

    def _delays(self) -> float:
        return sum(run_delay(path) for path in self._paths)

    def elapsed(self) -> float:
        """Wall time since the start."""
        return time.monotonic() - self._wall

    def unloaded(self) -> float:
        """Wall time since the start, less the time spent waiting for a CPU since."""
        wall = self.elapsed()
        return max(0.0, wall - (self._delays() - self._delay))
