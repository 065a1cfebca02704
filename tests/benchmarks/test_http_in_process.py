"""``python -m benchmarks._http_app --in-process``, the tool docs/benchmarks.md counts the
middleware's instructions with: every variant it measures runs to its JSON line and closes
its Redis clients (no ResourceWarning at exit under ``-X dev``), and a mode the variant
cannot serve is refused with one line that says what to use, before any request."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.benchmarks.test_smoke import ROOT


def _in_process(redis_url: str, variant: str, mode: str) -> subprocess.CompletedProcess[str]:
    tool = [sys.executable, "-X", "dev", "-m", "benchmarks._http_app", "--in-process"]
    return subprocess.run(
        [*tool, variant, mode, "8", redis_url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("variant", "mode"),
    [("bare", "none"), ("settle", "new"), ("settle", "replay"), ("peer", "new")],
)
def test_each_variant_runs_and_closes_its_redis_clients(
    redis_url: str, variant: str, mode: str
) -> None:
    done = _in_process(redis_url, variant, mode)
    assert done.returncode == 0, done.stderr[-3000:]
    # -X dev shows every ResourceWarning: an unclosed settler or store leaves its sockets
    # ("unclosed transport") to the garbage collector after the loop is closed.
    assert "Warning" not in done.stderr, done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert (line["variant"], line["mode"]) == (variant, mode)
    assert line["cpu_us"] > 0


@pytest.mark.parametrize("variant", ["settle", "peer"])
def test_mode_none_is_refused_for_a_middleware_with_a_clear_message(
    redis_url: str, variant: str
) -> None:
    done = _in_process(redis_url, variant, "none")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "mode 'none' sends no Idempotency-Key" in done.stderr
    assert f"use 'new' or 'replay' for {variant!r}" in done.stderr
    assert done.stdout == ""


def test_an_unknown_mode_is_refused_rather_than_measured_as_a_new_key(redis_url: str) -> None:
    done = _in_process(redis_url, "settle", "replayed")
    assert done.returncode == 1
    assert done.stderr.strip() == "unknown mode 'replayed': none, new, replay"
