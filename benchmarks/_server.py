"""What both benchmark commands share: their own redis-server, a description of the machine,
quiet logging, and the server's own counters (``INFO commandstats`` and ``MONITOR``)."""

from __future__ import annotations

import logging
import os
import platform
import re
import subprocess
import sys
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
import structlog

from settle.embedded import EmbeddedRedis

__all__ = [
    "ADMIN_COMMANDS",
    "CommandStats",
    "machine",
    "quiet_logs",
    "redis_server",
    "top_level_commands",
]

#: Commands the benchmark sends to read and reset the counters, and the handshake redis-py
#: sends once per new connection (HELLO, CLIENT SETINFO): never counted as an operation's.
ADMIN_COMMANDS = frozenset(
    {
        "config",
        "info",
        "monitor",
        "ping",
        "echo",
        "flushall",
        "script",
        "function",
        "hello",
        "client",
    }
)


def quiet_logs() -> None:
    """settle logs every transition at INFO through structlog; a service under load keeps
    INFO; the benchmarks keep ERROR and up (the peer's stdlib logger is quiet by default).
    The peer's deprecation notices are silenced too: they would be printed, not raised."""
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),  # the tables own stdout
    )
    warnings.simplefilter("ignore", DeprecationWarning)
    # "Couldn't determine the remaining time left": no Lambda context outside Lambda.
    warnings.filterwarnings("ignore", message="Couldn't determine the remaining time")
    # The peer calls an async function without awaiting it (the async fault scenario
    # reports what its caller saw instead of this warning).
    warnings.filterwarnings("ignore", message="coroutine .* was never awaited")


@contextmanager
def redis_server() -> Iterator[EmbeddedRedis]:
    """A throwaway redis-server for this run only (no persistence, loopback)."""
    with EmbeddedRedis() as server:
        yield server


def machine(server: EmbeddedRedis) -> dict[str, Any]:
    """``nproc``, the CPU model from ``lscpu``, Python and redis-server versions, load."""
    model = platform.processor() or "unknown"
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        found = re.search(r"^Model name:\s*(.+)$", lscpu, re.MULTILINE)
        model = found.group(1).strip() if found else model
    except OSError:
        pass
    info = redis.Redis.from_url(server.url).info("server")
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "redis_server": str(info.get("redis_version")),
        "redis_binary": server.binary,
        "platform": platform.platform(),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


class CommandStats:
    """``INFO commandstats`` between a reset and a read, minus the benchmark's own commands.

    Redis counts the commands a Lua script runs as well as the script call itself, so a
    case's counts mix round trips (what a client sent) and work inside scripts; which names
    a client sent comes from :func:`top_level_commands`.
    """

    def __init__(self, url: str) -> None:
        self._admin = redis.Redis.from_url(url)

    def reset(self) -> None:
        self._admin.config_resetstat()

    def read(self) -> dict[str, dict[str, float]]:
        stats: dict[str, dict[str, float]] = {}
        for key, value in self._admin.info("commandstats").items():
            name = key.removeprefix("cmdstat_").split("|")[0].lower()
            if name in ADMIN_COMMANDS:
                continue
            entry = stats.setdefault(name, {"calls": 0, "usec": 0})
            entry["calls"] += int(value["calls"])
            entry["usec"] += int(value["usec"])
        return stats

    def close(self) -> None:
        self._admin.close()


def top_level_commands(url: str, run: Callable[[], object]) -> tuple[Counter[str], Counter[str]]:
    """Run ``run`` while ``MONITOR`` watches: (commands clients sent, commands scripts ran),
    by lower-case name. MONITOR marks a script's commands ``[0 lua]``; it slows the server
    down, so only a short counting pass runs under it, never a timed one."""
    sent: Counter[str] = Counter()
    scripted: Counter[str] = Counter()
    client = redis.Redis.from_url(url)
    ready = threading.Event()
    done = threading.Event()

    def watch() -> None:
        with client.monitor() as monitor:  # type: ignore[no-untyped-call]
            ready.set()
            for event in monitor.listen():
                command = str(event.get("command", ""))
                name = command.split(" ", 1)[0].lower()
                if name == "echo" and "settle-bench-monitor-end" in command:
                    break
                if name in ADMIN_COMMANDS:
                    continue
                (scripted if event.get("client_type") == "lua" else sent)[name] += 1
        done.set()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    ready.wait(5)
    # MONITOR's reply reaches the server before its first event; a ping settles the race.
    redis.Redis.from_url(url).ping()
    run()
    redis.Redis.from_url(url).echo("settle-bench-monitor-end")
    done.wait(10)
    client.close()
    return sent, scripted
