"""Stored bytes that are not UTF-8 text (a result or a late response returned as ``bytes``)
are shown exactly in tables (SPEC 8: literal text, control characters visible): each such
byte as ``\\xNN``, as control characters are shown, never as U+FFFD, which made
``b"\\xff"`` and ``b"\\xfe"`` (and the text ``\\ufffd``) look the same. ``--json`` has the
bytes exact (base64), as before."""

from __future__ import annotations

import base64
import time

from settle import Reserved, Settler
from tests.cli.conftest import settle, settle_json

RESULT = b"ok \xff\xfe end"
LATE = b"late \x80\\xff \xc3\x28 \xe2\x82 \x1b caf\xc3\xa9 \xed\xa0\x80"
#: what a table shows: the bytes escaped, the backslash doubled, the valid é kept
SHOWN_RESULT = "ok \\xff\\xfe end"
SHOWN_LATE = "late \\x80\\\\xff \\xc3( \\xe2\\x82 \\x1b café \\xed\\xa0\\x80"


def _late_bytes(settler: Settler, operation_id: str) -> str:
    first = settler.reserve(operation_id, {"n": 1}, principal="p", lease=0.05)
    assert isinstance(first, Reserved)
    time.sleep(0.1)
    second = settler.reserve(operation_id, {"n": 1}, principal="p", lease=5)
    assert isinstance(second, Reserved)
    settler.complete(second.reservation, RESULT)
    done = settler.complete(first.reservation, LATE)
    assert done.quarantine_id is not None
    return done.quarantine_id


def test_bytes_that_are_not_utf8_are_shown_exactly_in_tables(
    cli_settler: Settler, redis_url: str, namespace: str
) -> None:
    qid = _late_bytes(cli_settler, "charge:bin-1")
    args = ("--redis-url", redis_url, "--namespace", namespace)
    for command, shown in [
        (("inspect", "charge:bin-1"), SHOWN_RESULT),
        (("quarantine", "show", qid), SHOWN_LATE),
        (("quarantine", "resolve", qid, "--note", "seen"), SHOWN_LATE),
    ]:
        done = settle(*command, *args)
        assert done.returncode == 0, done.stderr
        # It showed "ok \ufffd\ufffd end": two bytes as one character that is neither.
        assert "\ufffd" not in done.stdout, command
        assert shown in done.stdout, command

    # --json keeps the bytes exact
    record = settle_json("inspect", "charge:bin-1", *args)["record"]
    assert base64.b64decode(record["result"], validate=True) == RESULT
    entry = settle_json("quarantine", "show", qid, *args)
    assert base64.b64decode(entry["payload"]["data"], validate=True) == LATE


def test_text_that_looks_like_an_escaped_byte_reads_one_way(
    cli_settler: Settler, redis_url: str, namespace: str
) -> None:
    """The character U+0085 (a C1 control, UTF-8 ``c2 85``) and the byte ``85`` (not UTF-8)
    are shown apart: ``\\u0085`` and ``\\x85``; U+FFFD stored as text stays itself."""
    stored = "\u0085".encode() + b" \x85 " + "\ufffd".encode()
    r = cli_settler.reserve("charge:bin-2", {"n": 1}, principal="p")
    assert isinstance(r, Reserved)
    cli_settler.complete(r.reservation, stored)
    done = settle("inspect", "charge:bin-2", "--redis-url", redis_url, "--namespace", namespace)
    assert done.returncode == 0, done.stderr
    assert "\\u0085 \\x85 \ufffd" in done.stdout


def test_a_long_value_is_cut_after_its_first_120_characters_not_bytes(
    cli_settler: Settler, redis_url: str, namespace: str
) -> None:
    """The preview of a long stored value is its first 120 characters, a byte that is not
    UTF-8 counting as one: cut at 120 bytes, two-byte characters showed half as many and a
    character cut in two looked like two stored bytes that are not UTF-8 (``\\xc3``)."""
    stored = b"\xff" + ("é" * 200).encode()
    r = cli_settler.reserve("charge:bin-3", {"n": 1}, principal="p")
    assert isinstance(r, Reserved)
    cli_settler.complete(r.reservation, stored)
    done = settle("inspect", "charge:bin-3", "--redis-url", redis_url, "--namespace", namespace)
    assert done.returncode == 0, done.stderr
    shown = "\\xff" + "é" * 119 + "…"
    assert shown in done.stdout
    assert "é" * 120 not in done.stdout
