"""``quarantine tail`` picks up what is written after it started; ``resolve`` keeps the
evidence; both through the console script."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from settle import Settler
from tests.cli.conftest import cli_env, settle, settle_json
from tests.cli.helpers import stale_settlement
from tests.web.evidence import unknown


def _lines(stream: IO[str], into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


def _stop(proc: subprocess.Popen[str], reader: threading.Thread | None) -> str:
    """SIGINT (Ctrl-C), then wait for the exit and for the reader to see the end. Returns
    what the tail wrote on stderr after its first line, for the failure message."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if reader is not None:
        reader.join(timeout=30)
    errors = proc.stderr.read() if proc.stderr is not None else ""
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    return errors


@dataclass
class _Tail:
    ready: str  # its first line on stderr, said once it follows
    out: queue.Queue[str]  # its stdout, a line at a time
    said: str = ""  # its stderr after the first line, once it was stopped


@contextmanager
def _tail(settle_bin: Path, redis_url: str, namespace: str, *options: str) -> Iterator[_Tail]:
    """``settle quarantine tail *options`` (every 0.1 s) through the console script, once it
    follows; stopped with Ctrl-C at the end, where it must exit 0."""
    proc = subprocess.Popen(
        [str(settle_bin), "quarantine", "tail", *options, "--interval", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(SETTLE_REDIS_URL=redis_url, SETTLE_NAMESPACE=namespace),
    )
    out: queue.Queue[str] = queue.Queue()
    reader = None
    tail = _Tail("", out)
    try:
        assert proc.stderr is not None
        assert proc.stdout is not None
        tail.ready = proc.stderr.readline()
        reader = threading.Thread(target=_lines, args=(proc.stdout, out), daemon=True)
        reader.start()
        yield tail
    finally:
        tail.said = _stop(proc, reader)
    assert proc.returncode == 0, tail.said


def test_tail_prints_an_entry_written_after_it_started(
    settle_bin: Path, cli_settler: Settler, redis_url: str, namespace: str
) -> None:
    stale_settlement(cli_settler, "order-before")  # already there: not printed
    with _tail(settle_bin, redis_url, namespace, "--json") as tail:
        assert tail.ready.startswith(f"following the quarantine of {namespace} from "), tail.ready
        ref = stale_settlement(cli_settler, "order-after")
        entry = json.loads(tail.out.get(timeout=30))
        assert entry["ref"] == ref
        assert entry["operation_id"] == "order-after"
        assert entry["kind"] == "stale_generation"
        assert entry["payload"]["json"] == {"charge_id": "ch_late"}
    assert tail.out.empty()  # the entry written before it started was not printed


def test_tail_table_form_and_filters(
    settle_bin: Path, cli_settler: Settler, redis_url: str, namespace: str
) -> None:
    with _tail(settle_bin, redis_url, namespace, "--operation", "order-b") as tail:
        stale_settlement(cli_settler, "order-a")  # another operation: filtered out
        ref = stale_settlement(cli_settler, "order-b")
        line = tail.out.get(timeout=30)
        assert ref in line, line
        assert "stale_generation" in line
        assert "op=order-b" in line
    assert tail.out.empty(), list(tail.out.queue)


def test_tail_follows_one_kind_in_json(
    settle_bin: Path, cli_settler: Settler, redis_url: str, namespace: str
) -> None:
    """``--kind`` reaches the follower (its filters are checked first, then followed):
    an entry of another kind written meanwhile is not printed."""
    kind = ("--kind", "unknown_operation")
    with _tail(settle_bin, redis_url, namespace, *kind, "--json") as tail:
        assert tail.ready.startswith(f"following the quarantine of {namespace} from "), tail.ready
        stale_settlement(cli_settler, "order-stale")  # another kind: filtered out
        ref = unknown(cli_settler, "order-unknown")
        entry = json.loads(tail.out.get(timeout=30))
        assert (entry["ref"], entry["kind"]) == (ref, "unknown_operation")
    assert tail.out.empty(), list(tail.out.queue)


def test_resolve_keeps_the_evidence(cli_settler: Settler, redis_url: str, namespace: str) -> None:
    ref = stale_settlement(cli_settler, "order-9")
    args = ("--redis-url", redis_url, "--namespace", namespace)
    before = settle_json("quarantine", "show", ref, *args)
    assert before["resolution"] is None

    resolved = settle_json("quarantine", "resolve", ref, "--note", "refunded ch_late", *args)
    assert resolved["resolution"]["note"] == "refunded ch_late"
    after = settle_json("quarantine", "show", ref, *args)
    assert after == resolved
    # everything but the resolution is unchanged: the evidence stays
    assert {k: v for k, v in after.items() if k != "resolution"} == {
        k: v for k, v in before.items() if k != "resolution"
    }
    # still listed, no longer unresolved; stats count it as resolved
    assert [e["ref"] for e in settle_json("quarantine", "ls", *args)] == [ref]
    assert settle_json("quarantine", "ls", "--unresolved", *args) == []
    kinds = settle_json("stats", *args)["quarantine"]["by_kind"]
    assert kinds["stale_generation"] == {"unresolved": 0, "resolved": 1}
    # the first note stands
    again = settle_json("quarantine", "resolve", ref, "--note", "second thoughts", *args)
    assert again["resolution"]["note"] == "refunded ch_late"
    # table form
    table = settle("quarantine", "resolve", ref, "--note", "x", *args)
    assert table.returncode == 0, table.stderr
    assert "refunded ch_late" in table.stdout


def test_resolving_again_with_another_note_says_the_first_note_stands(
    cli_settler: Settler, redis_url: str, namespace: str
) -> None:
    # First-wins: a second resolve with another note wrote nothing, and says so on stderr
    # (it used to say nothing); stdout is still the entry as it is, the exit status 0. The
    # same note again is this call's own (or a repeat after a lost reply): nothing to say.
    ref = stale_settlement(cli_settler, "order-11")
    args = ("--redis-url", redis_url, "--namespace", namespace)
    first = settle("quarantine", "resolve", ref, "--note", "refunded ch_late", "--json", *args)
    assert first.returncode == 0, first.stderr
    assert first.stderr == ""
    stored = cli_settler.quarantine.get(ref).resolution
    assert stored is not None
    at = stored.at.isoformat(timespec="milliseconds")
    for extra in (("--json",), ()):
        again = settle("quarantine", "resolve", ref, "--note", "a second look", *extra, *args)
        assert again.returncode == 0, again.stderr
        assert again.stderr == (
            f"settle: {ref} was already resolved at {at}; the first note stands and this "
            "note was not recorded\n"
        )
    same = settle("quarantine", "resolve", ref, "--note", "refunded ch_late", *args)
    assert (same.returncode, same.stderr) == (0, "")
    assert cli_settler.quarantine.get(ref).resolution == stored
    assert json.loads(first.stdout) == settle_json("quarantine", "show", ref, *args)


def test_resolve_needs_a_note_and_an_existing_entry(
    cli_settler: Settler, redis_url: str, namespace: str
) -> None:
    ref = stale_settlement(cli_settler, "order-10")
    args = ("--redis-url", redis_url, "--namespace", namespace)
    no_note = settle("quarantine", "resolve", ref, *args)
    assert no_note.returncode == 2
    assert "Missing option '--note'" in no_note.stderr
    missing = settle("quarantine", "resolve", "0/1-0", "--note", "n", *args)
    assert missing.returncode == 1
    assert missing.stderr.strip() == "settle: no quarantine entry '0/1-0' in this namespace"
    assert settle_json("quarantine", "show", ref, *args)["resolution"] is None


#: ``settle quarantine tail`` run in an interpreter whose main thread spends nearly all its
#: time in a finalizer written in Python, as when the cyclic garbage of a closed client's
#: connection pool is collected: a Ctrl-C arriving then is printed as "Exception ignored"
#: and lost (Python's rule for exceptions in ``__del__``). Each poll's sleep makes such
#: garbage and collects it.
_SWALLOWING_TAIL = """
import gc, sys, time
real_sleep = time.sleep
class Litter:
    def __del__(self):
        real_sleep(1.0)
def sleep(seconds):
    litter = Litter()
    litter.me = litter
    del litter
    gc.collect()
    real_sleep(seconds)
time.sleep = sleep
from settle.cli import main
sys.argv = ["settle", "quarantine", "tail", "--interval", "0.05"]
main()
"""


def test_tail_stops_on_a_ctrl_c_a_finalizer_swallowed(
    cli_settler: Settler, redis_url: str, namespace: str
) -> None:
    """A Ctrl-C that lands in a finalizer still ends the tail (exit 0): in CI it landed in
    redis-py's ``ConnectionPool.__del__``, and the tail followed on until it was killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SWALLOWING_TAIL],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(SETTLE_REDIS_URL=redis_url, SETTLE_NAMESPACE=namespace),
    )
    try:
        assert proc.stderr is not None
        assert "following" in proc.stderr.readline()
        time.sleep(1.5)  # into a poll's finalizer
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("the tail went on after a Ctrl-C") from None
    finally:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert code == 0
