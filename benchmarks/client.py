"""``python -m benchmarks.client``: the instructions the Python client executes per call,
counted rather than timed, for the four sync cases of issue 19's targets: a ``reserve`` +
``complete`` of a new operation, a replay (``reserve`` of a completed one), and
``@settler.operation``'s first call and replay (the speed benchmark's no-op function); and
for an :class:`~settle.AsyncSettler`'s pair and replay: from one task, and from 64
concurrent tasks on one event loop (the speed benchmark's async cases, whose calls the
asyncio lane pipelines; the batches differ from run to run, so do the counts a little).

Client CPU per call moves by tens of percent between two runs on a shared machine; the
instructions move by under 1%. Each case runs in a process of its own under ``valgrind
--tool=cachegrind`` (``apt-get install valgrind``) against one real redis-server (not
under valgrind): once with only the warm-up calls, once with the warm-up and ``--calls``
more; the difference over ``--calls`` is the client's instructions per call (its socket
calls' user-space side included, the kernel's not). ``PYTHONHASHSEED`` is fixed so that the
two processes import alike (a random seed moves the start-up by millions of instructions).
Logging keeps ERROR and up, as in ``python -m benchmarks.speed``. Under valgrind Python runs
about 50 times slower: ``--calls`` is small.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._report import table
from benchmarks.instructions import command
from settle.embedded import EmbeddedRedis

__all__ = ["CASES", "TASKS", "WARMUP", "main", "measure"]

#: The cases: their name and label.
CASES = {
    "pair": "reserve + complete (a new operation)",
    "replay": "replay (reserve of a completed operation)",
    "first": "@operation, no-op fn: first call",
    "decorated_replay": "@operation, no-op fn: replay",
    "async_pair": "async reserve + complete, 64 tasks",
    "async_pair_1": "async reserve + complete, one task",
    "async_replay": "async replay, 64 tasks",
    "async_replay_1": "async replay, one task",
}

#: Concurrent tasks of the async cases whose name does not end in ``_1``.
TASKS = 64

#: Calls made before the counted ones, in both processes of a case.
WARMUP = 200


def _operation(url: str, case: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """The case's one call and what closes its settler."""
    from benchmarks._cases import PRINCIPAL, REQUEST, RESULT  # noqa: PLC0415 - the child's
    from settle import Replay, Reserved, Settler  # noqa: PLC0415

    settler = Settler.from_url(url, namespace=f"client-{uuid.uuid4().hex[:8]}")
    settler.check()
    ids = (f"op-{n}" for n in itertools.count())
    if case == "pair":

        def pair() -> None:
            got = settler.reserve(next(ids), REQUEST, principal=PRINCIPAL)
            assert isinstance(got, Reserved)
            settler.complete(got.reservation, RESULT)

        return pair, settler.close
    if case == "replay":
        first = settler.reserve("done", REQUEST, principal=PRINCIPAL)
        assert isinstance(first, Reserved)
        settler.complete(first.reservation, RESULT)

        def replay() -> None:
            assert isinstance(settler.reserve("done", REQUEST, principal=PRINCIPAL), Replay)

        return replay, settler.close

    @settler.operation(key=lambda order: order["order_id"], principal=PRINCIPAL, name="charge")
    def charge(order: dict[str, Any]) -> dict[str, Any]:  # noqa: ARG001 - `order` feeds the key
        return RESULT

    done = {**REQUEST, "order_id": "done"}
    charge(order=done)
    if case == "first":
        return lambda: charge(order={**REQUEST, "order_id": next(ids)}), settler.close

    def decorated_replay() -> None:
        assert charge(order=done) == RESULT

    return decorated_replay, settler.close


async def _async_calls(url: str, case: str, calls: int) -> None:
    """The async case's warm-up, then ``calls`` more, from its tasks on this loop."""
    from benchmarks._cases import PRINCIPAL, REQUEST, RESULT  # noqa: PLC0415 - the child's
    from settle import AsyncSettler, Replay, Reserved  # noqa: PLC0415

    settler = AsyncSettler.from_url(url, namespace=f"client-{uuid.uuid4().hex[:8]}")
    await settler.check()
    ids = (f"op-{n}" for n in itertools.count())
    first = await settler.reserve("done", REQUEST, principal=PRINCIPAL)
    assert isinstance(first, Reserved)
    await settler.complete(first.reservation, RESULT)

    async def pair() -> None:
        got = await settler.reserve(next(ids), REQUEST, principal=PRINCIPAL)
        assert isinstance(got, Reserved)
        await settler.complete(got.reservation, RESULT)

    async def replay() -> None:
        assert isinstance(await settler.reserve("done", REQUEST, principal=PRINCIPAL), Replay)

    call = pair if case.startswith("async_pair") else replay
    tasks = 1 if case.endswith("_1") else TASKS

    async def run(count: int) -> None:
        left = [count]

        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                await call()

        await asyncio.gather(*(worker() for _ in range(tasks)))

    try:
        await run(WARMUP)
        await run(calls)
    finally:
        await settler.aclose()


def _child(url: str, case: str, calls: int) -> None:
    from benchmarks._server import quiet_logs  # noqa: PLC0415 - the child's

    quiet_logs()
    if case.startswith("async_"):
        asyncio.run(_async_calls(url, case, calls))
        return
    call, close = _operation(url, case)
    try:
        for _ in range(WARMUP + calls):
            call()
    finally:
        close()


def _count(url: str, case: str, calls: int, tmp: Path) -> int:
    """The instructions of a child process making the case's warm-up and ``calls`` calls."""
    out = tmp / f"cachegrind.{case}.{calls}"
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            f"--cachegrind-out-file={out}",
            sys.executable,
            "-m",
            "benchmarks.client",
            "--child",
            url,
            case,
            str(calls),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"the {case} process failed ({done.returncode}): {done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def measure(calls: int, cases: list[str] | None = None) -> dict[str, Any]:
    """Every case's client instructions per call (two counted runs each), or ``cases``'."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    rows = []
    with EmbeddedRedis() as server, tempfile.TemporaryDirectory(prefix="settle-client-") as tmp:
        for case, label in CASES.items():
            if cases is not None and case not in cases:
                continue
            base = _count(server.url, case, 0, Path(tmp))
            runs = [(_count(server.url, case, calls, Path(tmp)) - base) // calls for _ in "12"]
            rows.append({"case": case, "label": label, "instructions_per_call": runs})
    return {"calls": calls, "warmup": WARMUP, "python": sys.version.split()[0], "rows": rows}


def _print(result: dict[str, Any]) -> None:
    print(
        f"Client instructions per call (Python {result['python']} under cachegrind), "
        f"{result['calls']} calls after {result['warmup']} of warm-up, two runs\n"
    )
    body = [
        [row["label"], *(f"{n:,}" for n in row["instructions_per_call"])] for row in result["rows"]
    ]
    print(table(["case", "run 1", "run 2"], body))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--child"]:
        _child(args[1], args[2], int(args[3]))
        return 0
    cases = None
    if "--cases" in args:  # a comma-separated few of CASES (every one by default)
        at = args.index("--cases")
        names = args[at + 1] if at + 1 < len(args) else ""  # none given: refused below
        cases, args = names.split(","), args[:at] + args[at + 2 :]
        if unknown := set(cases) - set(CASES):
            raise SystemExit(f"unknown cases: {sorted(unknown)}; known: {list(CASES)}")
    return command(
        args,
        "python -m benchmarks.client",
        __doc__,
        (1000, "calls per case"),
        lambda calls: measure(calls, cases),
        _print,
    )


if __name__ == "__main__":
    sys.exit(main())
