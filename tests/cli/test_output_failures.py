"""Output that cannot be written: a full disk (``> /dev/full``) ends every command with one
line and exit 1, as ``quarantine export`` always did, never a Python traceback; help and the
version written into a pipe whose reader is gone end quietly with exit 0, as every command's
output does (tests/cli/test_reader_stops.py); Ctrl-C is exit 130, as in the demo."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from settle import Settler
from tests.cli.conftest import SETTLE, WAITING_COMMANDS, cli_env, waiting_on_silent_redis
from tests.cli.helpers import stale_settlement

FULL = "settle: the output to stdout is incomplete: a write failed (No space left on device)"


def _into(stdout: int, *args: str, module: str | None = None) -> subprocess.CompletedProcess[str]:
    # (-W: runpy warns that settle.cli imported the module first, on every such run)
    command = (
        [sys.executable, "-W", "ignore::RuntimeWarning", "-m", module] if module else [str(SETTLE)]
    )
    return subprocess.run(
        [*command, *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(SETTLE_DIGEST_KEY="k"),
        timeout=120,
        check=False,
    )


def _to_full_disk(*args: str, module: str | None = None) -> subprocess.CompletedProcess[str]:
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        return _into(fd, *args, module=module)
    finally:
        os.close(fd)


def _reader_gone(*args: str, module: str | None = None) -> subprocess.CompletedProcess[str]:
    read, write = os.pipe()
    os.close(read)
    try:
        return _into(write, *args, module=module)
    finally:
        os.close(write)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("as_json", [(), ("--json",)], ids=["table", "json"])
def test_a_full_disk_is_one_line_and_exit_1_in_every_command(
    cli_settler: Settler, redis_url: str, namespace: str, as_json: tuple[str, ...]
) -> None:
    qid = stale_settlement(cli_settler, "charge:full-1")
    connection = ("--redis-url", redis_url, "--namespace", namespace)
    commands = [
        ("stats", *connection),
        ("inspect", "charge:full-1", *connection),
        ("quarantine", "ls", *connection),
        ("quarantine", "show", qid, *connection),
        ("quarantine", "resolve", qid, "--note", "checked", *connection),
        # the entry is printed at once (--since), and its write fails
        ("quarantine", "tail", "--since", "1d", *connection),
        ("quarantine", "trim", "--resolved", "--before", "30d", *connection),
        ("doctor", *connection),
        ("digest", "order-1"),
    ]
    for command in commands:
        done = _to_full_disk(*command, *as_json)
        # It was a traceback ending in "OSError: [Errno 28] No space left on device", exit 1.
        assert (done.returncode, done.stderr.splitlines()[-1:]) == (1, [FULL]), command
        assert "Traceback" not in done.stderr, command
    # export keeps its own words, which say what to do before trimming
    done = _to_full_disk("quarantine", "export", *connection, *as_json)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("settle: the export to stdout is incomplete"), done.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize(
    "args",
    [("--help",), ("--version",), ("stats", "--help"), ("quarantine", "ls", "--help")],
)
def test_help_and_version_on_a_full_disk_are_one_line_and_exit_1(args: tuple[str, ...]) -> None:
    done = _to_full_disk(*args)
    assert (done.returncode, done.stderr) == (1, FULL + "\n")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("module", ["settle.cli.cursor", "settle.cli.progress"])
def test_the_companion_groups_run_alone_say_a_full_disk_in_one_line(module: str) -> None:
    done = _to_full_disk("--help", module=module)
    assert (done.returncode, done.stderr) == (1, FULL + "\n")


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("--version",),
        ("stats", "--help"),
        ("quarantine", "--help"),
        ("quarantine", "ls", "--help"),
        ("cursor", "show", "--help"),
    ],
)
def test_help_into_a_closed_pipe_ends_quietly_with_exit_0(args: tuple[str, ...]) -> None:
    # `settle --help | head -0` exited 1 (click's own handling), the code for "not found";
    # a command's output into a closed pipe exits 0.
    done = _reader_gone(*args)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.parametrize("module", ["settle.cli.cursor", "settle.cli.progress"])
def test_the_companion_groups_run_alone_end_quietly_when_their_reader_stops(module: str) -> None:
    done = _reader_gone("--help", module=module)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.parametrize("command", WAITING_COMMANDS, ids=" ".join)
def test_ctrl_c_while_a_command_waits_for_redis_is_exit_130(command: tuple[str, ...]) -> None:
    """Ctrl-C printed click's "Aborted!" and exited 1, the code for "not found" (for doctor
    "a check failed", for export "incomplete"): a script could not tell an interrupted run
    from an answer. It exits 130, as the demo does."""
    with waiting_on_silent_redis([str(SETTLE), *command]) as (proc, connection):
        connection.settimeout(60)
        # The command sent its first request and waits for the reply: its bytes are
        # here (a fixed 0.2 s guessed it; recv blocks, up to the 60 s timeout).
        assert connection.recv(1, socket.MSG_PEEK), "the command sent nothing"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (130, "", "settle: interrupted\n")


def _stdout_closed(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SETTLE), *args],
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        timeout=120,
        check=False,
        preexec_fn=lambda: os.close(1),  # as the shell's >&- leaves it
    )


@pytest.mark.parametrize(
    "args",
    [
        ("stats",),
        ("stats", "--json"),
        ("quarantine", "ls"),
        ("quarantine", "tail", "--since", "1d"),
        ("--help",),
        ("--version",),
    ],
    ids=" ".join,
)
def test_a_closed_stdout_is_one_line_and_exit_1(
    cli_settler: Settler, redis_url: str, namespace: str, args: tuple[str, ...]
) -> None:
    """``settle stats >&-``: the table ended in an AttributeError traceback, and ``--json``
    or ``--help`` exited 0 having printed nothing anywhere."""
    stale_settlement(cli_settler, "charge:closed-1")
    connection = () if args[0].startswith("--") else ("--redis-url", redis_url)
    done = _stdout_closed(*args, *connection, *(("--namespace", namespace) if connection else ()))
    said = "settle: the output to stdout is incomplete: a write failed (stdout is closed)"
    lines = done.stderr.splitlines()
    if "tail" in args:  # its "following the quarantine of ..." line comes first
        lines = lines[1:]
    assert (done.returncode, lines) == (1, [said])


def test_export_into_a_closed_stdout_says_the_export_is_incomplete(
    cli_settler: Settler, redis_url: str, namespace: str
) -> None:
    """``settle quarantine export >&-``: the export's own failure message, as on a full disk,
    never a traceback (it ended in ``io.UnsupportedOperation: stdout is closed``, raised
    while the export dropped what it could not write)."""
    stale_settlement(cli_settler, "charge:closed-export")
    done = _stdout_closed(
        "quarantine", "export", "--redis-url", redis_url, "--namespace", namespace
    )
    said = (
        "settle: the export to stdout is incomplete: a write failed (stdout is closed); "
        "export again before trimming anything\n"
    )
    assert (done.returncode, done.stderr) == (1, said)
