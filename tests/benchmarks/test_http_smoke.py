"""``python -m benchmarks.http`` runs end to end with one short round: three real uvicorn
servers loaded by Debian's wrk (.ci/run installs it), every variant in the table and the
JSON, every request answered 2xx with no socket error. No speed is asserted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.benchmarks.test_smoke import _run

VARIANTS = {"bare", "settle_new", "settle_replay", "peer_new", "peer_replay"}
TARGETS = {
    "settle new key / bare",
    "settle new key / peer new key",
    "settle replay / bare",
    "settle replay / peer replay",
}


def test_the_http_benchmark_loads_every_variant_without_errors(tmp_path: Path) -> None:
    wrk = shutil.which("wrk")
    assert wrk is not None, "wrk is not installed: apt-get install wrk (.ci/run installs it)"
    out = tmp_path / "http.json"
    printed = _run(
        "benchmarks.http",
        "--rounds=1",
        "--seconds=1",
        "--connections=4",
        f"--wrk={wrk}",
        f"--json={out}",
    )
    result = json.loads(out.read_text())
    rows = {r["variant"]: r for r in result["variants"]}
    assert set(rows) == VARIANTS
    for row in rows.values():
        assert row["requests"] > 0, row
        # Every request got a 2xx (wrk's "status" counts the others) over a clean socket.
        assert row["errors"] == dict.fromkeys(
            ("connect", "read", "write", "status", "timeout"), 0
        ), row
        assert row["req_per_s"] > 0
        assert row["p99_ms"] >= row["p50_ms"] > 0
        assert row["server_cpu_ms_per_request"] >= 0
        assert row["label"] in printed
    assert {t["target"] for t in result["targets"]} == TARGETS
    assert "Targets (this run)" in printed
    assert result["settings"]["connections"] == 4
