"""``python -m benchmarks.instructions`` runs end to end with a few calls per script path: a
real redis-server under valgrind's callgrind (.ci/run installs valgrind), every script path
of the speed benchmark's server-time table counted, the ratios to the trivial script and the
goals printed and written. No count is asserted beyond what the method guarantees."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks._scripts import TRIVIAL
from tests.benchmarks.test_smoke import _run

SCRIPTS = {
    "reserve (new)",
    "complete (accepted)",
    "reserve (replay)",
    "complete (absorbed duplicate)",
    "complete (absorbed duplicate, log at its cap)",
    "fail (accepted)",
    "mark_provisional (accepted)",
    "reserve (takeover of provisional)",
    "complete (quarantined: stale generation)",
    "renew",
    "get",
}


def test_instructions_counts_every_script_path_against_the_trivial_script(tmp_path: Path) -> None:
    assert shutil.which("valgrind"), "valgrind is not installed: apt-get install valgrind"
    out = tmp_path / "instructions.json"
    printed = _run("benchmarks.instructions", "--calls=20", f"--json={out}")
    result = json.loads(out.read_text())
    assert result["calls"] == 20
    rows = {row["script"]: row for row in result["rows"]}
    assert set(rows) >= {*SCRIPTS, TRIVIAL}
    trivial = rows[TRIVIAL]["instructions_per_call"]
    assert trivial > 0
    for name in SCRIPTS:
        row = rows[name]
        # every script does more than the trivial one's two commands, and is read as a
        # write or a read against issue 19's goals
        assert row["instructions_per_call"] > trivial, row
        assert abs(row["x_trivial"] - row["instructions_per_call"] / trivial) < 0.01
        assert row["goal"] == (1.5 if name in {"reserve (replay)", "get"} else 2.5)
        assert row["met"] == (row["x_trivial"] <= row["goal"])
        assert name in printed
    assert "instructions per call" in printed


def test_anatomy_counts_a_replay_step_by_step_and_its_last_step_is_settles_reply(
    tmp_path: Path,
) -> None:
    """``python -m benchmarks.anatomy`` cuts settle's own replay script after each step of
    its head and counts each cut on a real server under callgrind; it refuses to report
    when the last cut does not reply what settle's script replies (the cuts would then not
    be the replay's)."""
    from benchmarks.anatomy import STEPS  # noqa: PLC0415

    assert shutil.which("valgrind"), "valgrind is not installed: apt-get install valgrind"
    out = tmp_path / "anatomy.json"
    printed = _run("benchmarks.anatomy", "--calls=10", f"--json={out}")
    result = json.loads(out.read_text())
    steps = [row["step"] for row in result["rows"]]
    assert steps == [TRIVIAL, *(name for name, _ in STEPS), "settle's replay (the script it sends)"]
    counts = {row["step"]: row["instructions_per_call"] for row in result["rows"]}
    # the whole replay does everything the call alone does, and far more
    assert counts[steps[-1]] > 2 * counts[STEPS[0][0]] > 0
    for name in steps:
        assert name in printed
