"""A program reading a command's output that stops early (``settle ... | head``) ends the
command quietly with exit 0, in every command, as ``quarantine export`` always did: rich's
and click's own handling exited 1, the code docs/cli.md gives to "not found", so a script
under ``set -o pipefail`` took ``settle inspect ID | head -3`` for an unknown operation."""

from __future__ import annotations

import os
import subprocess

import pytest

from settle import Settler
from tests.cli.conftest import SETTLE, cli_env
from tests.cli.helpers import stale_settlement


def _reader_gone(*args: str) -> subprocess.CompletedProcess[bytes]:
    """``args`` with stdout a pipe whose reader is gone before anything is written."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [str(SETTLE), *args],
            stdout=write,
            stderr=subprocess.PIPE,
            env=cli_env(SETTLE_DIGEST_KEY="k"),
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)


@pytest.mark.parametrize("as_json", [(), ("--json",)], ids=["table", "json"])
def test_every_command_ends_quietly_with_exit_0_when_its_reader_stops(
    cli_settler: Settler, redis_url: str, namespace: str, as_json: tuple[str, ...]
) -> None:
    qid = stale_settlement(cli_settler, "charge:head-1")
    connection = ("--redis-url", redis_url, "--namespace", namespace)
    commands = [
        ("stats",),
        ("inspect", "charge:head-1"),
        ("quarantine", "ls"),
        ("quarantine", "show", qid),
        ("quarantine", "resolve", qid, "--note", "checked"),
        ("doctor",),
    ]
    for command in commands:
        done = _reader_gone(*command, *connection, *as_json)
        assert (done.returncode, done.stderr) == (0, b""), command
    for command in [("quarantine", "export", *connection), ("digest", "order-1")]:
        done = _reader_gone(*command, *as_json)
        assert (done.returncode, done.stderr) == (0, b""), command
    # a refusal keeps its own code: nothing was printed to stdout
    done = _reader_gone("inspect", "charge:nope", *connection, *as_json)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(b"settle: no operation 'charge:nope'")


def test_the_demo_ends_quietly_with_exit_0_when_its_reader_stops(
    redis_url: str, namespace: str
) -> None:
    done = _reader_gone("demo", "--ops", "12", "--redis-url", redis_url, "--namespace", namespace)
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
