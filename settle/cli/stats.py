"""``settle stats``: records by state, quarantine entries by kind and resolution.

Records are found with SCAN over the namespace's record keys and read with
``Settler.get_many``, 1,000 at a time (for their effective state: an expired lease reads as
provisional). That is O(keys in the database) plus a round trip per thousand records: fine
for an operator's look at a namespace, not for a dashboard polled every second
(docs/cli.md).
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import click

from settle._core.codec import UndecodableEntry
from settle._core.keys import Keys
from settle._sync.settler import Settler
from settle._text import as_text
from settle.cli._context import (
    Connection,
    connection_options,
    json_option,
    name_undecodable,
    open_settler,
)
from settle.cli._render import add_row, console, new_table, print_json, print_table
from settle.demo.server import client_of
from settle.models import OperationRecord, QuarantineKind, State

__all__ = [
    "RECORD_BATCH",
    "SCAN_COUNT",
    "count_records",
    "operation_id_of",
    "record_key_match",
    "stats",
    "tally",
]

SCAN_COUNT = 1000


def record_key_match(namespace: str) -> str:
    """The SCAN pattern of every record key in a namespace (``settle:{ns:*}:op:*``). It
    also matches other keys (an attempt log of an id that contains ``}:op:``): each key
    found is checked with :func:`operation_id_of`."""
    return f"settle:{{{namespace}:*}}:op:*"


def operation_id_of(key: bytes | str, keys: Keys) -> str | None:
    """The operation id whose record key ``key`` is, or None when it is no record key of
    this namespace (an attempt log whose id contains ``}:op:``, a key of another shard
    count): the key a record of the id would have must be ``key`` itself."""
    try:
        text = as_text(key)
    except UnicodeDecodeError:
        return None
    match = re.fullmatch(
        rf"settle:\{{{re.escape(keys.namespace)}:\d+\}}:op:(.*)", text, flags=re.DOTALL
    )
    if match is None:
        return None
    operation_id = match.group(1)
    return operation_id if keys.record(operation_id) == text else None


def record_ids(settler: Settler) -> Iterator[str]:
    """Operation ids of every record in the namespace, one SCAN page at a time."""
    keys = Keys(settler.config.namespace, settler.config.shards)
    match = record_key_match(settler.config.namespace)
    for key in client_of(settler).scan_iter(match=match, count=SCAN_COUNT):
        operation_id = operation_id_of(key, keys)
        if operation_id is not None:
            yield operation_id


#: How many records ``count_records`` reads per ``get_many`` (one script call per shard and
#: 100 records, sent together).
RECORD_BATCH = 1000


def count_records(settler: Settler) -> Counter[str]:
    """Records by effective state (a record that expired between SCAN and read is skipped),
    read :data:`RECORD_BATCH` at a time with ``get_many``, not one script call each."""
    states: Counter[str] = Counter({s.value: 0 for s in State})
    ids = iter(record_ids(settler))
    while batch := list(itertools.islice(ids, RECORD_BATCH)):
        tally(states, settler.get_many(batch))
    return states


def tally(states: Counter[str], records: list[OperationRecord | None]) -> None:
    """Count ``records`` by effective state into ``states`` (None: a record that expired
    between the SCAN and the read, not counted)."""
    for record in records:
        if record is not None:
            states[record.state.value] += 1


def count_quarantine(
    settler: Settler,
) -> tuple[dict[str, dict[str, int]], list[UndecodableEntry]]:
    """Every quarantine entry by kind and resolution, streamed (no cap, bounded memory) as
    headers: Redis sends each entry's kind, time and status, never its payload (up to
    ``quarantine_payload_bytes`` an entry), so the count costs a few dozen bytes an entry.
    With the entries this version cannot decode (another version or program wrote them),
    which ended the count before any was shown."""
    kinds: dict[str, dict[str, int]] = {
        k.value: {"unresolved": 0, "resolved": 0} for k in QuarantineKind
    }
    marks: list[UndecodableEntry] = []
    walk = settler.quarantine._walk().header_marking()
    for h in settler.quarantine._scanned(walk):
        if isinstance(h, UndecodableEntry):
            marks.append(h)
        else:
            kinds[h.kind.value]["resolved" if h.resolved else "unresolved"] += 1
    return kinds, marks


@click.command("stats")
@connection_options
@json_option
def stats(conn: Connection, as_json: bool) -> None:
    """Records by state and quarantine entries by kind and resolution, counted exactly
    (SCANs the namespace: cost grows with the database, see docs/cli.md)."""
    with open_settler(conn, reads=True) as settler:
        states = count_records(settler)
        kinds, marks = count_quarantine(settler)
    # An entry nobody can read here counts in the totals, as unresolved unless a
    # resolution is stored (evidence nobody read), and apart from the kinds.
    unresolved = sum(v["unresolved"] for v in kinds.values())
    unresolved += sum(not m.resolved for m in marks)
    report: dict[str, Any] = {
        "namespace": conn.namespace,
        "shards": settler.config.shards,
        "records": {"total": sum(states.values()), "by_state": dict(states)},
        "quarantine": {
            "total": sum(v["unresolved"] + v["resolved"] for v in kinds.values()) + len(marks),
            "unresolved": unresolved,
            "undecodable": len(marks),
            "by_kind": kinds,
        },
    }
    if as_json:
        print_json(report)
        name_undecodable(marks)
        return
    out = console()
    records = new_table(f"records in {conn.namespace}", title_justify="left")
    records.add_column("state")
    records.add_column("records", justify="right")
    for state, n in states.items():
        add_row(records, state, n)
    add_row(records, "total", report["records"]["total"], style="bold")
    print_table(out, records)
    quarantined = new_table(f"quarantine of {conn.namespace}", title_justify="left")
    for column in ("kind", "unresolved", "resolved"):
        quarantined.add_column(column, justify="left" if column == "kind" else "right")
    for kind, counts in kinds.items():
        add_row(quarantined, kind, counts["unresolved"], counts["resolved"])
    q = report["quarantine"]
    add_row(quarantined, "total", q["unresolved"], q["total"] - q["unresolved"], style="bold")
    print_table(out, quarantined)
    if marks:
        out.print(f"{len(marks)} of them cannot be decoded (counted in the totals, not by kind)")
    name_undecodable(marks)
