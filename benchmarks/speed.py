"""``python -m benchmarks.speed``: what settle costs per call, beside the raw floor and the peer.

Starts its own redis-server, then in one process run:

1. every case of :mod:`benchmarks._cases` (sync on one connection, async with
   ``--concurrency`` tasks), in ``--rounds`` interleaved rounds of ``--seconds`` each, so
   that load from other processes hits every case alike; ops/s is the median round, the
   latency percentiles pool every round; ``INFO commandstats`` is reset before and read after
   each case's run;
2. a short pass of each case under ``MONITOR`` that tells which commands the client sent
   (round trips) from those a script ran, so round trips per call come from the server's
   counters, not from what the code is believed to send;
3. the server time of each settle script, one script per commandstats window;

then prints the tables and every target ratio, and writes ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from benchmarks._cases import Case, Clients, build_cases
from benchmarks._report import print_report, ratios
from benchmarks._scripts import script_costs
from benchmarks._server import CommandStats, machine, quiet_logs, redis_server, top_level_commands

DEFAULT_JSON = Path(__file__).parent / "results" / "speed.json"


def _merge(into: dict[str, dict[str, float]], stats: dict[str, dict[str, float]]) -> None:
    for name, entry in stats.items():
        slot = into.setdefault(name, {"calls": 0, "usec": 0})
        slot["calls"] += entry["calls"]
        slot["usec"] += entry["usec"]


def _run_sync(op: Callable[[], object], seconds: float) -> tuple[int, float, list[int]]:
    latencies: list[int] = []
    clock = time.perf_counter_ns
    start = clock()
    end = start + int(seconds * 1e9)
    now = start
    while now < end:
        began = clock()
        op()
        now = clock()
        latencies.append(now - began)
    return len(latencies), (now - start) / 1e9, latencies


async def _run_async(
    op: Callable[[], Awaitable[object]], seconds: float, concurrency: int
) -> tuple[int, float, list[int]]:
    latencies: list[int] = []
    clock = time.perf_counter_ns
    start = clock()
    end = start + int(seconds * 1e9)

    async def worker() -> None:
        while clock() < end:
            began = clock()
            await op()
            latencies.append(clock() - began)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(latencies), (clock() - start) / 1e9, latencies


async def _warm(case: Case, concurrency: int, count: int) -> None:
    if case.mode == "sync":
        for _ in range(count):
            case.op()
    else:
        op = cast("Callable[[], Awaitable[object]]", case.op)
        await asyncio.gather(*(op() for _ in range(max(count, concurrency))))


async def _measure(case: Case, stats: CommandStats, args: argparse.Namespace) -> None:
    await _warm(case, args.concurrency, args.warmup)
    stats.reset()
    cpu = time.process_time()
    if case.mode == "sync":
        ops, seconds, latencies = _run_sync(case.op, args.seconds)
    else:
        op = cast("Callable[[], Awaitable[object]]", case.op)
        ops, seconds, latencies = await _run_async(op, args.seconds, args.concurrency)
    case.cpu_seconds += time.process_time() - cpu
    _merge(case.stats, stats.read())
    case.ops += ops
    case.seconds += seconds
    case.round_rates.append(ops / seconds)
    case.latencies_ns.extend(latencies)


async def _count_round_trips(case: Case, url: str, count: int) -> None:
    """Which commands the case's client sends, by name, from MONITOR. An async case's
    operations run one at a time on this loop while MONITOR watches from a thread."""
    loop = asyncio.get_running_loop()
    if case.mode == "sync":
        sent, scripted = top_level_commands(url, lambda: [case.op() for _ in range(count)])
    else:
        op = cast("Callable[[], Awaitable[object]]", case.op)

        def run() -> None:
            future = asyncio.run_coroutine_threadsafe(_serial(op, count), loop)
            future.result(timeout=60)

        sent, scripted = await asyncio.to_thread(top_level_commands, url, run)
    case.client_commands = {k: round(v / count, 3) for k, v in sent.items()}
    case.script_commands = {k: round(v / count, 3) for k, v in scripted.items()}


async def _serial(op: Callable[[], Awaitable[object]], count: int) -> None:
    for _ in range(count):
        await op()


def summarize(case: Case) -> dict[str, Any]:
    ordered = sorted(case.latencies_ns)

    def pct(p: float) -> float:
        if not ordered:
            return 0.0
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] / 1000

    ops = max(case.ops, 1)
    commands = {
        name: {
            "calls_per_op": round(e["calls"] / ops, 3),
            "usec_per_call": round(e["usec"] / e["calls"], 2) if e["calls"] else 0.0,
        }
        for name, e in sorted(case.stats.items())
    }
    sent = set(case.client_commands)
    round_trips = sum(e["calls"] for n, e in case.stats.items() if n in sent) / ops
    return {
        "case": case.key,
        "label": case.label,
        "mode": case.mode,
        "ops": case.ops,
        "seconds": round(case.seconds, 3),
        "ops_per_s": round(statistics.median(case.round_rates), 1) if case.round_rates else 0,
        "round_ops_per_s": [round(r, 1) for r in case.round_rates],
        "p50_us": round(pct(0.50), 1),
        "p99_us": round(pct(0.99), 1),
        "client_cpu_us_per_op": round(case.cpu_seconds / ops * 1e6, 1),
        "round_trips_per_op": round(round_trips, 3),
        "server_us_per_op": round(sum(e["usec"] for e in case.stats.values()) / ops, 2),
        "commands": commands,
        "client_commands_per_op": case.client_commands,
        "script_commands_per_op": case.script_commands,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    with redis_server() as server:
        clients = Clients(server.url)
        await clients.open()
        stats = CommandStats(server.url)
        try:
            cases = build_cases(clients)
            for case in cases:
                await _count_round_trips(case, server.url, args.monitor_ops)
            for _ in range(args.rounds):
                for case in cases:
                    await _measure(case, stats, args)
            scripts = script_costs(clients.settler, clients.raw, stats, args.script_calls)
            about = machine(server)
        finally:
            stats.close()
            await clients.aclose()
    rows = [summarize(case) for case in cases]
    return {
        "machine": about,
        "settings": {
            "rounds": args.rounds,
            "seconds_per_round": args.seconds,
            "concurrency": args.concurrency,
            "script_calls": args.script_calls,
        },
        "cases": rows,
        "scripts": scripts,
        "targets": ratios(rows, scripts),
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.speed", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0, help="per case per round")
    parser.add_argument("--concurrency", type=int, default=64, help="async tasks")
    parser.add_argument("--warmup", type=int, default=50, help="untimed ops per case run")
    parser.add_argument("--monitor-ops", type=int, default=50, help="ops counted by MONITOR")
    parser.add_argument("--script-calls", type=int, default=2000, help="per settle script")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    quiet_logs()
    result = asyncio.run(run(args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print_report(result)
    print(f"\nJSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
