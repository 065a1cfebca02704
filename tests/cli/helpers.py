"""Writing quarantine evidence with the Python API, for the CLI to read; running a command in
a terminal of a given width; the bytes a redis-server sent while a command read it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Iterator

import redis

from settle import Reserved, Settler
from settle.embedded import EmbeddedRedis


@contextlib.contextmanager
def bytes_sent(redis_url: str) -> Iterator[list[int]]:
    """The bytes the redis-server sent its clients while the block ran (only the test
    talks to it meanwhile): what was read, payloads included. ``sent[0]`` after the block."""
    with redis.Redis.from_url(redis_url) as raw:
        before = int(raw.info("stats")["total_net_output_bytes"])
        sent: list[int] = []
        yield sent
        sent.append(int(raw.info("stats")["total_net_output_bytes"]) - before)


def stale_settlement(settler: Settler, operation_id: str) -> str:
    """A late response of an old generation after a takeover: returns its quarantine id."""
    first = settler.reserve(operation_id, {"amount": 1250}, principal="tenant:acme", lease=0.05)
    assert isinstance(first, Reserved)
    time.sleep(0.1)  # the first attempt's lease passes
    second = settler.reserve(operation_id, {"amount": 1250}, principal="tenant:acme", lease=5)
    assert isinstance(second, Reserved)
    settler.complete(second.reservation, {"charge_id": "ch_new"})
    late = settler.complete(first.reservation, {"charge_id": "ch_late"})
    assert late.quarantine_id is not None
    return late.quarantine_id


def in_terminal(
    args: list[str],
    env: dict[str, str],
    columns: int = 80,
    *,
    env_columns: int | None = None,
    unset_columns: bool = False,
) -> str:
    """What ``args`` prints to a real terminal (a pseudo-terminal) ``columns`` wide, with
    ``COLUMNS`` set as a shell sets it (``env_columns`` when given, not set at all with
    ``unset_columns``): rich lays its tables out for that width only on a terminal (piped
    output is at least 200 wide)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {**env, "COLUMNS": str(env_columns or columns), "TERM": "dumb"}
    if unset_columns:
        del env["COLUMNS"]
        env.pop("LINES", None)
    proc = subprocess.Popen(args, stdin=follower, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    out = b""
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the command ended and closed its side
            break
        if not data:
            break
        out += data
    assert proc.wait(timeout=60) == 0, out
    os.close(leader)
    # as the user reads it: without the styles' escape codes and the terminal's \r
    return re.sub(r"\x1b\[[0-9;]*m", "", out.decode()).replace("\r\n", "\n")


@contextlib.contextmanager
def paused(server: EmbeddedRedis) -> Iterator[None]:
    """``server`` stopped with SIGSTOP for the block (connections open, no answer, as in a
    network partition), resumed after it whatever happened."""
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
