"""``settle demo`` through the console script: on an embedded redis-server it starts and
stops itself, and on a given Redis where its data stays."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

from settle.demo.plan import Fault, draw
from tests.cli.conftest import DEMO_OPS, DEMO_SEED, Demo, cli_env, settle

_EMBEDDED = re.compile(r"embedded redis-server \(pid (\d+)\) on redis://127\.0\.0\.1:(\d+)/0")


def _gone(pid: int, port: int) -> None:
    """The embedded server and every worker process that used it are gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        pass
    else:
        status = Path(f"/proc/{pid}/status").read_text()
        raise AssertionError(f"redis-server {pid} still exists: {status.splitlines()[:3]}")
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        assert f"127.0.0.1:{port}" not in text, f"left over: {text}"
        assert f"--port {port} " not in text, f"left over: {text}"
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0, "something still listens on the port"


def test_demo_on_embedded_redis_has_no_duplicate_effects_and_meets_every_fault(
    settle_bin: Path,
) -> None:
    done = settle("demo", "--ops", "60", "--seed", "7", "--workers", "6", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["duplicate_effects"] == 0
    assert report["ok"] is True
    assert all(check["ok"] for check in report["checks"])
    for fault in Fault:
        counts = report["faults"][fault.value]
        assert counts["injected"] > 0, fault
        assert counts["observed"] == counts["injected"], (fault, counts)
    assert report["operations"] == 60
    assert report["states"]["completed"] + report["states"]["failed"] == 60
    late = report["faults"]["late_stale_response"]["injected"]
    crashed = report["faults"]["crashed_worker"]["injected"]
    assert report["quarantined"]["stale_generation"] == late
    assert report["takeovers"]["after_lease_expiry"] == crashed + late
    assert report["takeovers"]["after_provisional"] > 0
    assert report["replays"] > 0
    assert report["attempts"] > report["operations"]
    # one charge per completed order, never more
    assert report["provider"]["effects"] == report["states"]["completed"]
    assert report["provider"]["deduplicated"] > 0
    # the embedded server was stopped
    match = _EMBEDDED.search(done.stderr)
    assert match, done.stderr
    _gone(int(match.group(1)), int(match.group(2)))


def test_demo_on_given_redis_prints_the_table_and_keeps_its_data(demo_data: Demo) -> None:
    assert demo_data.returncode == 0, demo_data.stderr
    out = demo_data.output
    assert "embedded" not in demo_data.stderr  # it used the given Redis
    assert re.search(r"duplicate downstream effects\s*│\s*0\s*│", out), out
    expected = draw(DEMO_OPS, DEMO_SEED, "x").injected()
    for fault in Fault:
        n = expected[fault.value]
        assert re.search(rf"│ {fault.value}\s*│\s*{n} │\s*{n} │", out), (fault, out)
    assert re.search(r"quarantined: stale_generation\s*│\s*[1-9]", out)
    assert "FAIL" not in out
    stats = json.loads(settle("stats", *demo_data.args(), "--json", env=cli_env()).stdout)
    assert stats["records"]["total"] == DEMO_OPS


def test_same_seed_draws_the_same_workload() -> None:
    a, b = draw(50, 3, "r1"), draw(50, 3, "r2")
    assert [(o.request.amount, o.merchant, o.faults) for o in a.orders] == [
        (o.request.amount, o.merchant, o.faults) for o in b.orders
    ]
    c = draw(50, 4, "r1")
    assert [o.faults for o in a.orders] != [o.faults for o in c.orders]
    # every fault is given to someone, even in the smallest workload
    assert all(n > 0 for n in draw(6, 1, "r").injected().values())


def _long_demo(settle_bin: Path) -> tuple[subprocess.Popen[str], int, int]:
    """A long ``settle demo`` on an embedded server: the process, the server's pid and port."""
    proc = subprocess.Popen(
        [str(settle_bin), "demo", "--ops", "20000", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    match = _EMBEDDED.search(line)
    assert match, line
    return proc, int(match.group(1)), int(match.group(2))


def _signalled(settle_bin: Path, signum: int) -> tuple[int, str, int, int, bool]:
    """A long demo sent ``signum`` while it runs: its exit code, stderr, the embedded
    server's pid and port, and whether that server still ran after the demo. No server is
    left behind, even when the demo fails to stop it (killed, parent 1, it would run on)."""
    proc, pid, port = _long_demo(settle_bin)
    try:
        time.sleep(1.5)  # the workload (and its worker processes) are running
        assert proc.poll() is None
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
        left = _running(pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return proc.returncode, err, pid, port, left


def test_demo_stops_its_embedded_redis_on_ctrl_c(settle_bin: Path) -> None:
    code, err, pid, port, left = _signalled(settle_bin, signal.SIGINT)
    assert not left, "the embedded redis-server outlived the demo"
    assert code == 130, err
    assert "interrupted" in err
    assert "Traceback" not in err
    _gone(pid, port)


def test_demo_stops_its_embedded_redis_on_sighup(settle_bin: Path) -> None:
    """The terminal closed (or ``timeout -s HUP``, an ssh session dropped): SIGHUP ended
    the demo without its cleanup, and redis-server (which ignores SIGHUP) went on running
    with parent 1, for good."""
    code, err, pid, port, left = _signalled(settle_bin, signal.SIGHUP)
    assert not left, "the embedded redis-server outlived the demo"
    assert code == 128 + signal.SIGHUP, err
    assert "Traceback" not in err
    _gone(pid, port)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (exists and is not a zombie) after a moment to stop in."""
    time.sleep(0.5)
    try:
        return " Z " not in Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1][:3]
    except FileNotFoundError:
        return False


def test_demo_with_an_unreachable_redis_fails_clearly(settle_bin: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once the socket is closed
    done = settle("demo", "--redis-url", f"redis://127.0.0.1:{port}/0", "--ops", "10")
    assert done.returncode == 3
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("settle: cannot reach Redis at redis://127.0.0.1:")
    assert done.stdout == ""


def test_demo_says_its_embedded_redis_died_mid_run(settle_bin: Path) -> None:
    """The embedded server killed while the workload runs: the demo ends promptly with one
    line naming that server and what ended it (exit 3, Redis unavailable), not a worker
    process's failure (exit 1, which says a check failed) or a hang."""
    proc, pid, port = _long_demo(settle_bin)
    try:
        time.sleep(1.0)  # the workload (and its worker processes) are running
        assert proc.poll() is None
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(
        f"settle: the embedded redis-server (pid {pid}) stopped during the run (killed by SIGKILL)"
    ), err
    assert "worker process" not in err
    _gone(pid, port)


def test_demo_waits_for_a_paused_redis_no_longer_than_redis_timeout(settle_bin: Path) -> None:
    """``--redis-timeout`` bounds every wait for Redis in the run, as its help says (the
    library's 30 s socket timeout, four tries, held the demo a minute against a paused
    server; the option bounded only the first check)."""
    proc = subprocess.Popen(
        [str(settle_bin), "demo", "--ops", "20000", "--redis-timeout", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    assert proc.stderr is not None
    match = _EMBEDDED.search(proc.stderr.readline())
    assert match
    pid, port = int(match.group(1)), int(match.group(2))
    try:
        time.sleep(1.0)  # the workload (and its worker processes) are running
        os.kill(pid, signal.SIGSTOP)
        paused = time.monotonic()
        _, err = proc.communicate(timeout=90)
        took = time.monotonic() - paused
        left = _running(pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # SIGCONT left it running, parent 1, on a failure
    assert not left, "the embedded redis-server outlived the demo"
    assert proc.returncode == 3, err
    assert "cannot reach Redis" in err, err
    assert "Traceback" not in err
    assert took < 20, f"{took:.1f} s"
    _gone(pid, port)
