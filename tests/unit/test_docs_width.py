"""The docs' prose keeps to the house line length, ruff's ``line-length`` (100, in
pyproject.toml): a reviewer reads docs/*.md in the same editor and diff as the code.
Fenced blocks (program output, tables a command prints) and table rows are exempt: they
cannot be wrapped without changing what they show."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["line-length"]


def _prose_over_limit(text: str) -> list[tuple[int, int]]:
    over, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and not line.lstrip().startswith("|") and len(line) > LIMIT:
            over.append((number, len(line)))
    return over


def test_no_prose_line_of_the_docs_is_longer_than_the_house_line_length() -> None:
    over = {
        page.name: lines
        for page in sorted((ROOT / "docs").glob("*.md"))
        if (lines := _prose_over_limit(page.read_text(encoding="utf-8")))
    }
    assert over == {}, f"(line, length) over {LIMIT} characters: rewrap them: {over}"


def test_the_check_sees_a_long_prose_line_but_not_a_fence_or_a_table() -> None:
    long = "word " * 30
    text = f"short\n{long}\n```\n{long}\n```\n| {long} |\n"
    assert _prose_over_limit(text) == [(2, len(long))]
