"""A real Redis Cluster on loopback ports, built from ``settle.embedded``'s redis-server.

The slots are assigned and the nodes introduced with plain commands (CLUSTER ADDSLOTS,
CLUSTER MEET), so no ``redis-cli`` is needed and the same code works on Redis 6.2 and 7.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import redis
from redis.crc import key_slot

from settle.embedded import EmbeddedRedis, free_port
from settle.errors import ConfigurationError

SLOTS = 16384
BUS_OFFSET = 10000  # a node also listens on port + 10000 for the cluster bus


def primary_of(key: str, primaries: int) -> int:
    """The index of the primary of a :class:`LocalCluster` of ``primaries`` that serves
    ``key``'s slot (before any slot moves)."""
    return min(key_slot(key.encode()) // (SLOTS // primaries), primaries - 1)


def node_acks(client: redis.Redis, replicas: int = 1, timeout_ms: int = 1000) -> int:
    """``tests.faults.servers.acks`` for a cluster node: how many replicas have every write
    it took so far. The write WAIT needs on its own connection (Valkey answers one that
    wrote nothing at once) is a key of a slot the node serves, found by the MOVED of the
    others: on a cluster node a PUBLISH goes by the cluster bus, not to its replicas."""
    for n in range(SLOTS):
        try:
            client.set(f"settle-tests:wait:{n}", b"", px=60_000)
        except redis.exceptions.MovedError:
            continue
        return int(client.execute_command("WAIT", replicas, timeout_ms))
    raise AssertionError("the node serves no slot")


def cluster_port() -> int:
    """A free port whose cluster-bus port (port + 10000) is free too."""
    for _ in range(200):
        port = free_port()
        if port + BUS_OFFSET >= 65536:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port + BUS_OFFSET))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


@dataclass
class LocalCluster:
    """``primaries`` nodes, each owning an equal run of the 16384 slots, and ``replicas``
    replicas of each. ``nodes`` lists the primaries first, then primary i's replicas at
    ``primaries + i * replicas + j``."""

    primaries: int = 3
    replicas: int = 0
    extra_args: list[str] = field(default_factory=list)
    nodes: list[EmbeddedRedis] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.nodes[0].url

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", node.port) for node in self.nodes]

    def client(self, index: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.nodes[index].port)

    def replica_of(self, primary: int, j: int = 0) -> int:
        return self.primaries + primary * self.replicas + j

    def _start_node(self) -> EmbeddedRedis:
        """A cluster node on a free port pair (port, port + 10000). Another process (a
        parallel test worker) can take either between cluster_port() and the node's bind:
        the node then refuses to start, and another pair is chosen."""
        for tries_left in range(3, -1, -1):
            node = EmbeddedRedis(
                port=cluster_port(),
                extra_args=[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                    *self.extra_args,
                ],
            )
            try:
                return node.start()
            except ConfigurationError:
                node.close()
                if not tries_left:
                    raise
        raise AssertionError("unreachable")

    def start(self, timeout: float = 20.0) -> LocalCluster:
        try:
            for _ in range(self.primaries * (1 + self.replicas)):
                self.nodes.append(self._start_node())
            per = SLOTS // self.primaries
            for i in range(self.primaries):
                low = i * per
                high = SLOTS if i == self.primaries - 1 else (i + 1) * per
                with self.client(i) as c:
                    c.execute_command("CLUSTER SET-CONFIG-EPOCH", i + 1)
                    c.execute_command("CLUSTER ADDSLOTS", *range(low, high))
            with self.client(0) as first:
                for node in self.nodes[1:]:
                    first.execute_command("CLUSTER MEET", "127.0.0.1", node.port)
            self._wait(lambda i: self._known(i) == len(self.nodes), timeout)
            for i in range(self.primaries):
                with self.client(i) as c:
                    primary_id = c.execute_command("CLUSTER MYID").decode()
                for j in range(self.replicas):
                    with self.client(self.replica_of(i, j)) as r:
                        self._replicate(r, primary_id, timeout)
            self.wait_ok(timeout)
        except BaseException:
            self.close()
            raise
        return self

    @staticmethod
    def _replicate(replica: redis.Redis, primary_id: str, timeout: float) -> None:
        """CLUSTER REPLICATE, again while the replica has the primary's address but not yet
        its id from the handshake ("Unknown node")."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                replica.execute_command("CLUSTER REPLICATE", primary_id)
                return
            except redis.ResponseError as exc:
                if "Unknown node" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _known(self, index: int) -> int:
        with self.client(index) as c:
            return int(c.cluster("INFO")["cluster_known_nodes"])

    def _wait(self, ready: Callable[[int], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(ready(i) for i in range(len(self.nodes))):
                return
            time.sleep(0.05)
        raise RuntimeError("the cluster did not come up")

    def wait_ok(self, timeout: float = 20.0) -> None:
        """Every node sees every other and cluster_state:ok; every replica is in sync."""
        self._wait(self._node_ok, timeout)

    def _node_ok(self, index: int) -> bool:
        with self.client(index) as c:
            info = c.cluster("INFO")
            known = int(info["cluster_known_nodes"])
            if info["cluster_state"] != "ok" or known != len(self.nodes):
                return False
            if index < self.primaries:
                return int(c.info("replication")["connected_slaves"]) == self.replicas
            return c.info("replication").get("master_link_status") == "up"

    def node_id(self, index: int) -> str:
        with self.client(index) as c:
            return str(c.execute_command("CLUSTER MYID").decode())

    def serving(self, slot: int) -> int:
        """The index of the primary that serves ``slot`` now (as node 0 sees it)."""
        with self.client(0) as c:
            ranges = c.execute_command("CLUSTER SLOTS")
        port = next(int(r[2][1]) for r in ranges if int(r[0]) <= slot <= int(r[1]))
        return next(i for i in range(self.primaries) if self.nodes[i].port == port)

    def keys_in_slot(self, index: int, slot: int) -> list[str]:
        """The keys of ``slot`` that node ``index`` (a primary or a replica) holds itself."""
        with self.client(index) as c:
            keys = c.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
        return sorted(k.decode() if isinstance(k, bytes) else k for k in keys)

    def migrate(self, slot: int, source: int, target: int) -> list[str]:
        """Start moving ``slot`` from primary ``source`` to ``target`` (IMPORTING, then
        MIGRATING, as redis-cli's resharding does) and move the keys it holds: the slot is
        still the source's, which answers ASK for every key it does not hold. Returns the
        keys moved."""
        self.start_migrating(slot, source, target)
        keys = self.keys_in_slot(source, slot)
        if keys:
            self.move_keys(source, target, keys)
        return keys

    def start_migrating(self, slot: int, source: int, target: int) -> None:
        """Mark ``slot`` IMPORTING on ``target`` and MIGRATING on ``source``, moving no key."""
        target_id, source_id = self.node_id(target), self.node_id(source)
        with self.client(source) as src, self.client(target) as dst:
            dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
            src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)

    def move_keys(self, source: int, target: int, keys: list[str]) -> None:
        """MIGRATE ``keys`` from node ``source`` to node ``target`` (no REPLACE)."""
        port = self.nodes[target].port
        with self.client(source) as src:
            src.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", *keys)

    def migrated(self, slot: int, target: int) -> None:
        """End the move of :meth:`migrate`: every primary gives ``slot`` to ``target``, the
        target first (as ``redis-cli --cluster reshard``): a node told before the target
        redirects (MOVED) to a target still importing, which sends the client back."""
        target_id = self.node_id(target)
        for i in sorted(range(self.primaries), key=lambda i: i != target):
            with self.client(i) as c:
                c.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)

    def freeze(self, index: int) -> None:
        """Stop node ``index`` (SIGSTOP, as a GC-paused VM or a partition hangs it): its
        sockets stay open and it answers nothing until :meth:`thaw`."""
        os.kill(self._pid(index), signal.SIGSTOP)

    def thaw(self, index: int) -> None:
        os.kill(self._pid(index), signal.SIGCONT)

    @contextmanager
    def frozen(self, index: int) -> Iterator[None]:
        """Node ``index`` frozen for the block, thawed after it whatever happened."""
        self.freeze(index)
        try:
            yield
        finally:
            self.thaw(index)

    def _pid(self, index: int) -> int:
        process = self.nodes[index].process
        assert process is not None
        return process.pid

    def close(self) -> None:
        for node in self.nodes:
            node.close()
        self.nodes.clear()
