"""The counterexample traces docs/correctness.md ("A broken rule is caught") shows for the
two broken scripts are the ones the checker prints: each step line of the doc (payloads
abbreviated there as ``...``) is a line of the checker's trace."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.modelcheck.explore import Bounds, explore
from tests.modelcheck.test_modelcheck import (
    _break,
    _downgrading_timeout,
    _stale_accepting_complete,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "correctness.md"


def documented_trace(test_name: str) -> list[str]:
    """The step lines of the block that follows the doc's mention of ``test_name``."""
    text = DOC.read_text(encoding="utf-8")
    after = text[text.index(f"`{test_name}`") :]
    block = after[after.index("```\n") + 4 :]
    block = block[: block.index("```")]
    return [line for line in block.splitlines() if re.match(r"\s+\d+\. ", line)]


@pytest.mark.parametrize(
    ("test_name", "script", "broken", "depth"),
    [
        (
            "test_a_timeout_that_downgrades_a_completed_record_is_caught_with_a_trace",
            "mark_provisional",
            _downgrading_timeout,
            4,
        ),
        (
            "test_a_complete_that_forgets_the_fence_is_caught_with_a_trace",
            "complete",
            _stale_accepting_complete,
            5,
        ),
    ],
)
def test_the_documented_trace_is_the_checkers(
    monkeypatch: pytest.MonkeyPatch, test_name: str, script: str, broken: Any, depth: int
) -> None:
    _break(monkeypatch, script, broken)
    found = explore(Bounds(workers=3, reserves=1, depth=depth)).counterexample
    assert found is not None
    printed = str(found).splitlines()
    steps = documented_trace(test_name)
    assert steps, f"docs/correctness.md shows no trace for {test_name}"
    for line in steps:
        # what the doc abbreviates (``...``) stands for any text; the rest is as printed
        pattern = ".*".join(re.escape(part) for part in line.split("..."))
        assert any(re.fullmatch(pattern, p) for p in printed), (line, printed)
