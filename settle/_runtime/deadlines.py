"""One timer for the asyncio lane's deadlines, where redis-py arms one per send and per read.

redis-py bounds every send and every read of an asyncio connection by its
``socket_timeout`` with an ``asyncio.timeout`` of its own: a ``Timeout`` object, a
``TimerHandle`` pushed on the loop's heap (whose order is a Python ``__lt__``) and cancelled
again, four per script call sent alone, about a sixth of a new-key HTTP request's client CPU
(docs/benchmarks.md, "HTTP endpoints over a real server"). The lane's exchanges are watched
here instead: each is a :class:`Watch` with the same deadline, kept in arrival order, and one
timer per lane is due at the earliest deadline still open. A watch past its deadline is
stopped as ``asyncio.timeout`` stops it: its task is cancelled, and :meth:`Deadlines.finish`
takes the cancellation back and tells the caller to raise the timeout in its place (redis-py's
``TimeoutError``, with redis-py's text), unless someone else cancelled the task too.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque

__all__ = ["UNBOUNDED", "Deadlines", "Watch"]

#: ``read_response(timeout=UNBOUNDED)``: redis-py's read without a timeout of its own.
UNBOUNDED = math.inf


class Watch:
    """One send, then the reads of its replies, bounded by ``deadline`` (loop time)."""

    __slots__ = ("_deadlines", "cancelling", "deadline", "done", "expired", "task")

    def __init__(self, deadlines: Deadlines, deadline: float, task: asyncio.Task[object]) -> None:
        self._deadlines = deadlines
        self.deadline = deadline
        self.task = task
        #: The task's cancellation count when the watch started (as ``asyncio.timeout``
        #: keeps it): a cancellation beyond it is someone else's, passed on.
        self.cancelling = task.cancelling()
        self.expired = False
        self.done = False

    # What redis-py asks of the timeout around a read (``_active_read_timeout``): a
    # maintenance notification relaxes the read's deadline, and puts it back, through these.

    def when(self) -> float | None:
        return None if self.deadline == math.inf else self.deadline

    def reschedule(self, when: float | None) -> None:
        self._deadlines.move(self, math.inf if when is None else when)


class Deadlines:
    """The open watches of one lane on one event loop, and the one timer due at the earliest
    of their deadlines (armed when a watch is due sooner than the timer; a timer that finds
    the watches it was armed for ended looks again at what is open)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._open: deque[Watch] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._due = math.inf

    def start(self, seconds: float | None) -> Watch | None:
        """A watch of ``seconds`` from now for the current task (None for no bound, as
        redis-py leaves a connection without ``socket_timeout`` unbounded)."""
        if not seconds:
            return None
        task = asyncio.current_task()
        assert task is not None, "the lane sends from a task"
        watch = Watch(self, self._loop.time() + seconds, task)
        self._open.append(watch)
        if watch.deadline < self._due:
            self._arm(watch.deadline)
        return watch

    def again(self, watch: Watch | None, seconds: float | None) -> None:
        """Bound the next step of ``watch`` (a read) by ``seconds`` from now, as redis-py
        bounds each read by its own timeout."""
        if watch is not None:
            self.move(watch, self._loop.time() + seconds if seconds else math.inf)

    def move(self, watch: Watch, deadline: float) -> None:
        """``watch`` is due at ``deadline`` (loop time) now."""
        if watch.done:  # its deadline passed with an error reply read whole: watched again
            watch.done = False
            self._open.append(watch)
        watch.deadline = deadline
        if deadline < self._due:
            self._arm(deadline)

    def finish(self, watch: Watch | None, error: BaseException | None = None) -> bool:
        """End ``watch``. True when ``error`` is the cancellation its deadline made: the
        caller raises the timeout instead. An expired watch's cancellation is taken back
        whatever ended the exchange, as ``asyncio.timeout`` takes its own back."""
        if watch is None:
            return False
        watch.done = True
        opened = self._open
        while opened and opened[0].done:
            opened.popleft()
        if not watch.expired:
            return False
        watch.expired = False  # taken back once
        return watch.task.uncancel() <= watch.cancelling and isinstance(
            error, asyncio.CancelledError
        )

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._expire)
        self._due = when

    def _expire(self) -> None:
        """The timer is due: cancel the task of each open watch past its deadline; the timer
        is armed again for the earliest deadline left."""
        self._timer, self._due = None, math.inf
        now = self._loop.time()
        still: deque[Watch] = deque()
        first = math.inf
        for watch in self._open:
            if watch.done:
                continue
            if watch.deadline <= now:
                watch.expired = True
                watch.task.cancel()
            else:
                still.append(watch)
                first = min(first, watch.deadline)
        self._open = still
        if still and first < math.inf:
            self._arm(first)
