"""What the runner knows of its server checks (``AsyncRunner.prepare`` and the periodic
recheck): when they last passed, the evidence that came since, each cluster primary's last
recheck. One object per client, held by the runner that owns the client and shared with
its companions (``AsyncRunner.companion``): a check or a suspicion by any of them is seen
by all, so the console's sessions are refused on an evicting server as soon as the
settler's calls are, and the other way round. No I/O; the runner reads and writes it."""

from __future__ import annotations

import threading

__all__ = ["ServerChecks"]


class ServerChecks:
    """The server checks' state of one client (the runner's fields before companions
    shared it)."""

    def __init__(self, interval: float) -> None:
        #: When the server checks last passed (``time.monotonic()``); None: every check of
        #: ``prepare`` is due, before the first call and after evidence that the server
        #: lost its data or restarted (``suspect``).
        self.checked_at: float | None = None
        #: Counts the evidence (``suspect``, ``dropped``): a check during which new
        #: evidence came read the server as it was before it, and leaves its checks due.
        self.evidence = 0
        #: Counts the evidence that the server lost its data (``suspect``): each runner on
        #: the client loads its own scripts again, in its own full check, once per loss.
        self.losses = 0
        #: Guards the fields (threads of the sync runtime report evidence and end checks at
        #: once); never held across the network.
        self.lock = threading.Lock()
        #: Seconds between two reads of the primaries' ``maxmemory-policy``.
        self.interval = interval
        #: A cluster's periodic recheck, per primary: node name -> (the evidence count and
        #: the ``monotonic()`` time of its last passed check). A call rechecks only the
        #: primary that holds its key, so a hung primary holds up only its own calls.
        self.nodes: dict[str, tuple[int, float]] = {}
