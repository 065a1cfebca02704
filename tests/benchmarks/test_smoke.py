"""Both benchmark commands run end to end with tiny counts, as real processes with their own
redis-server, print their tables and write every row and JSON key the docs rely on. No
speed is asserted: only what the counters and the fault scenarios establish."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

SPEED_CASES = {
    ("a.floor", "sync"),
    ("a.floor", "async"),
    ("a.get", "sync"),
    ("a.get", "async"),
    ("b.reserve_complete", "sync"),
    ("b.reserve_complete", "async"),
    ("c.replay", "sync"),
    ("c.replay", "async"),
    ("d.first", "sync"),
    ("d.first", "async"),
    ("d.replay", "sync"),
    ("d.replay", "async"),
    ("e.first", "sync"),
    ("e.replay", "sync"),
}
DEPLOYMENT_SCENARIOS = {
    "evicting_policy",
    "restart_no_persistence",
    "cluster_failover",
    "sentinel_failover",
}
SCENARIOS = {
    "late_success",
    "late_failure",
    "timeout",
    "takeover",
    "changed_payload",
    "identical_validated",
    "other_principal",
    "async",
}


def _run(module: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def speed(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("speed") / "speed.json"
    printed = _run(
        "benchmarks.speed",
        "--rounds=1",
        "--seconds=0.05",
        "--warmup=2",
        "--monitor-ops=3",
        "--script-calls=5",
        "--concurrency=4",
        f"--json={out}",
    )
    return json.loads(out.read_text()), printed


def test_speed_writes_every_case_and_key(speed: tuple[dict[str, Any], str]) -> None:
    result, printed = speed
    assert set(result) >= {"machine", "settings", "cases", "scripts", "targets", "elapsed_s"}
    assert set(result["machine"]) >= {"nproc", "cpu_model", "python", "redis_server"}
    assert {(r["case"], r["mode"]) for r in result["cases"]} == SPEED_CASES
    for row in result["cases"]:
        assert row["ops"] > 0
        assert set(row) >= {
            "ops_per_s",
            "p50_us",
            "p99_us",
            "round_trips_per_op",
            "server_us_per_op",
            "commands",
        }
    assert set(result["scripts"]) >= {
        "reserve (new)",
        "reserve (replay)",
        "complete (accepted)",
        "fail (accepted)",
        "mark_provisional (accepted)",
        "renew",
        "get",
    }
    # The command floors run exactly the commands settle's two write scripts run (a reserve
    # of a new operation reads its key and the clock once: its head's reads serve it).
    scripts = result["scripts"]
    for name in ("reserve (new)", "complete (accepted)"):
        floor = scripts[f"calibration: {name}'s commands, no rules"]
        assert floor["commands_inside_per_call"] == scripts[name]["commands_inside_per_call"]
    # The call's shape alone (a reserve's keys and arguments, no command): nothing inside.
    shape = scripts["calibration: no commands, a reserve's 3 keys and 10 arguments"]
    assert shape["commands_inside_per_call"] == {}
    assert shape["calls"] == scripts["reserve (replay)"]["calls"]
    assert scripts["reserve (new)"]["commands_inside_per_call"] == {
        "get": 1.0,
        "hget": 2.0,
        "hset": 1.0,
        "set": 1.0,
        "time": 1.0,
    }
    targets = {t["target"] for t in result["targets"]}
    assert not any("calibration" in t for t in targets)
    assert "decorator replay / peer replay (sync)" in targets
    assert "replay round trips per call (async)" in targets
    # Issue 19's targets, as ratios within the run: every script against the trivial one.
    assert "server time: get / trivial script (read)" in targets
    assert "server time: complete (accepted) / trivial script (write)" in targets
    goals = {t["target"]: t["goal"] for t in result["targets"]}
    assert goals["decorator first call / peer first call (sync)"] == ">= 1.1x"
    assert goals["server time: reserve (new) / trivial script (write)"] == "<= 2.5x"
    # the stretch goal: 64 coalescing tasks at 1.5x redis-py's naive asyncio floor
    stretch = "stretch: reserve+complete / naive raw floor (async, concurrent tasks)"
    assert goals[stretch] == ">= 1.5x"
    assert "Targets (this run)" in printed


def test_speed_counts_round_trips_on_the_server(speed: tuple[dict[str, Any], str]) -> None:
    """The round trips come from the server's counters: a settle replay is one script call
    (FCALL on Redis 7+ and Valkey, EVALSHA on 6.2; the script-cost table measured the same
    one) and settle's client sends nothing else; the raw floor is two SETs."""
    rows = {(r["case"], r["mode"]): r for r in speed[0]["cases"]}
    paths = {cost["path"] for cost in speed[0]["scripts"].values()}
    assert len(paths) == 1
    path = paths.pop()
    for mode in ("sync", "async"):
        replay = rows[("c.replay", mode)]
        assert replay["round_trips_per_op"] == 1.0
        assert replay["client_commands_per_op"] == {path: 1.0}
        assert rows[("b.reserve_complete", mode)]["client_commands_per_op"] == {path: 2.0}
        assert rows[("a.floor", mode)]["client_commands_per_op"] == {"set": 2.0}
    assert rows[("d.replay", "sync")]["round_trips_per_op"] == 1.0


def test_anomalies_rows_and_settle_outcomes(tmp_path: Path) -> None:
    out = tmp_path / "anomalies.json"
    printed = _run("benchmarks.anomalies", "--lease=0.3", f"--json={out}")
    result = json.loads(out.read_text())
    rows = {(r["scenario"], r["library"]): r for r in result["rows"]}
    every = SCENARIOS | DEPLOYMENT_SCENARIOS
    assert set(rows) == {(s, lib) for s in every for lib in ("settle", "powertools")}
    for row in rows.values():
        assert set(row) >= {
            "effects",
            "duplicate_effects",
            "results_overwritten",
            "results_lost",
            "caller_saw",
        }
    settle = {s: rows[(s, "settle")] for s in SCENARIOS}
    # settle never replaces or drops a committed result, whatever the fault.
    assert all(r["results_overwritten"] == 0 and r["results_lost"] == 0 for r in settle.values())
    # A live worker keeps its lease: the retry waits and gets the first worker's result.
    assert settle["takeover"]["effects"] == 1
    # A worker that lost its lease is told so; its late result is not reported committed.
    assert "A: StaleAttempt" in settle["late_success"]["caller_saw"]
    assert "A: StaleAttempt" in settle["late_failure"]["caller_saw"]
    assert "FingerprintMismatch" in settle["changed_payload"]["caller_saw"]
    assert "BindingMismatch" in settle["other_principal"]["caller_saw"]
    assert settle["async"]["effects"] == 1
    assert "what the callers saw" in printed
    deployed = {s: rows[(s, "settle")] for s in DEPLOYMENT_SCENARIOS}
    # An evicting server is refused before anything runs: no effect at all.
    assert deployed["evicting_policy"]["effects"] == 0
    assert "first: ConfigurationError" in deployed["evicting_policy"]["caller_saw"]
    # With min_replicas=1 a failover never makes settle run the charge twice: a completion
    # is either acknowledged by the replica (and replays) or refused as DurabilityError.
    for key in ("cluster_failover", "sentinel_failover"):
        assert deployed[key]["effects"] == 1
        assert deployed[key]["duplicate_effects"] == 0
    assert "DurabilityError" in deployed["sentinel_failover"]["caller_saw"]
    # A restart without persistence forgets the record: settle cannot prevent the second
    # charge (docs/operations.md: AOF; settle doctor warns).
    assert deployed["restart_no_persistence"]["effects"] == 2


def test_the_telemetry_benchmark_prints_every_mode_side_by_side() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.telemetry", "--rounds", "1", "--seconds", "0.2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    result = json.loads(lines[-1])
    modes = ["off", "floor", "sdk", "floor-sampled", "sampled"]
    assert list(result["median"]) == modes
    assert all(rate > 0 for rate in result["median"].values())
    table = [line.split()[0] for line in lines[1:8] if not line.startswith(" ")]
    assert table == ["mode", *modes]
    # settle's own part is reported for the two modes it reports in, against their floors.
    assert {mode for mode, o in result["overhead"].items() if "settle_own_us" in o} == {
        "sdk",
        "sampled",
    }


def test_the_profile_names_where_the_time_goes() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.profile", "--pairs", "50"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split("|")[1].strip() for line in proc.stdout.splitlines() if "%" in line]
    assert "socket wait (server + loopback)" in rows
    assert "settle: rules (plan, decode)" in rows
    assert "redis-py + hiredis" in rows
