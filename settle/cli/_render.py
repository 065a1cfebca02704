"""How the CLI shows records, attempt logs and quarantine entries: rich tables for people,
plain JSON (one shape per command, documented in docs/cli.md) for scripts.

Every stored value is shown as literal text: the consoles here interpret no rich markup
(``[/terms]``, ``[link=...]``), no emoji codes and highlight nothing, every cell is a
:class:`rich.text.Text` and every control character (terminal escapes, bidi overrides,
line separators) is shown as a visible escape such as ``\\x1b`` by :func:`visible`. JSON
output escapes them already (``ensure_ascii``), and is always strict JSON: stored bytes are
shown as parsed JSON only when a strict reader takes them as Python reads them (see
:func:`_decoded`), else as the bytes they are.
"""

from __future__ import annotations

import base64
import json
import math
import shutil
import sys
import unicodedata
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from settle.models import AttemptObservation, OperationRecord, QuarantineEntry

__all__ = [
    "add_row",
    "attempts_table",
    "console",
    "entries_table",
    "entry_json",
    "entry_line",
    "entry_table",
    "escape_char",
    "fields_table",
    "hidden",
    "json_line",
    "keep_whole",
    "literal",
    "new_table",
    "print_json",
    "record_json",
    "record_table",
    "visible",
]

_PREVIEW = 120


#: Characters that are never written as they are: controls (C0, C1, DEL), format
#: characters (bidi overrides, zero-width joiners), surrogates, private use, unassigned,
#: and the line and paragraph separators.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def hidden(ch: str) -> bool:
    """Whether ``ch`` is never written as it is (the CLI and the console share this rule)."""
    return unicodedata.category(ch) in _HIDDEN_CATEGORIES


def escape_char(ch: str) -> str:
    """The visible escape of one character: ``\\x1b``, ``\\u202e``, ``\\U000e0041``."""
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(text: str) -> str:
    """``text`` with every control character replaced by a visible escape (``\\x1b``,
    ``\\u2028``); everything else, markup-like brackets included, is kept as it is."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(escape_char(ch) if hidden(ch) else ch for ch in text)


def literal(value: object, style: str = "") -> Text:
    """A stored (or any untrusted) value as a rich cell: literal text, controls visible."""
    return Text(visible(str(value)), style=style)


def new_table(title: object = None, **options: Any) -> Table:
    """A table whose title is literal text (titles name operations, streams...)."""
    return Table(title=None if title is None else literal(title), **options)


def console(*, stderr: bool = False) -> Console:
    """A console that does not squeeze tables to 80 columns when output is piped, and
    interprets nothing it prints: no markup, no emoji codes, no highlighting (style with
    :class:`rich.text.Text`)."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else max(shutil.get_terminal_size((200, 24)).columns, 200)
    return Console(
        file=stream,
        width=width,
        markup=False,
        emoji=False,
        highlight=False,
        soft_wrap=False,
    )


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=False, allow_nan=False))


def json_line(value: Any) -> str:
    """``value`` as one line of strict JSON (JSON lines: export, tail)."""
    return json.dumps(value, allow_nan=False)


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.isoformat(timespec="milliseconds")


def _short(value: datetime) -> str:
    """UTC, to the millisecond, without the offset (column headers say UTC)."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


#: Stored JSON nested deeper than this is shown as text: it could not be written back out
#: (or read by the next tool) without running out of stack.
MAX_JSON_DEPTH = 200
#: Decimal digits of the largest finite double (about 1.8e308): an integer with more is
#: beyond a double's range, refused before Python converts it (quadratic in its length).
_MAX_INT_DIGITS = 309


def _not_json(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400: Python reads it as infinity, which JSON has no word for
        raise ValueError(f"{text} is out of range")
    return value


def _int_in_range(text: str) -> int:
    """An integer a double reader (jq, ``JSON.parse``) reads as a number, not as infinity:
    the same bound as :func:`_finite`, so ``1`` and 400 zeros is refused as ``1e400`` is."""
    if len(text.lstrip("-")) > _MAX_INT_DIGITS or math.isinf(float(text)):
        raise ValueError("an integer beyond a double's range")
    return int(text)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object without a repeated key: ``{"amount": 1, "amount": 1000}`` would otherwise
    be shown as ``{"amount": 1000}``, the first value silently gone from the evidence (and
    another reader may keep the first)."""
    value = dict(pairs)
    if len(value) != len(pairs):
        raise ValueError("a key repeated in one object")
    return value


def _depth_within(value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests at most ``limit`` deep, walked without recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return False
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return True


def _decoded(data: bytes | None) -> Any:
    """Stored bytes as JSON when they are strict JSON (results are pydantic JSON), else None.

    Strict means what a strict reader (RFC 8259 over UTF-8, as jq or ``JSON.parse`` after a
    UTF-8 decode) takes and reads as Python would, where ``json.loads(bytes)`` is lenient:
    the bytes are UTF-8 (not UTF-16 or UTF-32, whose encoding Python guesses, and no encoded
    surrogate), with no byte order mark; no ``NaN`` / ``Infinity`` and no number beyond a
    double's range (Python reads them, JSON has no such values); no key twice in one object
    (Python keeps the last value, another reader the first); nesting at most
    :data:`MAX_JSON_DEPTH` deep, so it can be written back out. Every check is linear."""
    if data is None:
        return None
    try:
        text = data.decode("utf-8")  # strict: refuses surrogates encoded as UTF-8
        if text.startswith("\ufeff"):
            return None
        value = json.loads(
            text,
            parse_constant=_not_json,
            parse_float=_finite,
            parse_int=_int_in_range,
            object_pairs_hook=_unique_keys,
        )
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return value if _depth_within(value, MAX_JSON_DEPTH) else None


def _preview(data: bytes | None) -> str:
    if data is None:
        return "-"
    text = data.decode("utf-8", errors="replace")
    return text if len(text) <= _PREVIEW else text[:_PREVIEW] + "…"


def _base64(data: bytes) -> str:
    """Standard base64 (RFC 4648 section 4), which ``base64 -d``, jq's ``@base64d`` and
    ``atob`` read. pydantic's ``"base64"`` is the URL-safe alphabet (``-`` and ``_``), which
    they refuse, or, like Python's ``b64decode``, silently decode to other bytes."""
    return base64.b64encode(data).decode("ascii")


def record_json(record: OperationRecord) -> dict[str, Any]:
    out = record.model_dump(mode="json")
    if record.result is not None:
        out["result"] = _base64(record.result)
    out["result_json"] = _decoded(record.result)
    return out


def entry_json(entry: QuarantineEntry) -> dict[str, Any]:
    out: dict[str, Any] = {"ref": entry.ref, **entry.model_dump(mode="json")}
    out["payload"]["data"] = _base64(entry.payload.data)
    out["payload"]["truncated"] = entry.payload.truncated
    out["payload"]["json"] = _decoded(entry.payload.data)
    return out


#: The widest a column :func:`keep_whole` keeps may be: a SHA-256 digest in hex. A longer
#: cell in it is free text (a stream name, up to 256 characters), folded to this width.
WHOLE_WIDTH = 64


def keep_whole(table: Table, *headers: str) -> Table:
    """The one rule of the CLI's tables: the cells of the columns named (generations, ids,
    digests: what a user copies into a command) are never folded, wrapped or cut short, in
    an 80-column terminal too; every other column wraps into the width that is left. Call
    it once the rows are in.

    A kept column is as wide as its widest cell up to :data:`WHOLE_WIDTH`; a wider cell
    folds at that width. Kept whole, a 100-character stream name in ``cursor show``'s value
    column took the whole terminal: the field column was squeezed to nothing and the
    table's right edge cut off."""
    for column in table.columns:
        if column.header in headers:
            widths = [Text(str(c)).cell_len for c in (column.header, *column.cells)]
            column.no_wrap = True
            column.min_width = min(max(widths, default=1), WHOLE_WIDTH)
            if max(widths, default=1) > WHOLE_WIDTH:
                column.max_width = WHOLE_WIDTH
                for cell in column.cells:
                    if isinstance(cell, Text) and cell.cell_len > WHOLE_WIDTH:
                        cell.no_wrap = False
                        cell.overflow = "fold"
        else:
            column.overflow = "fold"
    return table


def fields_table(title: str, rows: Sequence[tuple[str, object]]) -> Table:
    """Two columns, field and value, every cell literal."""
    table = new_table(title, show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for name, value in rows:
        table.add_row(literal(name), literal(value))
    return table


def add_row(table: Table, *cells: object, style: str = "") -> None:
    """A row of literal cells."""
    table.add_row(*(literal(c) for c in cells), style=style or None)


def record_table(record: OperationRecord) -> Table:
    state = record.state.value + (f" ({record.reason})" if record.reason else "")
    lease = _when(record.lease_expires_at) if record.lease_expires_at else "-"
    return fields_table(
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
    table = new_table("attempt log (oldest first)", title_justify="left")
    for column in ("at (UTC)", "generation", "action", "verdict", "detail", "attempt id"):
        table.add_column(column, no_wrap=True)
    for a in attempts:
        add_row(
            table,
            _short(a.at),
            "-" if a.generation is None else str(a.generation),
            a.action,
            a.verdict,
            a.detail or "-",
            a.attempt_id,
        )
    return table


def entries_table(entries: list[QuarantineEntry], title: str = "quarantine") -> Table:
    table = new_table(title, title_justify="left")
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
        add_row(
            table,
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
    return fields_table(f"quarantine entry {e.ref}", rows)


def entry_line(e: QuarantineEntry) -> str:
    """One line per entry, for ``quarantine tail`` (the operation id made visible)."""
    return (
        f"{_when(e.at)}  {e.ref}  {e.kind.value:<22} {e.action.value:<16} "
        f"op={visible(e.operation_id)} gen={e.presented.generation} current={_current(e)}"
    )
