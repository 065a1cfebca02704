"""The speed run's targets (computed from the same run's rows) and its printed tables,
as Markdown so that docs/benchmarks.md can hold the output verbatim."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._scripts import TRIVIAL

__all__ = ["print_report", "publish", "ratios", "table", "targets_table"]

#: A script's server time against the trivial two-command script of the same run: a
#: script that writes at most this many times it, one that only reads at most ``READ``.
SCRIPT_WRITE_X = 2.5
SCRIPT_READ_X = 1.5
#: The scripts (as :func:`benchmarks._scripts.script_costs` names them) that only read.
READ_SCRIPTS = ("reserve (replay)", "get")


def _row(rows: list[dict[str, Any]], case: str, mode: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["case"] == case and r["mode"] == mode), None)


def _ratio(
    rows: list[dict[str, Any]], name: str, num: tuple[str, str], den: tuple[str, str], at: float
) -> dict[str, Any] | None:
    top, bottom = _row(rows, *num), _row(rows, *den)
    if top is None or bottom is None or not bottom["ops_per_s"]:
        return None
    value = top["ops_per_s"] / bottom["ops_per_s"]
    return {"target": name, "value": round(value, 2), "goal": f">= {at}x", "met": value >= at}


def ratios(rows: list[dict[str, Any]], scripts: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every target of the issue, from this run's numbers only."""
    out: list[dict[str, Any] | None] = []
    for mode in ("sync", "async"):
        out.append(
            _ratio(
                rows,
                f"reserve+complete / raw floor ({mode})",
                ("b.reserve_complete", mode),
                ("a.floor", mode),
                0.85,
            )
        )
    # The stretch goal: concurrent async calls coalesced into pipelines, so that the
    # settings' concurrency (64 tasks) beats redis-py's asyncio floor, whose tasks each take
    # a connection of their own and send one command at a time.
    out.append(
        _ratio(
            rows,
            "stretch: reserve+complete / naive raw floor (async, concurrent tasks)",
            ("b.reserve_complete", "async"),
            ("a.floor", "async"),
            1.5,
        )
    )
    for mode in ("sync", "async"):
        replay = _row(rows, "c.replay", mode)
        if replay is not None:
            trips = replay["round_trips_per_op"]
            out.append(
                {
                    "target": f"replay round trips per call ({mode})",
                    "value": trips,
                    "goal": "== 1",
                    "met": abs(trips - 1.0) < 0.01,
                }
            )
        out.append(
            _ratio(rows, f"replay / GET loop ({mode})", ("c.replay", mode), ("a.get", mode), 0.8)
        )
    out.append(
        _ratio(
            rows,
            "decorator first call / peer first call (sync)",
            ("d.first", "sync"),
            ("e.first", "sync"),
            1.1,
        )
    )
    out.append(
        _ratio(
            rows,
            "decorator replay / peer replay (sync)",
            ("d.replay", "sync"),
            ("e.replay", "sync"),
            2.5,
        )
    )
    trivial = scripts.get(TRIVIAL)
    for name, cost in scripts.items():
        if name.startswith("calibration") or trivial is None:
            continue
        times = cost["usec_per_call"] / trivial["usec_per_call"]
        at = SCRIPT_READ_X if name in READ_SCRIPTS else SCRIPT_WRITE_X
        kind = "read" if name in READ_SCRIPTS else "write"
        out.append(
            {
                "target": f"server time: {name} / trivial script ({kind})",
                "value": round(times, 2),
                "goal": f"<= {at}x",
                "met": times <= at,
            }
        )
    return [r for r in out if r is not None]


def table(headers: list[str], body: list[list[Any]]) -> str:
    cells = [headers, *[[str(c) for c in row] for row in body]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def _commands(per_op: dict[str, float]) -> str:
    return " ".join(f"{k.upper()}x{v:g}" for k, v in sorted(per_op.items())) or "-"


def print_report(result: dict[str, Any]) -> None:
    m = result["machine"]
    s = result["settings"]
    print(
        f"machine: nproc={m['nproc']} cpu={m['cpu_model']} python={m['python']} "
        f"redis-server={m['redis_server']} load(1m)={m['load_average_1m']}"
    )
    print(
        f"settings: {s['rounds']} rounds x {s['seconds_per_round']} s per case, async "
        f"concurrency {s['concurrency']}; elapsed {result['elapsed_s']} s\n"
    )
    print("Speed (ops/s: median round; latency: every round pooled)\n")
    print(
        table(
            [
                "case",
                "mode",
                "ops/s",
                "p50 us",
                "p99 us",
                "client CPU us/op",
                "round trips/op",
                "server us/op",
                "client sends per op",
            ],
            [
                [
                    r["label"],
                    r["mode"],
                    f"{r['ops_per_s']:,.0f}",
                    r["p50_us"],
                    r["p99_us"],
                    r["client_cpu_us_per_op"],
                    r["round_trips_per_op"],
                    r["server_us_per_op"],
                    _commands(r["client_commands_per_op"]),
                ]
                for r in result["cases"]
            ],
        )
    )
    print("\nServer time per call (INFO commandstats usec_per_call)\n")
    body: list[list[Any]] = [
        [
            name if name.startswith("calibration") else f"settle script: {name}",
            c["usec_per_call"],
            _commands(c["commands_inside_per_call"]),
        ]
        for name, c in result["scripts"].items()
    ]
    for r in result["cases"]:
        if r["mode"] != "sync" or r["case"] not in ("a.floor", "a.get", "e.first", "e.replay"):
            continue
        for name, c in r["commands"].items():
            body.append([f"{r['label']}: {name.upper()}", c["usec_per_call"], "-"])
    print(table(["command", "usec/call", "commands run inside, per call"], body))
    print("\nTargets (this run)\n")
    print(targets_table(result["targets"]))


def targets_table(targets: list[dict[str, Any]]) -> str:
    """The target rows (``target``, ``value``, ``goal``, ``met``) as a table."""
    return table(
        ["target", "value", "goal", "met"],
        [[t["target"], t["value"], t["goal"], "yes" if t["met"] else "NO"] for t in targets],
    )


def publish(result: dict[str, Any], path: Path, report: Callable[[dict[str, Any]], None]) -> None:
    """Write ``result`` to ``path`` as JSON, then print its report and where the JSON is."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    report(result)
    print(f"\nJSON: {path}")
