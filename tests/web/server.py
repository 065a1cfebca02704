"""``settle web`` started for real: the installed console script in a subprocess on a free
loopback port, waited for until it answers, and stopped by its own pid."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator

import httpx

from tests.cli.conftest import SETTLE, cli_env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def settle_web(
    *args: str, token: str | None = None, stderr: list[str] | None = None, host: str = ""
) -> Iterator[str]:
    """Run ``settle web ARGS --port <free>`` (and ``--host HOST`` when given); yield its
    base URL. What it wrote on stderr is appended to ``stderr`` once it stopped."""
    port = free_port()
    if host:
        args = (*args, "--host", host)
    env = cli_env()
    env.pop("SETTLE_WEB_TOKEN", None)
    if token is not None:
        env["SETTLE_WEB_TOKEN"] = token
    proc = subprocess.Popen(
        [str(SETTLE), "web", *args, "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    address = host or "127.0.0.1"
    url = f"http://{f'[{address}]' if ':' in address else address}:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                out, err = proc.communicate()
                raise AssertionError(f"settle web exited {proc.returncode}: {err}{out}")
            try:
                if httpx.get(url + "/static/console.css", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("settle web did not answer within 30 s")
            time.sleep(0.1)
        yield url
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        _, err = proc.communicate()
        if stderr is not None:
            stderr.append(err)
