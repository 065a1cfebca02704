"""What an operator sees is what was stored (issue 16): stored values are literal text with
control characters made visible in every command, ``stats`` and ``export`` count exactly and
stream without a cap, ``--since`` counts back from the server's clock, and odd ids or corrupt
metadata get one clear line and the documented exit code. All through the console script."""

from __future__ import annotations

import base64
import json
import os
import pty
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import redis

from settle import Reserved, Settler
from settle._core.keys import Keys
from settle.cli._params import SINCE, Ago
from settle.cli.quarantine import _start
from settle.demo.server import server_now
from tests.cli.conftest import SETTLE, cli_env, settle, settle_json
from tests.cli.helpers import stale_settlement

HOSTILE_RESULT = b"[/terms] [link=https://evil.example/pay]ch_B[/link] \x1b]0;pwned\x07\x1b[2J"
RLO = "\u202e"


def _args(url: str, namespace: str) -> tuple[str, ...]:
    return ("--redis-url", url, "--namespace", namespace)


def _late_bytes(settler: Settler, operation_id: str, late: bytes, principal: str) -> str:
    """A late response of a superseded attempt, stored as evidence: its quarantine id."""
    first = settler.reserve(operation_id, {"n": 1}, principal=principal, lease=0.05)
    assert isinstance(first, Reserved)
    time.sleep(0.1)
    second = settler.reserve(operation_id, {"n": 1}, principal=principal, lease=5)
    assert isinstance(second, Reserved)
    settler.complete(second.reservation, HOSTILE_RESULT)
    done = settler.complete(first.reservation, late)
    assert done.quarantine_id is not None
    return done.quarantine_id


def _assert_literal(out: str) -> None:
    assert "\x1b" not in out
    assert "\x07" not in out
    assert RLO not in out
    assert "[/terms]" in out
    assert "[link=https://evil.example/pay]ch_B[/link]" in out
    assert "\\x1b]0;pwned\\x07\\x1b[2J" in out


def test_inspect_and_quarantine_show_stored_values_as_literal_text(
    cli_settler: Settler, redis_url: str, namespace: str
) -> None:
    op = "order[/x]:[bold]1"
    principal = "[link=https://evil.example]admin[/link]"
    qid = _late_bytes(cli_settler, op, HOSTILE_RESULT + RLO.encode(), principal)
    cli_settler.quarantine.resolve(qid, note="[red]fine[/red] [/terms]")
    args = _args(redis_url, namespace)

    shown = settle("inspect", op, *args)
    assert shown.returncode == 0, shown.stderr
    _assert_literal(shown.stdout)
    assert principal in shown.stdout
    assert op in shown.stdout

    entry = settle("quarantine", "show", qid, *args)
    assert entry.returncode == 0, entry.stderr
    _assert_literal(entry.stdout)
    assert "\\u202e" in entry.stdout
    assert "[red]fine[/red] [/terms]" in entry.stdout

    listed = settle("quarantine", "ls", *args)
    assert listed.returncode == 0, listed.stderr
    assert op in listed.stdout

    # JSON output is JSON: control characters are escaped, the values are intact
    data = settle_json("quarantine", "show", qid, *args)
    assert data["operation_id"] == op
    assert data["presented"]["binding"] == principal


def test_a_stored_backslash_is_shown_doubled_so_it_never_reads_as_an_escape(
    cli_settler: Settler, redis_url: str, namespace: str
) -> None:
    """SPEC 8: control characters are shown as visible escapes, so a stored backslash must
    be shown doubled: a result holding the four characters ``\\x1b`` looked the same as one
    holding ESC, and an operation id (which may hold a backslash, never a control) looked
    like one with a control character in it."""
    op = "order\\x1b[2J:\\1"
    late = b"ESC \x1b, not ESC \\x1b"
    qid = _late_bytes(cli_settler, op, late, "p")
    cli_settler.quarantine.resolve(qid, note="refunded C:\\x07 \\")
    args = _args(redis_url, namespace)
    shown_op = "order\\\\x1b[2J:\\\\1"
    shown_late = "ESC \\x1b, not ESC \\\\x1b"

    for command in (("inspect", op), ("quarantine", "show", qid), ("quarantine", "ls")):
        shown = settle(*command, *args)
        assert shown.returncode == 0, shown.stderr
        assert shown_op in shown.stdout, command
    entry = settle("quarantine", "show", qid, *args).stdout
    assert shown_late in entry
    assert "refunded C:\\\\x07 \\\\" in entry

    _completed(cli_settler, "stored-result", late)
    result = settle("inspect", "stored-result", *args)
    assert result.returncode == 0, result.stderr
    assert shown_late in result.stdout
    assert "\x1b" not in result.stdout

    # JSON output is JSON: the values are intact
    data = settle_json("quarantine", "show", qid, *args)
    assert data["operation_id"] == op
    assert base64.b64decode(data["payload"]["data"]) == late

    # a message quotes the id with repr, which doubles the backslash once, not twice
    missing = settle("inspect", "nope\\x1b", *args)
    assert missing.returncode == 1
    assert "no operation 'nope\\\\x1b' in namespace" in missing.stderr


#: Stored bytes Python's json module reads but no JSON reader takes back (NaN, Infinity,
#: a number too large for a float), cannot write out again (nesting 3000 deep, or one past
#: the limit of 200), or reads otherwise than a strict reader (UTF-8 JSON, RFC 8259 /
#: I-JSON) would: UTF-16 and UTF-32 text, a surrogate encoded as UTF-8 (not UTF-8), a
#: UTF-8 byte order mark, a repeated key (Python keeps the last value, the first vanishing
#: from the evidence), an integer beyond a double's range (docs/cli.md: null, as 1e400).
NOT_STRICT_JSON = {
    "deep": b"[" * 3000,
    "201 deep": b"[" * 201 + b"]" * 201,
    "nan": b'{"x": NaN}',
    "-inf": b'{"x": -Infinity}',
    "1e400": b'{"x": 1e400}',
    "utf16": '{"a": 1}'.encode("utf-16-le"),
    "utf32": "[1]".encode("utf-32-be"),
    "surrogate": b'"\xed\xa0\x80"',
    "bom": b'\xef\xbb\xbf{"a": 1}',
    "duplicate": b'{"amount": 1, "amount": 1000}',
    "bigint": b"1" + b"0" * 400,
}


def _strict(text: str) -> object:
    """``text`` parsed as JSON that jq or a browser would take."""

    def refuse(name: str) -> object:
        raise AssertionError(f"{name} in JSON output")

    return json.loads(text, parse_constant=refuse)


def _completed(settler: Settler, operation_id: str, result: bytes) -> None:
    r = settler.reserve(operation_id, {"n": 1}, principal="p", lease=5)
    assert isinstance(r, Reserved)
    settler.complete(r.reservation, result)


@pytest.mark.parametrize("stored", NOT_STRICT_JSON.values(), ids=NOT_STRICT_JSON.keys())
def test_stored_bytes_that_are_not_strict_json_are_shown_as_text_in_json_output(
    cli_settler: Settler, redis_url: str, namespace: str, stored: bytes
) -> None:
    # One such result or payload used to end --json output in a RecursionError traceback,
    # or put NaN / Infinity in it, which jq and JSON.parse refuse.
    args = _args(redis_url, namespace)
    _completed(cli_settler, "op-result", stored)
    qid = _late_bytes(cli_settler, "op-late", stored, "p")
    _late_bytes(cli_settler, "op-fine", b'{"fine": true}', "p")

    done = settle("inspect", "op-result", *args, "--json")
    assert done.returncode == 0, done.stderr[-300:]
    record = _strict(done.stdout)["record"]  # type: ignore[index]
    assert record["result_json"] is None
    # shown as the bytes it is, in standard base64 (pydantic's is the URL-safe alphabet)
    assert base64.b64decode(record["result"], validate=True) == stored

    for cmd in (("quarantine", "ls", "--json"), ("quarantine", "show", qid, "--json")):
        done = settle(*cmd, *args)
        assert done.returncode == 0, (cmd, done.stderr[-300:])
        _strict(done.stdout)
    export = settle("quarantine", "export", *args)
    assert export.returncode == 0, export.stderr[-300:]
    lines = [_strict(line) for line in export.stdout.splitlines()]
    payloads = {line["operation_id"]: line["payload"] for line in lines}  # type: ignore[index]
    assert {op: p["json"] for op, p in payloads.items()} == {
        "op-late": None,
        "op-fine": {"fine": True},
    }
    assert base64.b64decode(payloads["op-late"]["data"], validate=True) == stored


@pytest.mark.parametrize(
    "stored",
    [b"[" * 200 + b"]" * 200, b"-" + b"9" * 308, '{"caf\u00e9": "\u00e9"}'.encode()],
    ids=["200 deep", "308 digits", "utf8"],
)
def test_strict_json_at_the_limits_is_shown_as_json(
    cli_settler: Settler, redis_url: str, namespace: str, stored: bytes
) -> None:
    """The other side of each limit: nesting exactly 200 deep, an integer a double holds,
    UTF-8 beyond ASCII."""
    _completed(cli_settler, "op-result", stored)
    done = settle("inspect", "op-result", *_args(redis_url, namespace), "--json")
    assert done.returncode == 0, done.stderr[-300:]
    assert _strict(done.stdout)["record"]["result_json"] == json.loads(stored)  # type: ignore[index]


def test_unknown_operation_with_controls_is_one_visible_line(
    redis_url: str, namespace: str, cli_settler: Settler
) -> None:
    del cli_settler
    done = settle("inspect", "nope\x1b[2J", *_args(redis_url, namespace))
    assert done.returncode == 2
    assert "\x1b" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_stats_counts_records_exactly_when_an_id_contains_the_record_marker(
    cli_settler: Settler, redis_url: str, namespace: str
) -> None:
    for op in ("y", "x}:op:y", "z}:op:"):
        r = cli_settler.reserve(op, {"a": 1}, principal="p")
        assert isinstance(r, Reserved)
        cli_settler.complete(r.reservation, {"ok": True})
    report = settle_json("stats", *_args(redis_url, namespace))
    assert report["records"]["total"] == 3
    assert report["records"]["by_state"]["completed"] == 3


def test_since_counts_back_from_the_server_clock(
    cli_settler: Settler, redis_url: str, namespace: str
) -> None:
    ago = SINCE.convert("10m", None, None)
    assert ago == Ago(timedelta(minutes=10))  # not resolved on the operator's clock
    before = server_now(cli_settler)
    start = _start(cli_settler, ago)
    assert start is not None
    assert (
        before - timedelta(minutes=10) <= start <= server_now(cli_settler) - timedelta(minutes=10)
    )
    qid = stale_settlement(cli_settler, "order-since")
    args = _args(redis_url, namespace)
    listed = settle_json("quarantine", "ls", "--since", "1h", *args)
    assert [e["ref"] for e in listed] == [qid]
    exported = settle("quarantine", "export", "--since", "1h", *args)
    assert [json.loads(line)["ref"] for line in exported.stdout.splitlines()] == [qid]


def test_quarantine_id_above_2_64_is_a_usage_error(
    cli_settler: Settler, redis_url: str, namespace: str
) -> None:
    del cli_settler
    for bad in ("0/18446744073709551616-0", "1-18446744073709551616", "99999999999999999999-0"):
        done = settle("quarantine", "show", bad, *_args(redis_url, namespace))
        assert done.returncode == 2, done.stderr
        assert "is not a quarantine id" in done.stderr
        assert "cannot reach" not in done.stderr
    done = settle("quarantine", "show", "0/18446744073709551615-0", *_args(redis_url, namespace))
    assert done.returncode == 1  # the largest id is well formed, and not found


def test_a_quarantine_entry_settle_cannot_decode_is_one_clear_line(
    cli_settler: Settler, redis_url: str, namespace: str, redis_client: redis.Redis
) -> None:
    # A foreign entry (or one of a newer settle's kinds) used to print a KeyError traceback.
    qid = _late_bytes(cli_settler, "op-late", b"{}", "p")
    shard = int(qid.split("/")[0])
    stream = Keys(namespace, cli_settler.config.shards).quarantine(shard)
    foreign = f"{shard}/{redis_client.xadd(stream, {'garbage': '1'}).decode()}"
    args = _args(redis_url, namespace)
    for cmd in (("quarantine", "ls"), ("quarantine", "export"), ("stats",)):
        done = settle(*cmd, *args)
        assert done.returncode == 1, (cmd, done.stderr)
        assert done.stderr.startswith(f"settle: quarantine entry {foreign} cannot be decoded")
        assert len(done.stderr.splitlines()) == 1, done.stderr
    # What filters it out (another operation) still reads.
    assert settle("quarantine", "show", qid, *args).returncode == 0
    assert settle("inspect", "op-late", *args).returncode == 0


def test_corrupt_namespace_metadata_is_one_clear_line(
    cli_settler: Settler, redis_url: str, namespace: str, redis_client: redis.Redis
) -> None:
    meta = Keys(namespace, 1).meta
    args = _args(redis_url, namespace)
    redis_client.hset(meta, "shards", "abc")
    done = settle("stats", *args)
    assert done.returncode == 3
    assert done.stderr.startswith(f"settle: the metadata of namespace {namespace!r} is corrupt")
    assert "'abc'" in done.stderr
    assert "Traceback" not in done.stderr

    redis_client.hset(meta, "shards", "99999")  # a count no --shards could give
    done = settle("inspect", "x", *args)
    assert done.returncode == 3
    assert "is corrupt" in done.stderr
    assert "--shards" not in done.stderr

    redis_client.delete(meta)
    redis_client.set(meta, "not a hash")
    done = settle("quarantine", "ls", *args)
    assert done.returncode == 3
    assert "is not a hash" in done.stderr
    assert "cannot reach" not in done.stderr
    del cli_settler


def _bulk(redis_url: str, namespace: str, redis_client: redis.Redis, n: int) -> None:
    """A 2-shard namespace whose quarantine holds ``n`` + 1 entries."""
    settler = Settler.from_url(redis_url, namespace=namespace, shards=2)
    settler.check()
    try:
        _copies(redis_client, settler, n)
    finally:
        settler.close()


def _copies(redis_client: redis.Redis, settler: Settler, n: int) -> None:
    """``n`` more entries in the quarantine: copies of a real one, written in bulk."""
    qid = stale_settlement(settler, "order-bulk")
    shard, entry_id = qid.split("/")
    stream = Keys(settler.config.namespace, settler.config.shards).quarantine(int(shard))
    [(_, fields)] = redis_client.xrange(stream, entry_id, entry_id)
    pipe = redis_client.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(stream, fields)
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()


def _stream_id(text: str) -> tuple[int, int]:
    ms, seq = text.split("-")
    return int(ms), int(seq)


def test_export_and_stats_stream_past_100k_in_bounded_memory(
    redis_url: str, namespace: str, redis_client: redis.Redis
) -> None:
    _bulk(redis_url, namespace, redis_client, 100_000)
    args = _args(redis_url, namespace)
    # A fresh parent whose only child is the export: its children's peak is the export's.
    measure = (
        "import resource, subprocess, sys; "
        "done = subprocess.run(sys.argv[1:], stdout=sys.stdout, stderr=sys.stderr); "
        "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss; "
        "sys.stderr.write(f'peak_kib={peak}'); sys.exit(done.returncode)"
    )
    export = subprocess.run(
        [sys.executable, "-c", measure, str(SETTLE), "quarantine", "export", *args],
        capture_output=True,
        env=cli_env(),
        check=False,
    )
    stderr = export.stderr.decode()
    assert export.returncode == 0, stderr
    lines = export.stdout.splitlines()
    assert len(lines) == 100_001  # no silent cap
    peak_kib = int(stderr.removeprefix("peak_kib="))  # and no progress without a terminal
    assert peak_kib < 150 * 1024, f"export peaked at {peak_kib // 1024} MiB"
    first, last = json.loads(lines[0]), json.loads(lines[-1])
    assert _stream_id(first["id"]) < _stream_id(last["id"])  # oldest first
    head = subprocess.run(  # a reader that stops early ends the export quietly
        f"{SETTLE} quarantine export {' '.join(args)} | head -1",
        shell=True,
        capture_output=True,
        text=True,
        env=cli_env(),
        check=False,
    )
    assert len(head.stdout.splitlines()) == 1
    assert head.stderr == ""
    limited = settle("quarantine", "export", "--limit", "3", *args)
    assert len(limited.stdout.splitlines()) == 3
    report = settle_json("stats", *args)
    assert report["quarantine"]["total"] == 100_001
    assert report["quarantine"]["unresolved"] == 100_001


def _export_on_a_terminal(
    redis_url: str, namespace: str, *flags: str
) -> tuple[subprocess.CompletedProcess[bytes], bytes]:
    """``quarantine export`` with its stderr on a pseudo-terminal: the run, and what the
    terminal was shown."""
    master, slave = pty.openpty()
    try:
        done = subprocess.run(
            [str(SETTLE), "quarantine", "export", *flags, *_args(redis_url, namespace)],
            stdout=subprocess.PIPE,
            stderr=slave,
            env=cli_env(),
            check=False,
            timeout=120,
        )
        os.close(slave)
        slave = -1
        seen = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
        if slave != -1:
            os.close(slave)
    return done, seen


def test_export_shows_progress_on_a_terminal_only(
    redis_url: str, namespace: str, redis_client: redis.Redis
) -> None:
    _bulk(redis_url, namespace, redis_client, 2500)
    done, seen = _export_on_a_terminal(redis_url, namespace)
    assert done.returncode == 0
    assert len(done.stdout.splitlines()) == 2501
    assert b"exported 2000 entries" in seen
    assert b"exported 2501 entries" in seen
    # Issue 16: the count is off with --json (a machine reads it), terminal or not; it was
    # shown all the same.
    done, seen = _export_on_a_terminal(redis_url, namespace, "--json")
    assert done.returncode == 0
    assert len(done.stdout.splitlines()) == 2501
    assert seen == b""
