"""``python -m benchmarks.memory`` runs end to end with a small count, as a real process with
its own redis-server, prints its table and writes every JSON key the docs rely on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_memory_prints_bytes_per_settled_operation(tmp_path: Path) -> None:
    out = tmp_path / "memory.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.memory", "--ops=40", f"--json={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result) >= {"redis_server", "ops", "kinds", "bytes_per_operation", "machine"}
    assert result["ops"] == 40
    assert result["result_bytes"] == 40
    kinds = {k["kind"]: k for k in result["kinds"]}
    assert kinds["op"]["keys"] == 40  # one key per settled operation: its record and log
    assert "log" not in kinds
    own = sum(k["bytes_per_key"] * k["keys"] for k in kinds.values() if k["per_operation"])
    assert result["bytes_per_operation"] == round(own / 40, 1)
    assert result["bytes_per_operation"] <= 320  # issue 19's target (docs/operations.md)
    assert result["meets_target"]
    assert "bytes per settled operation" in done.stdout
