"""The demo's worker processes: each charges its orders through the decorator
(:mod:`settle.demo.worker`) and stops once the provider charged, so that the demo can kill
it (SIGKILL: a crashed worker) or freeze and later resume it (SIGSTOP/SIGCONT: a worker
whose late response arrives after another took over)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any

from settle._log import logger
from settle.demo.plan import Order

__all__ = ["REDIS_URL_ENV", "DemoError", "WorkerProcess"]

#: How long the demo waits for a worker process to answer.
_TIMEOUT = 60.0
#: The environment variable the demo passes the Redis URL in (defined here, not in
#: ``settle.demo.worker``: the package importing that module before ``python -m`` ran it
#: made runpy warn on the worker's stderr, which the demo quotes when a worker fails).
REDIS_URL_ENV = "SETTLE_DEMO_REDIS_URL"


class DemoError(Exception):
    """The demo could not run (a worker process failed to start or to answer)."""


class WorkerProcess:
    """One ``python -m settle.demo.worker`` process, driven over stdin/stdout."""

    def __init__(
        self, *, redis_url: str, namespace: str, shards: int, provider_url: str, lease: float
    ) -> None:
        self._args = [
            sys.executable,
            "-m",
            "settle.demo.worker",
            "--namespace",
            namespace,
            "--shards",
            str(shards),
            "--provider",
            provider_url,
            "--lease",
            str(lease),
        ]
        # The URL may hold a password: in the environment, not on the command line, which
        # every user of the machine can read (ps, /proc/PID/cmdline).
        self._env = {**os.environ, REDIS_URL_ENV: redis_url}
        self._process: subprocess.Popen[str] | None = None
        self._events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._log = logger.bind(namespace=namespace)

    @property
    def process(self) -> subprocess.Popen[str]:
        if self._process is None:
            raise DemoError("the worker process was not started")
        return self._process

    def start(self, orders: list[Order]) -> None:
        """Start the process on ``orders``; return once the provider charged each of them
        (the process now waits before settling)."""
        self._process = subprocess.Popen(  # noqa: S603 - this interpreter, our own module
            self._args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self._env,
        )
        stdout = self.process.stdout
        assert stdout is not None
        threading.Thread(target=_read_lines, args=(stdout, self._events), daemon=True).start()
        payload = [{"request": o.request.model_dump(), "merchant": o.merchant} for o in orders]
        self._send(json.dumps(payload))
        self._expect(("charged",), len(orders))

    def crash(self) -> None:
        """SIGKILL: no settlement, no heartbeat; the leases run out."""
        self.process.kill()
        self.process.wait()
        self._log.info("settle.demo.worker_killed", pid=self.process.pid)

    def freeze(self) -> None:
        """SIGSTOP: every thread stops, the heartbeat included; the leases run out."""
        os.kill(self.process.pid, signal.SIGSTOP)
        self._log.info("settle.demo.worker_frozen", pid=self.process.pid)

    def resume(self, count: int) -> list[dict[str, Any]]:
        """SIGCONT, and let each attempt present its result: one outcome event per order
        (``stale`` when the settlement was quarantined, ``result`` when it was accepted)."""
        os.kill(self.process.pid, signal.SIGCONT)
        self._log.info("settle.demo.worker_resumed", pid=self.process.pid)
        self._send("go")
        events = self._expect(("stale", "result"), count)
        stdin = self.process.stdin
        assert stdin is not None
        stdin.close()
        self.process.wait(timeout=_TIMEOUT)
        return events

    def kill(self) -> None:
        """Make sure the process is gone (it may be stopped) and its pipes closed."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()  # also ends a stopped process
            process.wait()
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def _send(self, line: str) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        try:
            stdin.write(line + "\n")
            stdin.flush()
        except OSError:
            # BrokenPipeError left as it is ended `settle demo` as a reader of its output
            # that stopped: exit 0, no report.
            raise self._gone("exited") from None

    def _gone(self, what: str) -> DemoError:
        """The process killed if it still runs, and why it is of no more use: its exit code
        and the end of its stderr."""
        process = self.process
        if process.poll() is None:
            process.kill()
            process.wait()
        tail = process.stderr.read().strip()[-500:] if process.stderr else ""
        self.kill()
        code = process.returncode
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
        return DemoError(f"a demo worker process {what} ({how}): {tail}")

    def _expect(self, kinds: tuple[str, ...], count: int) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + _TIMEOUT
        while len(got) < count:
            try:
                event = self._events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                event = None
            if event is None:
                raise self._gone("stopped answering")
            if event.get("event") == "error":
                raise DemoError(f"a demo worker process failed: {event.get('error')}")
            if event.get("event") in kinds:
                got.append(event)
        return got


def _read_lines(stream: IO[str], events: queue.Queue[dict[str, Any] | None]) -> None:
    for line in stream:
        with contextlib.suppress(ValueError):
            events.put(json.loads(line))
    events.put(None)
