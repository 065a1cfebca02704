"""A 3-primary Redis Cluster whose first primary can be frozen (SIGSTOP, as a GC-paused VM
or a partition hangs it), and two operation ids of one namespace: one on that primary, one
on a healthy primary. For the heartbeat tests: a renewal held by the frozen primary must
not hold up the healthy one's."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from redis.crc import key_slot

from settle._core.keys import Keys
from tests.cluster.cluster_support import SLOTS, LocalCluster

SHARDS = 16
PRIMARIES = 3


@dataclass
class SplitCluster:
    cluster: LocalCluster
    namespace: str
    frozen_op: str
    """A name (an operation id, or what ``op_of`` makes one of) whose keys live on
    primary 0, the one :meth:`freeze` stops."""
    healthy_op: str
    """A name whose keys live on primary 1, which keeps answering."""
    op_of: Callable[[str], str] = str
    """What turns a name into the operation id it stands for."""

    def frozen_ops(self, count: int) -> list[str]:
        """``count`` names whose keys live on primary 0 (``frozen_op`` first)."""
        return _names_on(self.namespace, self.op_of, 0, count)

    @property
    def seeds(self) -> list[tuple[str, int]]:
        return self.cluster.startup_nodes

    @contextmanager
    def frozen_after(self, started: Callable[[], bool], seconds: float) -> Iterator[None]:
        """Once ``started()`` (polled from this thread), freeze primary 0 for ``seconds``,
        then run the block while it is still frozen; thaw it after the block, whatever
        happened (before a test waits for anything on that primary)."""
        deadline = time.monotonic() + 10
        while not started():
            assert time.monotonic() < deadline, "the attempts never started"
            time.sleep(0.01)
        self.freeze()
        try:
            time.sleep(seconds)
            yield
        finally:
            self.thaw()

    def freeze(self) -> None:
        self.cluster.freeze(0)

    def thaw(self) -> None:
        self.cluster.thaw(0)


@contextmanager
def split_cluster(op_of: Callable[[str], str] = str) -> Iterator[SplitCluster]:
    """``op_of`` turns a name into the operation id it stands for (an HTTP guard's
    idempotency key into its scoped id); by default a name is the operation id."""
    # Without full coverage required, the healthy primaries serve while one is frozen.
    cluster = LocalCluster(
        primaries=PRIMARIES, extra_args=["--cluster-require-full-coverage", "no"]
    ).start()
    namespace = f"split{uuid.uuid4().hex[:8]}"
    frozen_op, healthy_op = (_names_on(namespace, op_of, p, 1)[0] for p in (0, 1))
    split = SplitCluster(cluster, namespace, frozen_op, healthy_op, op_of)
    try:
        yield split
    finally:
        split.thaw()
        cluster.close()


def _names_on(namespace: str, op_of: Callable[[str], str], primary: int, count: int) -> list[str]:
    """The first ``count`` names ``charge-<i>`` whose keys live on ``primary``."""
    keys = Keys(namespace, SHARDS)
    names: list[str] = []
    for i in itertools.count():
        op = f"charge-{i}"
        _, record, _ = keys.of(op_of(op))
        if min(key_slot(record.encode()) // (SLOTS // PRIMARIES), PRIMARIES - 1) == primary:
            names.append(op)
            if len(names) == count:
                return names
    raise AssertionError("unreachable")
