"""What the runner knows of its server checks (``AsyncRunner.prepare`` and the periodic
recheck): when they last passed, the evidence that came since, each cluster primary's last
recheck. One object per client, held by the runner that owns the client and shared with
its companions (``AsyncRunner.companion``): a check or a suspicion by any of them is seen
by all, so the console's sessions are refused on an evicting server as soon as the
settler's calls are, and the other way round. No I/O; the runner reads and writes it."""

from __future__ import annotations

import threading
from typing import Any

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
        #: The cluster primaries whose policy a check ever read (the start-up's, a recheck's):
        #: a call to any other (a replica a failover promoted, a primary added since) checks
        #: it first, however recent the last check.
        self.judged: set[str] = set()

    def unjudged(self, node: Any) -> bool:
        """Whether the cluster primary ``node`` (None: a single server, or a call without
        a key) was never read by a check: a replica a failover promoted (redis-py follows a
        failover on its own, reading the slot map again and repeating the command on the
        promoted node before settle sees an error), or a primary added since. A replica's
        policy is read at start-up only, and may have been changed since (or the replica
        attached since): that primary is checked before the first call routed to it."""
        return node is not None and str(node.name) not in self.judged

    def forget(self, name: str) -> None:
        """The cluster node ``name`` is no longer known to be a primary the checks read:
        its policy is read again before the next call routed to it."""
        with self.lock:
            self.judged.discard(name)
            self.nodes.pop(name, None)
