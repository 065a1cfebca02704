"""Bad values the CLI's own option types let through get settle's usage error (exit 2, one
line), not a traceback."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from settle import Settler
from tests.cli.conftest import SETTLE, cli_env, settle
from tests.cli.helpers import stale_settlement


def test_quarantine_tail_with_a_nan_interval_exits_2(
    settler: Settler, redis_url: str, namespace: str
) -> None:
    """click's FloatRange lets NaN through (every comparison with it is False); the follower
    then died on time.sleep(nan) with a ValueError traceback once idle, and later the
    library refused it in its own words and range (poll_interval, 0 to 3600): click now
    refuses it as it refuses any value outside the option's range."""
    settler.check()  # the namespace exists
    connection = ("--redis-url", redis_url, "--namespace", namespace, "--shards", "4")
    done = settle("quarantine", "tail", "--interval", "nan", *connection)
    assert done.returncode == 2, done.stderr
    assert "Invalid value for '--interval': nan is not in the range 0.05<=x<=60." in done.stderr
    assert "Traceback" not in done.stderr


def test_quarantine_resolve_with_a_bad_note_exits_2_for_an_id_with_no_entry(
    settler: Settler, redis_url: str, namespace: str
) -> None:
    """The note was checked after the entry was read: an empty note for an id with no entry
    said 'no quarantine entry' (exit 1), a note with a line break likewise."""
    settler.check()  # the namespace exists
    connection = ("--redis-url", redis_url, "--namespace", namespace, "--shards", "4")
    for note in ("", "two\nlines"):
        done = settle("quarantine", "resolve", "0/1-0", "--note", note, *connection)
        assert done.returncode == 2, done.stderr
        assert "bad --note: must" in done.stderr
        assert "no quarantine entry" not in done.stderr


@pytest.mark.parametrize(
    ("args", "option", "library_word"),
    [
        (("quarantine", "trim", "--before", "0s"), "--before", "older_than"),
        (("quarantine", "trim", "--resolved", "--before", "40000d"), "--before", "older_than"),
        (
            ("quarantine", "trim", "--before", "40000d", "--include-unresolved"),
            "--before",
            "older_than",
        ),
        (("quarantine", "resolve", "0/1-0", "--note", ""), "--note", "note must"),
        (("quarantine", "ls", "--operation", ""), "--operation", "operation id"),
        (("quarantine", "ls", "--operation", "a" * 257), "--operation", "operation id"),
        (("quarantine", "export", "--operation", "a\x1bb"), "--operation", "operation id"),
        (("quarantine", "tail", "--operation", "a\nb"), "--operation", "operation id"),
    ],
)
def test_a_value_the_library_refuses_is_said_of_the_option_the_user_typed(
    cli_settler: Settler,
    redis_url: str,
    namespace: str,
    args: tuple[str, ...],
    option: str,
    library_word: str,
) -> None:
    """``trim --before 0s`` said "older_than must be more than 0 seconds and at most 100
    years": the library's argument, which the user never typed. Every option whose value
    the library checks is named in the refusal (exit 2), and nothing is changed."""
    kept = stale_settlement(cli_settler, "order-resolved")
    cli_settler.quarantine.resolve(kept, note="refunded")
    connection = ("--redis-url", redis_url, "--namespace", namespace)
    done = settle(*args, *connection, timeout=30)
    assert done.returncode == 2, done.stderr
    assert f"settle: bad {option}: must " in done.stderr
    assert library_word not in done.stderr
    assert "Traceback" not in done.stderr
    assert [e.ref for e in cli_settler.quarantine.list()] == [kept]


def test_export_refused_for_a_bad_filter_leaves_the_output_file_as_it_was(
    cli_settler: Settler, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """``export --operation '' -o yesterday.jsonl`` opened (emptied) the file, then was
    refused: bad input changed the user's earlier export. The filters are checked first."""
    stale_settlement(cli_settler, "order-1")
    connection = ("--redis-url", redis_url, "--namespace", namespace)
    earlier = tmp_path / "yesterday.jsonl"
    earlier.write_text('{"kept": true}\n')
    done = settle("quarantine", "export", "--operation", "", "-o", str(earlier), *connection)
    assert done.returncode == 2, done.stderr
    assert earlier.read_text() == '{"kept": true}\n'

    done = settle("quarantine", "export", "--operation", "order-1", "-o", str(earlier), *connection)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["operation_id"] for line in earlier.read_text().splitlines()] == [
        "order-1"
    ]


@pytest.mark.parametrize("operation", ["", "a\nb", "a" * 257])
def test_tail_refused_for_a_bad_filter_prints_nothing_before_the_refusal(
    cli_settler: Settler, redis_url: str, namespace: str, operation: str
) -> None:
    """``tail --operation ''`` printed "following the quarantine of ... (Ctrl-C to stop)",
    then was refused: the follower checks its filters at its first poll, after the line. A
    refused filter is said alone (exit 2), and nothing is printed before it."""
    connection = ("--redis-url", redis_url, "--namespace", namespace)
    done = settle("quarantine", "tail", "--operation", operation, *connection, timeout=30)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "following" not in done.stderr
    assert done.stderr.startswith("settle: bad --operation: must "), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_an_export_that_cannot_be_written_says_so_in_one_line(
    settler: Settler, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """An --output in a missing directory, and a full disk, ended the export in a traceback
    (FileNotFoundError, OSError ENOSPC): on a full disk one might not read it as an export
    that is not whole, and trim what it left out."""
    stale_settlement(settler, "charge:full-disk")
    connection = ("--redis-url", redis_url, "--namespace", namespace, "--shards", "4")
    missing = tmp_path / "no-such-dir" / "q.jsonl"
    done = settle("quarantine", "export", "--output", str(missing), *connection)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == f"settle: cannot write --output {missing}: No such file or directory\n"
    if not Path("/dev/full").exists():
        return
    done = settle("quarantine", "export", "--output", "/dev/full", *connection)
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        "settle: the export to /dev/full is incomplete: a write failed (No space left on "
        "device); export again before trimming anything\n"
    )
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [str(SETTLE), "quarantine", "export", *connection],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
            check=False,
        )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("settle: the export to stdout is incomplete: a write failed")
