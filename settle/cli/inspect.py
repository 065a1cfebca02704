"""``settle inspect OPERATION_ID``: the record, its attempt log and its quarantine entries."""

from __future__ import annotations

import click

from settle._core.codec import UndecodableEntry
from settle._core.engine import MAX_LISTING
from settle.cli._context import (
    EXIT_FAILED,
    Connection,
    connection_options,
    fail,
    json_option,
    name_undecodable,
    open_settler,
)
from settle.cli._render import (
    Whole,
    attempts_table,
    console,
    entries_table,
    listed_json,
    print_json,
    print_table,
    print_text,
    record_json,
    record_table,
)

__all__ = ["inspect"]


@click.command("inspect")
@click.argument("operation_id")
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_LISTING),
    default=100,
    show_default=True,
    help="At most this many quarantine entries (newest first).",
)
@connection_options
@json_option
def inspect(conn: Connection, operation_id: str, limit: int, as_json: bool) -> None:
    """The record of OPERATION_ID: tuple, state, generation, version, lease, timestamps,
    attempt log and quarantine entries. Exit 1 if there is no such operation."""
    with open_settler(conn, reads=True) as settler:
        record = settler.get(operation_id)
        attempts = settler.attempts(operation_id)
        # Marking: one entry of the operation settle cannot decode ended the command (exit
        # 1) with none of the record, its attempt log or its readable entries shown.
        planned = settler.quarantine._listing(operation_id=operation_id, limit=limit)
        listed = settler.quarantine._listed(planned.marking())
    entries = [e for e in listed if not isinstance(e, UndecodableEntry)]
    marks = [e for e in listed if isinstance(e, UndecodableEntry)]
    if record is None and not attempts and not listed:
        fail(f"no operation {operation_id!r} in namespace {conn.namespace!r}", EXIT_FAILED)
    if as_json:
        print_json(
            {
                "operation_id": operation_id,
                "namespace": conn.namespace,
                "record": record_json(record) if record else None,
                "attempts": [a.model_dump(mode="json") for a in attempts],
                "quarantine": [listed_json(e) for e in listed],
            }
        )
        name_undecodable(marks)
        return
    out = console()
    if record is None:
        print_text(
            out, ("no record of operation ", Whole(operation_id), " (expired or never reserved)")
        )
    else:
        print_table(out, record_table(record))
    print_table(out, attempts_table(attempts))
    if entries:
        print_table(out, entries_table(entries, ("quarantine entries of ", Whole(operation_id))))
    elif not marks:
        print_text(out, ("no quarantine entries for ", Whole(operation_id)))
    name_undecodable(marks)
