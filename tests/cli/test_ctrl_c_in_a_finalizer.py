"""Ctrl-C that lands while a finalizer or the garbage collector runs: Python prints
"Exception ignored" and loses its ``KeyboardInterrupt`` (redis-py's connections and pools
have ``__del__``), so the command went on waiting for Redis and then said ``cannot reach
Redis``, exit 3, to an operator who had pressed Ctrl-C: a script took it for an outage. The
command remembers the Ctrl-C: ``settle: interrupted``, exit 130, and nothing else on stderr.

The Ctrl-C is sent by the command's own process from a garbage-collector callback (where a
raise is lost, as in a finalizer), the first time one runs while the command is inside
redis-py's connection code, talking to a server that accepts and never answers."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from settle import Settler
from tests.cli.conftest import (
    WAITING_COMMANDS,
    _sigint_not_ignored,
    cli_env,
    waiting_on_silent_redis,
)

_DRIVER = textwrap.dedent(
    """
    import gc, os, signal, sys
    from settle.cli import main

    fired = []

    def talking_to_redis():
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code.co_filename.endswith(os.path.join("redis", "connection.py")):
                return True
            frame = frame.f_back
        return False

    def ctrl_c_in_the_collector(phase, info):
        if fired or phase != "start" or not talking_to_redis():
            return
        fired.append(1)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs here, between these bytecodes: its raise is lost
            pass

    def collect_often_once_connecting(event, args):  # (imports stay quick before)
        if event == "socket.connect":
            gc.set_threshold(1)

    gc.callbacks.append(ctrl_c_in_the_collector)
    sys.addaudithook(collect_often_once_connecting)
    sys.argv = ["settle", *sys.argv[1:]]
    main()
    """
)


# quarantine tail, found in review: its own Ctrl-C handler left the group unaware, and it
# said "cannot reach Redis", exit 3 (its Ctrl-C while connecting is 130, as every command's)
@pytest.mark.parametrize("command", [*WAITING_COMMANDS, ("quarantine", "tail")], ids=" ".join)
def test_a_ctrl_c_python_lost_in_a_finalizer_is_still_exit_130(command: tuple[str, ...]) -> None:
    command_line = [sys.executable, "-c", _DRIVER, *command]
    with waiting_on_silent_redis(command_line, "--redis-timeout", "1") as (proc, _):
        out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (130, "", "settle: interrupted\n")


@pytest.mark.parametrize("command", [("quarantine", "ls"), ("stats",)], ids=" ".join)
def test_a_command_that_runs_on_after_a_lost_ctrl_c_is_still_exit_130(
    command: tuple[str, ...], cli_settler: Settler, redis_url: str, namespace: str
) -> None:
    """Found in review: against a server that answers, the command whose Ctrl-C Python lost
    ran to its end and exited 0, saying nothing (its "Exception ignored" hidden): the
    operator's Ctrl-C vanished, and a script read a run it had stopped as a clean one."""
    del cli_settler  # the namespace exists
    argv = [sys.executable, "-c", _DRIVER, *command, "--redis-url", redis_url]
    with _sigint_not_ignored():
        done = subprocess.run(
            [*argv, "--namespace", namespace],
            capture_output=True,
            text=True,
            env=cli_env(),
            timeout=60,
            check=False,
        )
    assert (done.returncode, done.stderr) == (130, "settle: interrupted\n")


def test_a_demo_that_runs_on_after_a_lost_ctrl_c_is_still_exit_130() -> None:
    """Found in review: the demo put Python's own Ctrl-C handler in place of the group's,
    so a Ctrl-C lost in a finalizer was forgotten: the demo ran its whole workload and
    exited 0 ("Exception ignored" on stderr), where docs/cli.md says 130."""
    argv = [sys.executable, "-c", _DRIVER, "demo", "--ops", "10", "--workers", "2"]
    with _sigint_not_ignored():
        done = subprocess.run(
            argv, capture_output=True, text=True, env=cli_env(), timeout=300, check=False
        )
    assert done.returncode == 130, done.stderr
    assert done.stderr.endswith("\nsettle: interrupted\n"), done.stderr
    assert "Exception ignored" not in done.stderr
