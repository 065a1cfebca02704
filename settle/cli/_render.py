"""How the CLI shows records, attempt logs and quarantine entries: rich tables for people,
plain JSON (one shape per command, documented in docs/cli.md) for scripts."""

from __future__ import annotations

import json
import shutil
import sys
from datetime import UTC, datetime
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from settle.models import AttemptObservation, OperationRecord, QuarantineEntry

__all__ = [
    "attempts_table",
    "console",
    "entries_table",
    "entry_json",
    "entry_line",
    "entry_table",
    "print_json",
    "record_json",
    "record_table",
]

_PREVIEW = 120


def console(*, stderr: bool = False) -> Console:
    """A console that does not squeeze tables to 80 columns when output is piped."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else max(shutil.get_terminal_size((200, 24)).columns, 200)
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=False))


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.isoformat(timespec="milliseconds")


def _short(value: datetime) -> str:
    """UTC, to the millisecond, without the offset (column headers say UTC)."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _decoded(data: bytes | None) -> Any:
    """Stored bytes as JSON when they are JSON (results are pydantic JSON), else None."""
    if data is None:
        return None
    try:
        return json.loads(data)
    except (UnicodeDecodeError, ValueError):
        return None


def _preview(data: bytes | None) -> str:
    if data is None:
        return "-"
    text = data.decode("utf-8", errors="replace")
    return text if len(text) <= _PREVIEW else text[:_PREVIEW] + "…"


def record_json(record: OperationRecord) -> dict[str, Any]:
    out = record.model_dump(mode="json")
    out["result_json"] = _decoded(record.result)
    return out


def entry_json(entry: QuarantineEntry) -> dict[str, Any]:
    out: dict[str, Any] = {"ref": entry.ref, **entry.model_dump(mode="json")}
    out["payload"]["truncated"] = entry.payload.truncated
    out["payload"]["json"] = _decoded(entry.payload.data)
    return out


def _fields_table(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for name, value in rows:
        table.add_row(name, value)
    return table


def record_table(record: OperationRecord) -> Table:
    state = record.state.value + (f" ({record.reason})" if record.reason else "")
    lease = _when(record.lease_expires_at) if record.lease_expires_at else "-"
    return _fields_table(
        f"operation {record.operation_id}",
        [
            ("state", state),
            ("fingerprint", f"{record.fingerprint} (v{record.fingerprint_version})"),
            ("binding", record.binding),
            ("generation", str(record.generation)),
            ("version", str(record.version)),
            ("reservations", str(record.reservations)),
            ("lease expires", lease),
            ("attempt id", record.attempt_id or "-"),
            ("created", _when(record.created_at)),
            ("updated", _when(record.updated_at)),
            ("result", _preview(record.result)),
            ("result sha256", record.result_digest or "-"),
        ],
    )


def attempts_table(attempts: list[AttemptObservation]) -> Table:
    table = Table(title="attempt log (oldest first)", title_justify="left")
    for column in ("at (UTC)", "generation", "action", "verdict", "detail", "attempt id"):
        table.add_column(column, no_wrap=True)
    for a in attempts:
        table.add_row(
            _short(a.at),
            "-" if a.generation is None else str(a.generation),
            a.action,
            a.verdict,
            a.detail or "-",
            a.attempt_id,
        )
    return table


def entries_table(entries: list[QuarantineEntry], title: str = "quarantine") -> Table:
    table = Table(title=title, title_justify="left")
    for column in (
        "id",
        "at (UTC)",
        "kind",
        "action",
        "operation",
        "presented gen",
        "current",
        "payload",
        "resolved",
    ):
        table.add_column(column, no_wrap=True)
    for e in entries:
        table.add_row(
            e.ref,
            _short(e.at),
            e.kind.value,
            e.action.value,
            e.operation_id,
            str(e.presented.generation),
            _current(e),
            f"{e.payload.size} B",
            "yes" if e.resolution else "no",
        )
    return table


def _current(e: QuarantineEntry) -> str:
    c = e.current
    return "-" if c is None else f"{c.state.value} gen {c.generation} v{c.version}"


def entry_table(e: QuarantineEntry) -> Table:
    p = e.presented
    rows = [
        ("operation", e.operation_id),
        ("kind", e.kind.value),
        ("action", e.action.value + (f" ({e.reason})" if e.reason else "")),
        ("at", _when(e.at)),
        ("attempt id", e.attempt_id),
        ("presented generation", str(p.generation)),
        ("presented binding", p.binding),
        ("presented fingerprint", f"{p.fingerprint} (v{p.fingerprint_version})"),
        ("expected version", "-" if p.expected_version is None else str(p.expected_version)),
        ("current record", _current(e)),
        (
            "payload",
            f"{e.payload.size} bytes, sha256 {e.payload.sha256}"
            + (" (truncated)" if e.payload.truncated else ""),
        ),
        ("payload data", _preview(e.payload.data)),
        (
            "resolution",
            "unresolved"
            if e.resolution is None
            else f"{_when(e.resolution.at)}: {e.resolution.note}",
        ),
    ]
    return _fields_table(f"quarantine entry {e.ref}", rows)


def entry_line(e: QuarantineEntry) -> str:
    """One line per entry, for ``quarantine tail``."""
    return (
        f"{_when(e.at)}  {e.ref}  {e.kind.value:<22} {e.action.value:<16} "
        f"op={e.operation_id} gen={e.presented.generation} current={_current(e)}"
    )
