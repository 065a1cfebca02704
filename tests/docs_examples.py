"""Run a doc page's Python blocks, joined, as one program in a fresh process (the way a
reader pastes them): the docs tests of the companion parts share it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_doc_example(page: str) -> subprocess.CompletedProcess[str]:
    """Run every ```python block of ``docs/<page>``; fails if the page has none."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, f"docs/{page} lost its example"
    return subprocess.run(
        [sys.executable, "-c", "\n".join(blocks)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
