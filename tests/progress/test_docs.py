"""The example of docs/delivery-progress.md runs as written, in a fresh process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "delivery-progress.md"


def test_the_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert blocks, "the doc lost its example"
    proc = subprocess.run(
        [sys.executable, "-c", "\n".join(blocks)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if not line.startswith("20")]
    assert lines == [
        "3 ['acked', 'acked', 'acked']",
        "{'a': 6, 'b': 7} True",
        "settle:{orders}:dead:orders",
    ], proc.stdout[-3000:]
