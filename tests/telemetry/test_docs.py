"""The Prometheus example of docs/observability.md runs, in a fresh process (its own
global meter provider), and serves settle's counters; the doc names every instrument and
span attribute settle reports."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "observability.md"


def test_the_prometheus_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1, "the doc lost its example"
    proc = subprocess.run(
        [sys.executable, "-c", blocks[0]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert any(
        'settle_namespace="shop",settle_outcome="replayed"} 1.0' in line for line in lines
    ), proc.stdout
    assert any('settle_outcome="reserved"} 1.0' in line for line in lines)
    assert any('settle_verdict="accepted"} 1.0' in line for line in lines)


def test_the_doc_names_every_instrument_and_attribute() -> None:
    source = (ROOT / "settle" / "_telemetry.py").read_text(encoding="utf-8")
    doc = DOC.read_text(encoding="utf-8")
    named = set(re.findall(r'"((?:settle|db|server|messaging|error|code)\.[a-z_.]+)"', source))
    assert named, "no names found in settle/_telemetry.py"
    missing = sorted(name for name in named if f"`{name}`" not in doc)
    assert missing == []
