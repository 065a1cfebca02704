"""Every Python block of docs/concepts.md runs, in order, against a real redis-server."""

from __future__ import annotations

import re
from pathlib import Path

from settle import Settler

DOC = Path(__file__).resolve().parents[2] / "docs" / "concepts.md"


def test_concepts_examples_run(settler: Settler) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 5
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {"settler": settler})
    # the quarantine block ran first, on an empty quarantine; run it again on the evidence
    exec(compile(blocks[0], str(DOC), "exec"), {"settler": settler})
    stale = settler.quarantine.list(kind="stale_generation")
    assert stale
    assert all(e.resolution is not None for e in stale)
