"""``settle stats``: records by state, quarantine entries by kind and resolution.

Records are found with SCAN over the namespace's record keys and each is read with
``Settler.get`` (for its effective state: an expired lease reads as provisional). That is
O(keys in the database) plus one round trip per record: fine for an operator's look at a
namespace, not for a dashboard polled every second (docs/cli.md).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import click
from rich.table import Table

from settle._sync.settler import Settler
from settle.cli._context import Connection, connection_options, json_option, open_settler
from settle.cli._render import console, print_json
from settle.demo.server import client_of
from settle.models import QuarantineKind, State

__all__ = ["SCAN_COUNT", "count_records", "operation_id_of", "record_key_match", "stats"]

SCAN_COUNT = 1000
_QUARANTINE_LIMIT = 100_000


def record_key_match(namespace: str) -> str:
    """The SCAN pattern of every record key in a namespace (``settle:{ns:*}:op:*``)."""
    return f"settle:{{{namespace}:*}}:op:*"


def operation_id_of(key: bytes | str) -> str:
    """The operation id in a record key that :func:`record_key_match` matched."""
    text = key.decode("utf-8") if isinstance(key, bytes) else str(key)
    marker = "}:op:"
    return text[text.index(marker) + len(marker) :]


def record_ids(settler: Settler) -> list[str]:
    """Operation ids of every record key in the namespace."""
    match = record_key_match(settler.config.namespace)
    return [
        operation_id_of(key) for key in client_of(settler).scan_iter(match=match, count=SCAN_COUNT)
    ]


def count_records(settler: Settler) -> Counter[str]:
    """Records by effective state (a record that expired between SCAN and read is skipped)."""
    states: Counter[str] = Counter({s.value: 0 for s in State})
    for operation_id in record_ids(settler):
        record = settler.get(operation_id)
        if record is not None:
            states[record.state.value] += 1
    return states


@click.command("stats")
@connection_options
@json_option
def stats(conn: Connection, as_json: bool) -> None:
    """Records by state and quarantine entries by kind and resolution (SCANs the
    namespace: cost grows with the database, see docs/cli.md)."""
    with open_settler(conn) as settler:
        states = count_records(settler)
        entries = settler.quarantine.list(limit=_QUARANTINE_LIMIT)
    kinds: dict[str, dict[str, int]] = {
        k.value: {"unresolved": 0, "resolved": 0} for k in QuarantineKind
    }
    for e in entries:
        kinds[e.kind.value]["resolved" if e.resolution else "unresolved"] += 1
    report: dict[str, Any] = {
        "namespace": conn.namespace,
        "shards": settler.config.shards,
        "records": {"total": sum(states.values()), "by_state": dict(states)},
        "quarantine": {
            "total": len(entries),
            "unresolved": sum(v["unresolved"] for v in kinds.values()),
            "by_kind": kinds,
        },
    }
    if as_json:
        print_json(report)
        return
    out = console()
    records = Table(title=f"records in {conn.namespace}", title_justify="left")
    records.add_column("state")
    records.add_column("records", justify="right")
    for state, n in states.items():
        records.add_row(state, str(n))
    records.add_row("total", str(report["records"]["total"]), style="bold")
    out.print(records)
    quarantined = Table(title=f"quarantine of {conn.namespace}", title_justify="left")
    for column in ("kind", "unresolved", "resolved"):
        quarantined.add_column(column, justify="left" if column == "kind" else "right")
    for kind, counts in kinds.items():
        quarantined.add_row(kind, str(counts["unresolved"]), str(counts["resolved"]))
    q = report["quarantine"]
    quarantined.add_row(
        "total", str(q["unresolved"]), str(q["total"] - q["unresolved"]), style="bold"
    )
    out.print(quarantined)
