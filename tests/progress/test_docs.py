"""The example of docs/delivery-progress.md runs as written, in a fresh process."""

from __future__ import annotations

from tests.docs_examples import run_doc_example


def test_the_example_runs() -> None:
    proc = run_doc_example("delivery-progress.md")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if not line.startswith("20")]
    assert lines == [
        "3 ['acked', 'acked', 'acked']",
        "{'a': 6, 'b': 7} True",
        "settle:{orders}:dead:orders",
    ], proc.stdout[-3000:]
