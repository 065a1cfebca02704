"""Helpers of the progress tests: names, the effect ledger, worker processes, a TCP proxy
that drops a reply, and the invariant "nothing acknowledged before it was durably applied"."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis

from settle.progress._keys import ProgressKeys, StreamKeys
from settle.progress.identity import DeliveryId

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
REDIS7 = ROOT / ".ci" / "redis7" / "redis-server"


def redis_binaries() -> list[str | None]:
    """The redis-servers to hold the broker-side tests against: the default one and, when
    Debian's Redis 7 is unpacked under .ci/redis7 (.ci/run does it), that one too (unless
    ``SETTLE_REDIS_SERVER`` pins one)."""
    if REDIS7.exists() and not os.environ.get("SETTLE_REDIS_SERVER"):
        return [None, str(REDIS7)]
    return [None]


@dataclass(frozen=True)
class Names:
    stream: str
    group: str
    consumer: str
    namespace: str

    @property
    def ledger(self) -> tuple[str, str, str]:
        base = f"ledger:{{{self.consumer}}}"
        return f"{base}:effects", f"{base}:done", f"{base}:invocations"


def publish(client: redis.Redis, names: Names, emissions: list[str]) -> list[str]:
    return [
        client.xadd(names.stream, {"emission_id": e, "body": f"payload-{e}"}).decode()
        for e in emissions
    ]


def counts(client: redis.Redis, key: str) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(key).items()}


def wait_until(check: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or check}")


def pending_ids(client: redis.Redis, names: Names) -> dict[str, tuple[str, int]]:
    """delivery id -> (owner, delivery count) for every pending entry of the group."""
    try:
        rows = client.xpending_range(names.stream, names.group, "-", "+", 10_000)
    except redis.ResponseError:
        return {}
    return {
        r["message_id"].decode(): (r["consumer"].decode(), int(r["times_delivered"])) for r in rows
    }


def settled_ids(client: redis.Redis, names: Names) -> set[str]:
    """Deliveries the group has been handed and no longer holds pending: acknowledged."""
    groups = {g["name"].decode(): g for g in client.xinfo_groups(names.stream)}
    last = DeliveryId(groups[names.group]["last-delivered-id"].decode())
    delivered = {
        i.decode() for i, _ in client.xrange(names.stream) if not last < DeliveryId(i.decode())
    }
    return delivered - set(pending_ids(client, names))


def progress_covers(progress_client: redis.Redis, names: Names, delivery: str) -> bool:
    """Read the progress record straight from the progress server (not through the code
    under test's decoder) and say whether it durably covers ``delivery``."""
    keys = ProgressKeys(names.namespace, names.consumer)
    d = DeliveryId(delivery)
    for scope_id in progress_client.hkeys(keys.scopes):
        meta, applied, resolved = keys.scope(scope_id.decode())[:3]
        floor = progress_client.hget(meta, "floor")
        if floor and not DeliveryId(floor.decode()) < d:
            return True
        if progress_client.hexists(applied, delivery) or progress_client.hexists(
            resolved, delivery
        ):
            return True
    return False


def assert_nothing_acked_uncovered(
    stream_client: redis.Redis, progress_client: redis.Redis, names: Names
) -> set[str]:
    acked = settled_ids(stream_client, names)
    uncovered = {d for d in acked if not progress_covers(progress_client, names, d)}
    assert not uncovered, f"acknowledged before durable progress covered them: {uncovered}"
    return acked


def receipts(progress_client: redis.Redis, names: Names) -> list[dict[str, str]]:
    keys = ProgressKeys(names.namespace, names.consumer)
    out = []
    for scope_id in progress_client.hkeys(keys.scopes):
        stream = keys.scope(scope_id.decode())[7]
        for _, fields in progress_client.xrange(stream):
            out.append({k.decode(): v.decode() for k, v in fields.items()})
    return out


def dead_letters_on_stream(stream_client: redis.Redis, names: Names) -> list[dict[str, str]]:
    key = StreamKeys(names.stream).dead_letters
    return [{k.decode(): v.decode() for k, v in f.items()} for _, f in stream_client.xrange(key)]


class Worker:
    """A real worker process (tests/progress/worker.py) running settle.progress's
    StreamConsumer; it SIGKILLs or SIGSTOPs itself at an exact step when asked to."""

    def __init__(
        self,
        names: Names,
        stream_url: str,
        progress_url: str,
        *,
        worker: str,
        kill_at: tuple[str, str] | None = None,
        stop_at: tuple[str, str] | None = None,
        claim_idle: float = 0.3,
        max_deliveries: int = 5,
        batch: int = 8,
        poison: tuple[str, ...] = (),
    ) -> None:
        args = [
            sys.executable,
            str(HERE / "worker.py"),
            "--stream-url",
            stream_url,
            "--progress-url",
            progress_url,
            "--stream",
            names.stream,
            "--group",
            names.group,
            "--consumer",
            names.consumer,
            "--namespace",
            names.namespace,
            "--worker",
            worker,
            "--claim-idle",
            str(claim_idle),
            "--max-deliveries",
            str(max_deliveries),
            "--batch",
            str(batch),
        ]
        if kill_at:
            args += ["--kill-at", kill_at[0], "--kill-delivery", kill_at[1]]
        if stop_at:
            args += ["--stop-at", stop_at[0], "--stop-delivery", stop_at[1]]
        for p in poison:
            args += ["--poison", p]
        self.name = worker
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"{names.consumer}-{worker}.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)

    def state(self) -> str:
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except FileNotFoundError:
            return "gone"
        return stat.rsplit(")", 1)[1].split()[0]

    def wait_stopped(self, timeout: float = 20.0) -> None:
        wait_until(lambda: self.state() == "T", timeout, f"{self.name} to stop itself")

    def wait_killed(self, timeout: float = 20.0) -> None:
        code = self.proc.wait(timeout)
        log = self.log_path.read_text(errors="replace")[-2000:]
        self.log_path.unlink(missing_ok=True)
        assert code == -signal.SIGKILL, f"{self.name} exited with {code}, not by SIGKILL: {log}"

    def cont(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log_path.unlink(missing_ok=True)


class DropReplyProxy:
    """A TCP proxy to the stream's server that, once the fenced settlement of ``delivery`` has
    been sent and answered, SIGKILLs the worker instead of passing the reply on: the ack ran
    on the server, the worker never learned it."""

    def __init__(self, upstream_port: int, delivery: str, script: tuple[str, ...]) -> None:
        """``script``: what a call of the settlement script holds, either of them (its SHA
        in EVALSHA, its function name in FCALL)."""
        self.upstream_port = upstream_port
        self.script = tuple(s.encode() for s in script)
        self.delivery = delivery.encode()
        self.victim: int | None = None
        self.fired = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            armed = threading.Event()
            threading.Thread(target=self._up, args=(client, upstream, armed), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client, armed), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket, armed: threading.Event) -> None:
        try:
            while data := client.recv(65536):
                if (
                    not self.fired.is_set()
                    and self.delivery in data
                    and any(s in data for s in self.script)
                ):
                    armed.set()
                upstream.sendall(data)
        except OSError:
            pass

    def _down(self, upstream: socket.socket, client: socket.socket, armed: threading.Event) -> None:
        try:
            while data := upstream.recv(65536):
                if armed.is_set() and not data.startswith((b"-NOSCRIPT", b"-ERR Function")):
                    self.fired.set()
                    if self.victim is not None:
                        os.kill(self.victim, signal.SIGKILL)
                    client.close()
                    upstream.close()
                    return
                client.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()
