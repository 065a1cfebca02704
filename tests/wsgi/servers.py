"""gunicorn as a subprocess on a loopback port, serving the Django or the Flask shop; a
client that goes away (:func:`reset`) and a watch on what the server does with a response
(:class:`Sending`)."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx

from settle.embedded import free_port

HERE = Path(__file__).parent
TARGETS = {"django": "shop.wsgi:application", "flask": "shop.flask_served:app"}


class Gunicorn:
    """``gunicorn --worker-class gthread`` (or the ``workers`` options given) in its own
    session, so that :meth:`kill` takes the master and every worker down at once, as a
    crashed host would."""

    def __init__(
        self,
        framework: str,
        redis_url: str,
        namespace: str,
        lease: float,
        log: Path,
        workers: tuple[str, ...] = (
            "--worker-class",
            "gthread",
            "--workers",
            "2",
            "--threads",
            "32",
        ),
    ) -> None:
        self.framework = framework
        self.workers = workers  # gunicorn's options for its workers
        self.target = TARGETS[framework]
        self.log = log
        self.env = {
            **os.environ,
            "SETTLE_REDIS_URL": redis_url,
            "SETTLE_NAMESPACE": namespace,
            "SETTLE_LEASE": str(lease),
            "DJANGO_SETTINGS_MODULE": "shop.settings",
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> Gunicorn:
        port = free_port()
        command = [
            sys.executable, "-m", "gunicorn",
            "--bind", f"127.0.0.1:{port}",
            *self.workers,
            "--graceful-timeout", "2", "--log-level", "warning",
            "--pythonpath", str(HERE),
            self.target,
        ]  # fmt: skip
        log = self.log.open("ab")  # read it when a test fails: pytest shows the path
        self.process = subprocess.Popen(
            command, env=self.env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {self.process.returncode}")
            try:
                httpx.get(f"{self.url}/payments", timeout=1)  # any answer: it is up
                return self
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError("gunicorn did not start within 30 s")

    def twin(self) -> Gunicorn:
        """Another server of the same app with the same settings, not started: what a
        restart, or a second host behind the same balancer, brings up."""
        twin = Gunicorn.__new__(Gunicorn)
        twin.__dict__.update(self.__dict__)
        twin.process, twin.url = None, ""
        return twin

    def kill(self) -> None:
        """SIGKILL the master and its workers (mid-request): nothing runs any cleanup."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()


def connect(base: str) -> socket.socket:
    """A raw connection to the server at ``base`` (``http://host:port``)."""
    host, port = base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)))


def read_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """The status line and the body of the one response the server sends on ``sock``
    (framed by its Content-Length, or ended by the server closing)."""
    data = b""
    while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = [
        v for n, _, v in (line.partition(b":") for line in lines) if n.lower() == b"content-length"
    ]
    while (not length or len(body) < int(length[0])) and (chunk := sock.recv(65536)):
        body += chunk
    return lines[0], body


def reset(sock: socket.socket) -> None:
    """Close ``sock`` as a client that went away does: at once, with a reset (SO_LINGER 0),
    nothing read. The server's next write to it fails."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class Sending:
    """Between a WSGI server and an app: tells when the server gave up the iterable the
    app returned (its ``close()``, passed on) and whether it was exhausted first. One
    request at a time."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.closed = threading.Event()
        self.exhausted = False
        self._parts: Iterable[bytes] = ()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Sending:
        self.closed.clear()
        self.exhausted = False
        self._parts = self.app(environ, start_response)
        return self

    def __iter__(self) -> Iterator[bytes]:
        yield from self._parts
        self.exhausted = True

    def close(self) -> None:
        close = getattr(self._parts, "close", None)
        try:
            if close is not None:
                close()
        finally:
            self.closed.set()
