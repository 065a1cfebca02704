"""``python -m benchmarks.client`` counts the client's instructions per call: each case's
process runs to its end (no valgrind needed for that), and one case counted under
cachegrind (.ci/run installs valgrind) gives more instructions with more calls. No count
is asserted beyond what the method guarantees."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks.client import CASES, _count, _print, main
from settle.embedded import EmbeddedRedis
from tests.benchmarks.test_smoke import _run


@pytest.mark.parametrize("case", list(CASES))
def test_each_cases_process_makes_its_calls(case: str, redis_url: str) -> None:
    _run("benchmarks.client", "--child", redis_url, case, "3")


def test_a_case_counted_under_cachegrind_costs_more_with_more_calls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert shutil.which("valgrind"), "valgrind is not installed: apt-get install valgrind"
    with EmbeddedRedis() as server:
        none = _count(server.url, "replay", 0, tmp_path)
        some = _count(server.url, "replay", 20, tmp_path)
    per_call = (some - none) // 20
    assert per_call > 10_000  # a replay is a script call, a fingerprint and a decoding
    _print(
        {
            "calls": 20,
            "warmup": 200,
            "python": "3",
            "rows": [{"case": "replay", "label": CASES["replay"], "instructions_per_call": [1, 2]}],
        }
    )
    assert CASES["replay"] in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--cases", "async_pair,nope"], ["--cases"]])
def test_cases_it_does_not_know_are_refused_before_anything_is_counted(argv: list[str]) -> None:
    """``--cases`` picks a few of CASES: a name it does not know, or none given, is refused
    with the names it knows (a bare ``--cases`` was an IndexError)."""
    with pytest.raises(SystemExit, match=r"unknown cases.*async_pair_1"):
        main(argv)
