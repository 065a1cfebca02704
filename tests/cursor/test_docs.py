"""The runnable example of docs/cursor-checkpoints.md runs, in a fresh process."""

from __future__ import annotations

from tests.docs_examples import run_doc_example


def test_the_quick_start_example_runs() -> None:
    proc = run_doc_example("cursor-checkpoints.md")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "['promoted', 'promoted', 'promoted', 'held']" in proc.stdout
    assert "stable_boundary gap" in proc.stdout
