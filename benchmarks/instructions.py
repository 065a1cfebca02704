"""``python -m benchmarks.instructions``: the instructions the redis-server executes per
settle script call, counted rather than timed, beside the trivial two-command script.

These are the script ratios of ``python -m benchmarks.speed``'s target table without the
noise of a shared machine: there a script's server time per call moves by up to 2x between
two runs of the same code, while an instruction count moves by about 1%. It needs valgrind
(``apt-get install valgrind``): it starts its own redis-server (``SETTLE_REDIS_SERVER``
picks the binary, as for the tests) under ``valgrind --tool=callgrind``, runs every script
path of :func:`benchmarks._scripts.script_costs` in a window of its own, the counters zeroed
before the window (``callgrind_control --zero``) and dumped after it (``--dump``), and
prints the instructions per call (the script call as the server handles it: reading the
request, the script, the reply) and their ratio to the trivial script's, with issue 19's
goals (a write at most 2.5x, a read at most 1.5x). Under valgrind the server runs about 50
times slower than it does alone: ``--calls`` is small.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from benchmarks._report import READ_SCRIPTS, SCRIPT_READ_X, SCRIPT_WRITE_X, table
from benchmarks._scripts import TRIVIAL, script_costs
from benchmarks._server import CommandStats, machine, quiet_logs
from settle import Settler
from settle.embedded import EmbeddedRedis, find_redis_server

__all__ = ["InstructionStats", "command", "count", "counted_server", "main"]

#: The script call commands whose windows are counted (the path settle takes on the server).
_PATHS = ("evalsha", "fcall")


class InstructionStats(CommandStats):
    """``INFO commandstats`` of a window (which commands ran, how often), with the
    instructions the server executed in it, from callgrind, in place of the script call's
    microseconds: ``script_costs`` then reports instructions per call."""

    def __init__(self, url: str, pid: int, dumps: Path) -> None:
        super().__init__(url)
        self._pid = str(pid)
        self._dumps = dumps
        self._seen: set[Path] = set()

    def reset(self) -> None:
        super().reset()
        _control("--zero", self._pid)

    def read(self) -> dict[str, dict[str, float]]:
        stats = super().read()
        _control("--dump", self._pid)
        found = None
        deadline = time.monotonic() + 60
        while found is None:  # the server writes the dump after callgrind_control returns
            new = sorted(set(self._dumps.parent.glob(self._dumps.name + ".*")) - self._seen)
            if new:
                found = re.search(r"^summary: (\d+)", new[0].read_text(), re.MULTILINE)
            if found is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no complete callgrind dump after the window: {new}")
                time.sleep(0.05)
        self._seen.update(new)
        for path in _PATHS:
            if path in stats:
                stats[path]["usec"] = int(found.group(1))
        return stats


def _control(option: str, pid: str) -> None:
    subprocess.run(["callgrind_control", option, pid], check=True, capture_output=True)


@contextmanager
def counted_server(
    binary: str | None = None,
) -> Iterator[tuple[EmbeddedRedis, InstructionStats, str]]:
    """A redis-server (``binary``, else the one the tests use) run under callgrind, the
    windows' counter and the binary's path."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    with tempfile.TemporaryDirectory(prefix="settle-instructions-") as tmp:
        dumps = Path(tmp) / "callgrind.out"
        # The server's binary behind valgrind (a wrapper script is followed into its exec).
        wrapper = Path(tmp) / "redis-server"
        real = binary or find_redis_server()
        wrapper.write_text(
            "#!/bin/sh\nexec valgrind --tool=callgrind --trace-children=yes "
            f'--callgrind-out-file={shlex.quote(str(dumps))} {shlex.quote(real)} "$@"\n'
        )
        wrapper.chmod(0o755)
        # valgrind's start-up takes seconds
        with EmbeddedRedis(binary=str(wrapper)).start(timeout=120) as server:
            assert server.process is not None
            stats = InstructionStats(server.url, server.process.pid, dumps)
            try:
                yield server, stats, real
            finally:
                stats.close()


def count(calls: int, binary: str | None = None) -> dict[str, Any]:
    """Every script path's instructions per call on a redis-server run under callgrind."""
    with counted_server(binary) as (server, stats, real):
        settler = Settler.from_url(server.url, namespace="instructions")
        client = redis.Redis.from_url(server.url)
        try:
            settler.check()
            costs = script_costs(settler, client, stats, calls)
            described = machine(server)
        finally:
            settler.close()
            client.close()
    described["redis_binary"] = real
    trivial = costs[TRIVIAL]["usec_per_call"]
    rows = []
    for name, cost in costs.items():
        per_call = cost["usec_per_call"]
        row: dict[str, Any] = {"script": name, "instructions_per_call": round(per_call)}
        if name != TRIVIAL and not name.startswith("calibration:"):
            goal = SCRIPT_READ_X if name in READ_SCRIPTS else SCRIPT_WRITE_X
            ratio = per_call / trivial
            row.update(x_trivial=round(ratio, 2), goal=goal, met=ratio <= goal)
        rows.append(row)
    return {"machine": described, "calls": calls, "path": costs[TRIVIAL]["path"], "rows": rows}


def _print(result: dict[str, Any]) -> None:
    m = result["machine"]
    print(
        f"Instructions per call, redis-server {m['redis_server']} under callgrind "
        f"({result['path'].upper()}), {result['calls']} calls per script path"
    )
    print()
    body = []
    for row in result["rows"]:
        if "x_trivial" in row:
            cells = [f"{row['x_trivial']:.2f}", f"<= {row['goal']}x", "yes" if row["met"] else "NO"]
        else:
            cells = ["-", "-", "-"]
        body.append([row["script"], f"{row['instructions_per_call']:,}", *cells])
    print(table(["script", "instructions per call", "x trivial script", "goal", "met"], body))


def command(
    argv: list[str] | None,
    prog: str,
    description: str | None,
    calls: tuple[int, str],
    measure: Callable[[int], dict[str, Any]],
    report: Callable[[dict[str, Any]], None],
) -> int:
    """A counting benchmark's command line: ``--calls`` (``calls``: its default and help)
    and ``--json``; it measures, prints the report and writes the figures."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--calls", type=int, default=calls[0], help=calls[1])
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    quiet_logs()
    result = measure(args.calls)
    report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    return command(
        argv,
        "python -m benchmarks.instructions",
        __doc__,
        (200, "calls per script path"),
        count,
        _print,
    )


if __name__ == "__main__":
    sys.exit(main())
