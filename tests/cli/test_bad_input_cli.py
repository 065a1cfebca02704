"""Bad values the CLI's own option types let through get settle's usage error (exit 2, one
line), not a traceback."""

from __future__ import annotations

from settle import Settler
from tests.cli.conftest import settle


def test_quarantine_tail_with_a_nan_interval_exits_2(
    settler: Settler, redis_url: str, namespace: str
) -> None:
    """click's FloatRange lets NaN through (every comparison with it is False); the follower
    then died on time.sleep(nan) with a ValueError traceback once idle."""
    settler.check()  # the namespace exists
    connection = ("--redis-url", redis_url, "--namespace", namespace, "--shards", "4")
    done = settle("quarantine", "tail", "--interval", "nan", *connection)
    assert done.returncode == 2, done.stderr
    assert "poll_interval" in done.stderr
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
        assert "note must" in done.stderr
        assert "no quarantine entry" not in done.stderr
