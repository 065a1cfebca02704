"""``settle quarantine ls | show | tail | resolve | export | trim`` (SPEC 3)."""

from __future__ import annotations

import contextlib
import itertools
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import IO, Any

import click
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from settle._core.codec import UndecodableEntry
from settle._core.engine import MAX_LISTING
from settle._runtime.urls import redacted
from settle._sync.settler import Settler
from settle.cli._context import (
    EXIT_FAILED,
    EXIT_USAGE,
    Connection,
    connection_options,
    drop_stdout,
    fail,
    forget_interrupt,
    json_option,
    name_undecodable,
    open_settler,
    options_named,
    remember_interrupt,
    say_undecodable,
)
from settle.cli._params import DURATION, KIND, SINCE, Ago, FiniteRange, since_on
from settle.cli._render import (
    console,
    entries_table,
    entry_json,
    entry_line,
    entry_table,
    json_line,
    listed_json,
    print_json,
    print_table,
    visible_message,
)
from settle.demo.server import server_now
from settle.errors import BackendError
from settle.models import QuarantineEntry

__all__ = ["quarantine"]


@click.group("quarantine")
def quarantine() -> None:
    """Rejected responses kept as evidence: list, show, follow, resolve, export, trim."""


#: What the library calls the values of the filter options (``_filters``).
_FILTERS = {"operation id": "--operation"}


def _filters(fn: Any) -> Any:
    fn = click.option("--kind", type=KIND, default=None, help="Only entries of this kind.")(fn)
    fn = click.option(
        "--operation", "operation_id", default=None, help="Only entries of this operation id."
    )(fn)
    return click.option("--unresolved", is_flag=True, help="Only entries not resolved yet.")(fn)


def _instant(name: str, what: str) -> Callable[[Any], Any]:
    """The option ``name`` (``--since``, ``--until``): an instant, ISO 8601 or a duration
    ago on the server's clock (:func:`_start` resolves it)."""
    option: Callable[[Any], Any] = click.option(
        name,
        type=SINCE,
        default=None,
        help=f"Only entries {what}: ISO 8601 (naive = UTC) or a duration ago "
        "(90s, 10m, 2h, 1d) on the server's clock.",
    )
    return option


_since = _instant("--since", "from this time on")
_until = _instant("--until", "up to this time (included)")


def _start(settler: Settler, since: datetime | Ago | None) -> datetime | None:
    """``--since`` (or ``--until``) as an instant: a duration ago counts back from the
    server's clock, the clock stream ids and record times are written with (as ``tail``
    starts from it)."""
    if isinstance(since, Ago):
        return since_on(since, server_now(settler))
    return since_on(since, datetime.now(UTC))  # (the clock is read for a duration only)


@quarantine.command("ls")
@_filters
@_since
@_until
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_LISTING),
    default=50,
    show_default=True,
    help="At most this many entries in all (the newest), across shards.",
)
@connection_options
@json_option
def ls(
    conn: Connection,
    kind: str | None,
    operation_id: str | None,
    unresolved: bool,
    since: datetime | Ago | None,
    until: datetime | Ago | None,
    limit: int,
    as_json: bool,
) -> None:
    """Quarantine entries, newest first (at most --limit in all)."""
    with open_settler(conn, reads=True) as settler, options_named(_FILTERS):
        planned = settler.quarantine._listing(
            kind=kind,
            operation_id=operation_id,
            since=_start(settler, since),
            until=_start(settler, until),
            unresolved=unresolved,
            limit=limit,
        )
        # Marking: one entry another version or program wrote ended the listing (exit 1)
        # and none of the entries settle can read was shown.
        listed = settler.quarantine._listed(planned.marking())
    entries = [e for e in listed if not isinstance(e, UndecodableEntry)]
    if as_json:
        print_json([listed_json(e) for e in listed])
    else:
        out = console()
        if not listed:
            out.print("no matching quarantine entries")
        elif entries:
            title = f"quarantine of {conn.namespace} (newest first)"
            print_table(out, entries_table(entries, title))
    name_undecodable([e for e in listed if isinstance(e, UndecodableEntry)])


@quarantine.command("show")
@click.argument("entry_id", metavar="ID")
@connection_options
@json_option
def show(conn: Connection, entry_id: str, as_json: bool) -> None:
    """One entry by ID (shard/ms-seq as listed, or a bare ms-seq). Exit 1 if none."""
    with open_settler(conn, reads=True) as settler:
        entry = settler.quarantine.get(entry_id)
    if as_json:
        print_json(entry_json(entry))
    else:
        print_table(console(), entry_table(entry))


@quarantine.command("resolve")
@click.argument("entry_id", metavar="ID")
@click.option("--note", required=True, help="Why it is resolved (kept with the evidence).")
@connection_options
@json_option
def resolve(conn: Connection, entry_id: str, note: str, as_json: bool) -> None:
    """Mark entry ID resolved with a note. The evidence stays; the first note stands."""
    with open_settler(conn) as settler, options_named({"note": "--note"}):
        resolution = settler.quarantine.resolve(entry_id, note=note)
        entry = settler.quarantine.get(entry_id)
    if resolution.note != note:
        # First wins: another note was there (the same words are this call's own note, or
        # a repeat after a lost reply: either way the note on record is this one).
        click.echo(
            f"settle: {entry_id} was already resolved at "
            f"{resolution.at.isoformat(timespec='milliseconds')}; the first note stands and "
            "this note was not recorded",
            err=True,
        )
    if as_json:
        print_json(entry_json(entry))
    else:
        print_table(console(), entry_table(entry))


@quarantine.command("tail")
@_filters
@_since
@click.option(
    "--interval",
    type=FiniteRange(0.05, 60),
    default=0.5,
    show_default=True,
    help="Seconds between polls when idle.",
)
@connection_options
@json_option
def tail(
    conn: Connection,
    kind: str | None,
    operation_id: str | None,
    unresolved: bool,
    since: datetime | Ago | None,
    interval: float,
    as_json: bool,
) -> None:
    """Follow new entries live (from now, or --since) until Ctrl-C; one line each
    (a JSON object each with --json). Ctrl-C ends it with exit 0, or 1 when an entry
    could not be decoded (named on stderr as it was met, marked with --json)."""
    # Ctrl-C ends the tail. Its KeyboardInterrupt is lost when it lands in a finalizer
    # (Python prints "Exception ignored" and runs on: redis-py's ConnectionPool.__del__,
    # collecting a closed client's garbage), and the tail followed on until killed: the
    # flag it also sets stops the follow at its next poll. The group is told too: a lost
    # one while connecting to a silent Redis said "cannot reach Redis", exit 3.
    interrupted = threading.Event()

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        interrupted.set()
        remember_interrupt()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    with open_settler(conn, reads=True) as settler, options_named(_FILTERS):
        # Start at the server's clock (stream ids are server time), so that every entry
        # written after the "following" line is printed, whatever the local clock says.
        start = _start(settler, since) or server_now(settler)
        filters: dict[str, Any] = {
            "kind": kind,
            "operation_id": operation_id,
            "unresolved": unresolved,
            "since": start,
            "poll_interval": interval,
        }
        # The follower is made (its filters checked, no I/O) before the "following" line,
        # so a refused filter is said alone. Marking: an entry settle cannot decode ended
        # the tail (exit 1), and a live watcher saw none of the entries after it.
        follower = settler.quarantine._following(**filters)
        follow = settler.quarantine._followed(follower, interval, interrupted.is_set)
        marked = False
        click.echo(
            f"following the quarantine of {conn.namespace} from {start.isoformat()} "
            "(Ctrl-C to stop)",
            err=True,
        )
        try:
            while True:
                try:
                    for entry in follow:
                        if isinstance(entry, UndecodableEntry):
                            marked = True
                            say_undecodable(entry)
                        if as_json:
                            click.echo(json_line(listed_json(entry)))
                        elif not isinstance(entry, UndecodableEntry):
                            click.echo(entry_line(entry))
                        sys.stdout.flush()
                    break
                except BackendError as exc:
                    if conn.sentinel is None or exc.code:  # one server: exit 3, as ever
                        raise
                    _primary_again(conn, settler, exc, interval, interrupted.is_set)
                    follow = settler.quarantine._followed(follower, interval, interrupted.is_set)
        except KeyboardInterrupt:
            pass
        forget_interrupt()  # the tail's end: its exit code (0, or 1) stands
    if marked:
        sys.exit(EXIT_FAILED)


def _primary_again(
    conn: Connection,
    settler: Settler,
    lost: BackendError,
    interval: float,
    stopped: Callable[[], bool],
) -> None:
    """Behind Sentinel, the tail lost the primary (killed, a failover under way): said on
    stderr, then the server's clock is asked every ``interval`` (at least 0.5 s) until the
    primary the Sentinels name answers, said too; the follow goes on from where it was,
    every entry written meanwhile printed. Ctrl-C stops the wait as it stops the tail."""
    cause = lost.__cause__ or lost
    click.echo(
        visible_message(
            f"settle: lost the primary at {redacted(conn.url)} ({type(cause).__name__}: "
            f"{' '.join(str(cause).split())}); waiting for the Sentinels to name one "
            "(Ctrl-C to stop)"
        ),
        err=True,
    )
    while not stopped():
        time.sleep(max(interval, 0.5))
        try:
            server_now(settler)
        except (RedisConnectionError, RedisTimeoutError, OSError):  # not there yet
            continue
        click.echo(f"settle: following again on {redacted(conn.url)}", err=True)
        return
    raise KeyboardInterrupt


@quarantine.command("export")
@_filters
@_since
@_until
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    help="Write to this file instead of stdout.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after this many entries in all (the oldest ones); default: every entry.",
)
@click.option(
    "--progress/--no-progress",
    "show_progress",
    default=None,
    help="Count exported entries on stderr (default: on a terminal, unless --json).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Accepted like every read command's --json; the export is always JSON lines.",
)
@connection_options
def export(
    conn: Connection,
    kind: str | None,
    operation_id: str | None,
    unresolved: bool,
    since: datetime | Ago | None,
    until: datetime | Ago | None,
    output: Path | None,
    limit: int | None,
    show_progress: bool | None,
    as_json: bool,  # the lines are JSON either way (SPEC 8: --json on every read command)
) -> None:
    """Entries as JSON lines, oldest first (the same objects as ls --json), streamed a
    page at a time: memory stays bounded however many entries there are."""
    if show_progress is None:  # a terminal's reader, not a machine asking for --json
        show_progress = sys.stderr.isatty() and not as_json
    with open_settler(conn, reads=True) as settler, options_named(_FILTERS):
        walk = settler.quarantine._walk(
            kind=kind,
            operation_id=operation_id,
            since=_start(settler, since),
            until=_start(settler, until),
            unresolved=unresolved,
        )
        # Marking: an entry settle cannot decode ended the export there (exit 1), and the
        # entries after it were never written; now each is a marked line, named at the end.
        scan = settler.quarantine._scanned(walk.marking())
        # The filters are checked, and the first page read, before --output is opened: a
        # refused --operation or an unreachable Redis leaves the file as it was, where
        # opening it first emptied it.
        first = next(scan, None)
        entries = scan if first is None else itertools.chain([first], scan)
        marks: list[UndecodableEntry] = []
        if output is None:  # a reader that stops (| head) ends it quietly (settle.cli.main)
            _write(sys.stdout, entries, limit, show_progress, marks)
            name_undecodable(marks)
            return
        try:
            fh = output.open("w", encoding="utf-8")
        except OSError as exc:  # a missing directory, a read-only file system
            fail(f"cannot write --output {output}: {exc.strerror or exc}", EXIT_USAGE)
        with fh:
            count = _write(fh, entries, limit, show_progress, marks)
    click.echo(f"exported {count} entries to {output}", err=True)
    name_undecodable(marks)


@quarantine.command("trim")
@click.option("--resolved", is_flag=True, help="Delete resolved entries (with their notes).")
@click.option(
    "--before",
    "older_than",
    type=DURATION,
    default=None,
    help="Only entries older than this (90s, 10m, 2h, 30d), on the server clock.",
)
@click.option(
    "--include-unresolved",
    is_flag=True,
    help="Also delete unresolved evidence older than --before (export it first).",
)
@connection_options
@json_option
def trim(
    conn: Connection,
    resolved: bool,
    older_than: float | None,
    include_unresolved: bool,
    as_json: bool,
) -> None:
    """Delete quarantine entries explicitly: resolved ones (--resolved, optionally --before),
    and unresolved evidence only with --include-unresolved and --before."""
    if not resolved and older_than is None:
        raise click.UsageError("say what to trim: --resolved and/or --before DURATION")
    if include_unresolved and older_than is None:
        raise click.UsageError("--include-unresolved needs --before DURATION")
    with open_settler(conn) as settler, options_named({"older_than": "--before"}):
        done = settler.quarantine.trim(older_than=older_than, include_unresolved=include_unresolved)
    if as_json:
        print_json(done.model_dump())
        return
    click.echo(f"deleted {done.removed} entries ({done.unresolved} of them unresolved)")


_PROGRESS_EVERY = 1000


def _write(
    fh: IO[str],
    entries: Iterator[QuarantineEntry | UndecodableEntry],
    limit: int | None,
    show_progress: bool,
    marks: list[UndecodableEntry],
) -> int:
    """Write entries as JSON lines, at most ``limit``, each one settle cannot decode as a
    marked line (:func:`listed_json`) also appended to ``marks``; with ``show_progress``, a
    running count on stderr every thousand entries. Returns how many were written."""
    count = 0
    try:
        for entry in entries:
            if limit is not None and count >= limit:
                break
            if isinstance(entry, UndecodableEntry):
                marks.append(entry)
            fh.write(json_line(listed_json(entry)) + "\n")
            count += 1
            if show_progress and count % _PROGRESS_EVERY == 0:
                click.echo(f"\rexported {count} entries...", err=True, nl=False)
        fh.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:  # a full disk: the export is not whole, and must say so
        _discard(fh)
        where = "stdout" if fh is sys.stdout else fh.name
        fail(
            f"the export to {where} is incomplete: a write failed ({exc.strerror or exc}); "
            "export again before trimming anything",
            EXIT_FAILED,
        )
    if show_progress and count >= _PROGRESS_EVERY:
        click.echo(f"\rexported {count} entries   ", err=True)
    return count


def _discard(fh: IO[str]) -> None:
    """Drop what could not be written, so that closing the file (or the flush of stdout
    at exit) does not fail again over the message that says so."""
    if fh is sys.stdout:
        drop_stdout()
        return
    with contextlib.suppress(OSError):
        fh.close()
