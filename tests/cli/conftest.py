"""The CLI is tested through the installed console script, in a subprocess, against the
session's real redis-server (or an embedded one the command starts itself)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from settle import Settler

SETTLE = Path(sys.executable).parent / "settle"
#: The environment the CLI reads; removed so that only what a test passes counts.
#: Every variable the CLI reads: a developer's own (even an empty one, refused) stays out.
CLI_ENV = (
    "SETTLE_REDIS_URL",
    "SETTLE_NAMESPACE",
    "SETTLE_SHARDS",
    "SETTLE_MIN_REPLICAS",
    "SETTLE_REDIS_TIMEOUT",
    "SETTLE_QUARANTINE_MAXLEN",
    "SETTLE_PROGRESS_REDIS_URL",
    "SETTLE_WEB_TOKEN",
)
DEMO_OPS = 40
#: A command of each kind that waits for Redis's first reply (the Ctrl-C tests).
WAITING_COMMANDS = [
    ("stats",),
    ("inspect", "charge:1"),
    ("quarantine", "ls"),
    ("quarantine", "export"),
    ("doctor",),
    ("cursor", "show", "orders"),
    ("progress", "show", "billing"),
]
DEMO_SEED = 5


@contextlib.contextmanager
def _sigint_not_ignored() -> Iterator[None]:
    """A child started here gets SIGINT's default (Python's KeyboardInterrupt), however
    pytest was started: a background job of a non-interactive shell, or nohup, ignores
    SIGINT, a child inherits that, and the command's Ctrl-C was lost (exit 3 once its Redis
    timeout ran out, not 130). A handler, unlike an ignored signal, is not inherited."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def waiting_on_silent_redis(
    argv: list[str], *more: str
) -> Iterator[tuple[subprocess.Popen[str], socket.socket]]:
    """``argv --redis-url <url> *more`` run against a server that accepts and never
    answers (the command waits for its first reply), with SIGINT's default: the process
    and its accepted connection, once accepted."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        silent.settimeout(60)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        with _sigint_not_ignored():
            proc = subprocess.Popen(
                [*argv, "--redis-url", url, *more],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=cli_env(),
            )
        connection, _ = silent.accept()
        with connection:
            yield proc, connection


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLI_ENV}
    env.update(extra)
    return env


def settle(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SETTLE), *args],
        capture_output=True,
        text=True,
        env=env if env is not None else cli_env(),
        timeout=timeout,
        check=False,
    )


def settle_json(*args: str, env: dict[str, str] | None = None) -> Any:
    done = settle(*args, "--json", env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@dataclass(frozen=True)
class Demo:
    """A demo run left on the session's Redis, for the read commands to look at."""

    url: str
    namespace: str
    output: str
    stderr: str
    returncode: int

    def args(self) -> tuple[str, ...]:
        return ("--redis-url", self.url, "--namespace", self.namespace)


@pytest.fixture(scope="session")
def settle_bin() -> Path:
    assert SETTLE.exists(), f"the console script is not installed at {SETTLE}"
    return SETTLE


@pytest.fixture(scope="session")
def demo_data(redis_url: str, settle_bin: Path) -> Demo:
    """``settle demo --redis-url ... --namespace ...`` (table output), data kept."""
    del settle_bin
    namespace = f"cli{uuid.uuid4().hex[:10]}"
    done = settle(
        "demo",
        "--redis-url",
        redis_url,
        "--namespace",
        namespace,
        "--ops",
        str(DEMO_OPS),
        "--seed",
        str(DEMO_SEED),
        "--shards",
        "4",
    )
    return Demo(redis_url, namespace, done.stdout, done.stderr, done.returncode)


@pytest.fixture
def cli_settler(redis_url: str, namespace: str) -> Iterator[Settler]:
    """A settler on a fresh namespace, to write the data a CLI test reads."""
    s = Settler.from_url(redis_url, namespace=namespace, shards=4)
    s.check()
    yield s
    s.close()
