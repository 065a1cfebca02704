"""A real Redis Sentinel on a loopback port: the same redis-server binary run with
``--sentinel`` over a config file that monitors one primary (quorum 1, a short
``down-after-milliseconds`` so a killed primary is failed over in a few seconds); and
:func:`sentinel_deployment`, a primary, a replica behind a link that can be cut, and a
Sentinel (the fault tests and the benchmarks' deployment rows use it)."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

from settle.embedded import EmbeddedRedis, free_port
from tests.faults.servers import acks
from tests.faults.tcp_proxy import FaultyProxy

SERVICE = "settle-primary"
DOWN_AFTER_MS = 1000


class LocalSentinel(EmbeddedRedis):
    """``LocalSentinel(primary_port).start()``; ``primary()`` is the address it names now."""

    def __init__(self, primary_port: int, binary: str | None = None) -> None:
        super().__init__(port=free_port(), binary=binary)
        conf = Path(self.directory) / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\n"
            "bind 127.0.0.1\n"
            f"dir {self.directory}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} 10000\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        self._conf = conf  # a test may edit it before start(), which only sets its port

    def start(self, timeout: float = 10.0) -> LocalSentinel:
        """Start it on a free port. Another process (a parallel test worker, the other leg
        of ``.ci/run``) can take that port between ``free_port()`` and the sentinel's bind:
        then another port is chosen, as :meth:`EmbeddedRedis.start` does for a server."""
        for _ in range(4):
            if self._start_once_on_port(timeout):
                return self
            self.port = free_port()
        raise RuntimeError(f"the sentinel found every port it chose taken ({self.port})")

    def _start_once_on_port(self, timeout: float) -> bool:
        """True once it answers on ``self.port``; False when the port was taken (it exited
        saying so, or another process's server answers there)."""
        text = self._conf.read_text()
        self._conf.write_text(re.sub(r"^port \d+$", f"port {self.port}", text, count=1, flags=re.M))
        path = self.directory / "redis.log"
        before = path.stat().st_size if path.exists() else 0
        with path.open("ab") as log:
            self.process = subprocess.Popen(
                [self.binary, str(self._conf), "--sentinel", "--loglevel", "notice"],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                said = path.read_bytes()[before:].decode(errors="replace")
                self.process = None
                if "Address already in use" in said:
                    return False
                raise RuntimeError(f"the sentinel exited: {said[-500:]}")
            answering = self._answering_pid()
            if answering == self.process.pid:  # its own, not another's
                return True
            if isinstance(answering, int):  # another process's server holds the port
                self.stop()
                return False
            time.sleep(0.02)
        raise RuntimeError("the sentinel did not answer")

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True, socket_timeout=2)

    def primary(self) -> int:
        with self.client() as c:
            _, port = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
            return int(port)

    def switched_to(self, port: int) -> bool:
        """The failover to ``port`` is over: the Sentinel's master entry is that node and no
        failover is in progress. (``primary()`` names the promoted node while the failover
        is still reconfiguring; an old primary that restarts then can win back its role.)"""
        with self.client() as c:
            info = c.sentinel_master(SERVICE)
        return int(info["port"]) == port and "failover_in_progress" not in info["flags"]

    def replicas(self) -> int:
        with self.client() as c:
            return len(c.execute_command("SENTINEL", "REPLICAS", SERVICE))

    def wait(self, ready: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.05)
        log = (self.directory / "redis.log").read_text(errors="replace")[-1500:]
        raise AssertionError(f"sentinel: {what} not within {timeout} s\n{log}")


def acknowledges(primary: EmbeddedRedis) -> bool:
    """One replica has every write of ``primary`` (``WAIT 1``). False while the node is not a
    primary (yet, or any more: Sentinel may still be reconfiguring it) or does not answer."""
    with redis.Redis(port=primary.port, socket_timeout=2) as c:
        try:
            return acks(c) >= 1
        except (redis.ResponseError, redis.ConnectionError, redis.TimeoutError):
            return False


@dataclass
class SentinelDeployment:
    primary: EmbeddedRedis
    replica: EmbeddedRedis
    sentinel: LocalSentinel
    link: FaultyProxy  # the replica reaches its primary through it: close() cuts replication

    @property
    def sentinels(self) -> list[str]:
        return [f"127.0.0.1:{self.sentinel.port}"]


@contextmanager
def sentinel_deployment(binary: str | None = None) -> Iterator[SentinelDeployment]:
    """A primary, its replica (in sync) and a Sentinel that knows both (of ``binary``, by
    default the session's redis-server)."""
    primary = EmbeddedRedis(binary=binary).start()
    link = FaultyProxy(primary.port).start()
    replica = EmbeddedRedis(
        binary=binary, extra_args=["--replicaof", "127.0.0.1", str(link.port)]
    ).start()
    sentinel: LocalSentinel | None = None
    try:
        deadline = time.monotonic() + 10
        while not acknowledges(primary):
            if time.monotonic() > deadline:
                raise RuntimeError("the replica never synced")
            time.sleep(0.05)
        sentinel = LocalSentinel(primary.port, binary).start()
        running = sentinel
        running.wait(lambda: running.replicas() == 1, "replica seen")
        yield SentinelDeployment(primary, replica, sentinel, link)
    finally:
        if sentinel is not None:
            sentinel.close()
        link.close()
        replica.close()
        primary.close()


def switch_gracefully(deployment: SentinelDeployment, deadline: float) -> None:
    """``SENTINEL FAILOVER`` of a deployment whose replica has every write first (``WAIT``:
    the failover does not wait for it, and a write it missed would be lost, not followed),
    returning once the Sentinel names the promoted replica: the old primary is alive and
    still a primary until the Sentinel demotes it at its next look."""
    with redis.Redis(port=deployment.primary.port) as c:
        assert acks(c, timeout_ms=10_000) >= 1, "the replica never synced"
    with deployment.sentinel.client() as c:
        while True:
            try:
                c.execute_command("SENTINEL", "FAILOVER", SERVICE)
                break
            except redis.ResponseError:  # NOGOODSLAVE: the replica not seen as ready yet
                assert time.monotonic() < deadline, "the Sentinel never failed over"
                time.sleep(0.2)
    sentinel, port = deployment.sentinel, deployment.replica.port
    sentinel.wait(lambda: sentinel.switched_to(port), "failover")
