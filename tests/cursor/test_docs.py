"""The runnable example of docs/cursor-checkpoints.md runs, in a fresh process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "cursor-checkpoints.md"


def test_the_quick_start_example_runs() -> None:
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
    assert "['promoted', 'promoted', 'promoted', 'held']" in proc.stdout
    assert "stable_boundary gap" in proc.stdout
