"""A 3-primary Redis Cluster whose first primary can be frozen (SIGSTOP, as a GC-paused VM
or a partition hangs it), and two operation ids of one namespace: one on that primary, one
on a healthy primary. For the heartbeat tests: a renewal held by the frozen primary must
not hold up the healthy one's."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
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
    """An operation id whose keys live on primary 0, the one :meth:`freeze` stops."""
    healthy_op: str
    """An operation id whose keys live on primary 1, which keeps answering."""

    @property
    def seeds(self) -> list[tuple[str, int]]:
        return self.cluster.startup_nodes

    def freeze(self) -> None:
        os.kill(self._pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self._pid, signal.SIGCONT)

    @property
    def _pid(self) -> int:
        process = self.cluster.nodes[0].process
        assert process is not None
        return process.pid


@contextmanager
def split_cluster() -> Iterator[SplitCluster]:
    # Without full coverage required, the healthy primaries serve while one is frozen.
    cluster = LocalCluster(
        primaries=PRIMARIES, extra_args=["--cluster-require-full-coverage", "no"]
    ).start()
    namespace = f"split{uuid.uuid4().hex[:8]}"
    keys = Keys(namespace, SHARDS)
    by_primary: dict[int, str] = {}
    for i in range(10_000):
        op = f"charge-{i}"
        _, record, _ = keys.of(op)
        primary = min(key_slot(record.encode()) // (SLOTS // PRIMARIES), PRIMARIES - 1)
        by_primary.setdefault(primary, op)
        if 0 in by_primary and 1 in by_primary:
            break
    split = SplitCluster(cluster, namespace, by_primary[0], by_primary[1])
    try:
        yield split
    finally:
        split.thaw()
        cluster.close()
