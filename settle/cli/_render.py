"""How the CLI shows records, attempt logs and quarantine entries: rich tables for people,
plain JSON (one shape per command, documented in docs/cli.md) for scripts.

Every stored value is shown as literal text: the consoles here interpret no rich markup
(``[/terms]``, ``[link=...]``), no emoji codes and highlight nothing, every cell is a
:class:`rich.text.Text` and every control character (terminal escapes, bidi overrides,
line separators) is shown as a visible escape such as ``\\x1b``, a backslash as ``\\\\``
(:func:`visible`). JSON output escapes them already (``ensure_ascii``), and is always strict
JSON: stored bytes are shown as parsed JSON only when a strict reader takes them as Python
reads them (see :func:`_decoded`), else as the bytes they are.
"""

from __future__ import annotations

import base64
import json
import math
import os
import shutil
import sys
import unicodedata
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any, TextIO

import click
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from settle._core.codec import UndecodableEntry
from settle._input import is_decimal
from settle.models import AttemptObservation, OperationRecord, QuarantineEntry

__all__ = [
    "Listing",
    "Phrase",
    "Whole",
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
    "listed_json",
    "literal",
    "new_table",
    "print_json",
    "print_table",
    "print_text",
    "record_json",
    "record_table",
    "visible",
    "visible_bytes",
    "visible_message",
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
    """The visible escape of one character: ``\\x1b``, ``\\u0085``, ``\\u202e``,
    ``\\U000e0041``. ``\\x`` is for ASCII only: ``\\x80`` to ``\\xff`` are the stored bytes
    that are not UTF-8 text (:func:`visible_bytes`), never a character."""
    code = ord(ch)
    if code <= 0x7F:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(text: str) -> str:
    """A stored value as literal text that reads back one way: every control character
    replaced by a visible escape (``\\x1b``, ``\\u2028``) and every backslash doubled, so
    an id holding the four characters ``\\x1b`` shows as ``\\\\x1b``, never as the escape of
    ESC (as Python's ``repr`` does). Everything else, markup-like brackets included, is kept
    as it is."""
    return visible_message(text.replace("\\", "\\\\"))


def visible_bytes(data: bytes) -> str:
    """Stored bytes as literal text that reads back one way: their UTF-8 text as
    :func:`visible` shows it, and each byte that is not part of UTF-8 text as ``\\xNN``
    (``b"ok \\xff"`` shows as ``ok \\xff``), never as U+FFFD, which stood for any such
    byte and for itself."""
    text = data.decode("utf-8", "surrogateescape")  # a byte that is not UTF-8: U+DC80-DCFF
    if text.isascii() and text.isprintable():
        return text.replace("\\", "\\\\")
    return "".join(
        f"\\x{ord(ch) - 0xDC00:02x}" if "\udc80" <= ch <= "\udcff" else visible(ch) for ch in text
    )


def visible_message(text: str) -> str:
    """One of settle's own messages with every control character made visible and its
    backslashes kept: a stored value in a message is quoted with ``repr``, which doubled them
    already (``no operation 'a\\\\x1b'``), and :func:`visible` would double them again."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(escape_char(ch) if hidden(ch) else ch for ch in text)


def literal(value: object, style: str = "") -> Text:
    """A stored (or any untrusted) value as a rich cell: literal text, controls visible,
    backslashes doubled (:func:`visible`); ``bytes`` as :func:`visible_bytes` shows them."""
    if isinstance(value, bytes):
        return Text(visible_bytes(value), style=style)
    return Text(visible(str(value)), style=style)


@dataclass(frozen=True)
class Whole:
    """A value a user copies (an operation id, a stream name) inside a title or a message:
    a line never breaks it, not even at its spaces (:func:`print_table`, :func:`print_text`)."""

    value: object


#: A title or a message: text, which wraps at its spaces, and values kept :class:`Whole`.
Phrase = str | Whole | tuple[str | Whole, ...]


def _words(phrase: Phrase) -> list[str]:
    """What a line break may not go through, made visible: each word of the text, and each
    :class:`Whole` value with the text that touches it (``id:``)."""
    words = [""]
    for part in phrase if isinstance(phrase, tuple) else (phrase,):
        if isinstance(part, Whole):
            words[-1] += visible(str(part.value))
        else:
            first, *rest = visible(part).split(" ")
            words[-1] += first
            words.extend(rest)
    return words


def new_table(
    title: Phrase | None = None, *, whole: Collection[str] = (), **options: Any
) -> Listing:
    """A table whose title is literal text (titles name operations, streams...: mark them
    :class:`Whole`), and whose columns (or fields) named ``whole`` are never broken
    (:func:`print_table`)."""
    words = None if title is None else _words(title)
    text = None if words is None else Text(" ".join(words))
    return Listing(title=text, whole=whole, title_words=words, **options)


def console(*, stderr: bool = False) -> Console:
    """A console as wide as the terminal it writes to, or 200 columns when output is piped
    (:func:`print_table` widens it further for a table that needs more), that interprets
    nothing it prints: no markup, no emoji codes, no highlighting (style with
    :class:`rich.text.Text`).

    On a terminal the width is ``COLUMNS`` when set (as rich reads it), else the
    terminal's; rich's own guess gave a ``TERM=dumb`` terminal 80 columns, however narrow."""
    stream = sys.stderr if stderr else sys.stdout
    if _on_terminal(stream):
        size = _terminal_size(stream)
    else:
        columns = max(shutil.get_terminal_size((200, 24)).columns, 200)
        size = os.terminal_size((columns, 24))
    return _Console(
        file=stream,
        width=size.columns,
        height=size.lines,
        markup=False,
        emoji=False,
        highlight=False,
        soft_wrap=False,
    )


class _Console(Console):
    """rich's console, but a reader that stopped (``| head``) ends the command as every
    command's output does (``settle.cli.main``: quietly, exit 0): rich's own handling
    exits 1, which the docs give to "not found"."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def _on_terminal(stream: IO[str]) -> bool:
    """Whether output goes to a terminal, which decides both its width (:func:`console`) and
    its layout (:func:`print_table`). Not rich's ``is_terminal``: ``FORCE_COLOR`` and
    ``TTY_COMPATIBLE`` change that, and they ask for colours (which they get), not for a
    terminal's layout in a pipe or a pipe's in a terminal."""
    try:
        return stream.isatty()
    except ValueError:  # closed
        return False


def _terminal_size(stream: TextIO) -> os.terminal_size:
    try:
        size = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError):  # not a real terminal after all (a test's StringIO)
        size = os.terminal_size((80, 24))
    columns, lines = (size.columns or 80), (size.lines or 24)
    for name in ("COLUMNS", "LINES"):
        value = os.environ.get(name, "")
        if is_decimal(value) and int(value) > 0:
            columns, lines = (int(value), lines) if name == "COLUMNS" else (columns, int(value))
    return os.terminal_size((columns, lines))


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


def _preview(data: bytes | None) -> bytes | str:
    """The first :data:`_PREVIEW` characters of stored bytes (a byte that is not UTF-8
    counts as one), as bytes: a cell shows them exactly (:func:`literal`)."""
    if data is None:
        return "-"
    text = data.decode("utf-8", "surrogateescape")
    if len(text) <= _PREVIEW:
        return data
    return text[:_PREVIEW].encode("utf-8", "surrogateescape") + "…".encode()


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


def listed_json(entry: QuarantineEntry | UndecodableEntry) -> dict[str, Any]:
    """:func:`entry_json` of an entry; of one this version cannot decode, where it is and
    why (``undecodable``), so that a listing or an export loses no entry silently."""
    if isinstance(entry, UndecodableEntry):
        return {
            "id": entry.id,
            "shard": entry.shard,
            "ref": entry.ref,
            "operation_id": entry.operation_id,
            "resolved": entry.resolved,
            "undecodable": entry.problem,
        }
    return entry_json(entry)


def entry_json(entry: QuarantineEntry) -> dict[str, Any]:
    out: dict[str, Any] = {"ref": entry.ref, **entry.model_dump(mode="json")}
    out["payload"]["data"] = _base64(entry.payload.data)
    out["payload"]["truncated"] = entry.payload.truncated
    # A cut payload is not JSON, whatever its kept bytes read as: a prefix that parses
    # (`{"a": 1}` and the spaces before the cut) is not the value the payload was.
    out["payload"]["json"] = None if entry.payload.truncated else _decoded(entry.payload.data)
    return out


class Listing(Table):
    """A rich table that knows which of its values a user copies into the next command (ids,
    operation ids, generations, attempt ids, digests): ``whole`` names those columns by
    header or, in a table of fields (no header: field names, then values), those fields;
    ``title_words`` are the pieces its title wraps between (:func:`new_table`).
    Print it with :func:`print_table`."""

    def __init__(
        self,
        *args: Any,
        whole: Collection[str] = (),
        title_words: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.whole = frozenset(whole)
        self.title_words = None if title_words is None else list(title_words)


def _plain(value: object) -> str:
    return value.plain if isinstance(value, Text) else str(value)


def _pieces(text: str, whole: bool) -> list[str]:
    """What a line break may not go through: a whole value, else each word."""
    return _words(Whole(text) if whole else text)


@dataclass(frozen=True)
class _Grid:
    """The text of a table: its column headers, its rows, which cells are whole, and whether
    it is a table of fields (printed as one block whose labels are its first column)."""

    headers: list[str]
    rows: list[list[str]]
    whole: list[list[bool]]
    fields: bool

    @classmethod
    def of(cls, table: Table) -> _Grid:
        names = table.whole if isinstance(table, Listing) else frozenset()
        headers = [_plain(column.header) for column in table.columns]
        columns = [[_plain(cell) for cell in column.cells] for column in table.columns]
        rows = [list(row) for row in zip(*columns, strict=True)]
        fields = not table.show_header
        if fields:
            whole = [[i > 0 and row[0] in names for i in range(len(row))] for row in rows]
        else:
            whole = [[header in names for header in headers] for _ in rows]
        return cls(headers, rows, whole, fields)

    def measure(self) -> tuple[list[int], list[int]]:
        """Per column, the narrowest it can be without breaking a whole value or a word
        (a header wraps at its spaces), and the width of its widest cell."""
        narrowest, widest = [], []
        for c, header in enumerate(self.headers):
            heads = [] if self.fields else [header]
            cells = [(row[c], self.whole[r][c]) for r, row in enumerate(self.rows)]
            pieces = [p for text, whole in cells for p in _pieces(text, whole)]
            pieces += [p for text in heads for p in text.split(" ")]
            narrowest.append(max((cell_len(p) for p in pieces), default=1) or 1)
            widest.append(max((cell_len(t) for t in [*heads, *(t for t, _ in cells)]), default=1))
        return narrowest, [max(w, n) for w, n in zip(widest, narrowest, strict=True)]


def _chrome(table: Table) -> int:
    """Columns a table's borders and cell padding take (the tables here pad every cell)."""
    n = len(table.columns)
    padding = table.padding[1] + table.padding[3]
    borders = (n - 1 + (2 if table.show_edge else 0)) if table.box else 0
    return n * padding + borders


def _spread(narrowest: list[int], widest: list[int], room: int) -> list[int]:
    """Column widths from the narrowest, the room left given to the narrowest column still
    short of its widest cell, one column at a time: short columns are shown whole first."""
    widths = list(narrowest)
    left = room - sum(widths)
    while left > 0:
        short = [i for i, w in enumerate(widths) if w < widest[i]]
        if not short:
            break
        widths[min(short, key=lambda i: widths[i])] += 1
        left -= 1
    return widths


def _lines(label: str | None, pieces: list[str], indent: int, width: int) -> list[str]:
    """``label: value`` as lines ``width`` wide, the value (its :func:`_pieces`) from column
    ``indent``, wrapped between its pieces only (a whole value is one). A piece wider than
    the room beside the label goes on a line of its own, indented two columns, or from the
    first column when even that is too narrow: it is never broken. The terminal wraps a line
    wider than itself, and copies it back as one line (docs/cli.md, "Narrow terminals").

    Without a label (a title), the text starts at column 0 and ``indent`` is 0."""
    room = max(width - indent, 1)
    head = "" if label is None else f"{label}:".ljust(indent)
    out: list[str] = []
    current: str | None = None  # the words of the line being filled

    def flush() -> None:
        nonlocal current
        if not out and (current or label is not None):  # the label's line
            out.append(head + current if current else head.rstrip())
        elif out and current:
            out.append(" " * indent + current)
        current = None

    for piece in pieces:
        if cell_len(piece) > room:
            flush()
            out.append(("  " if indent and cell_len(piece) <= width - 2 else "") + piece)
        elif current is None:
            current = piece
        elif cell_len(current) + 1 + cell_len(piece) <= room:
            current = f"{current} {piece}"
        else:
            flush()
            current = piece
    if current is not None or not out:
        flush()
    return out


def print_text(out: Console, message: Phrase) -> None:
    """One message (stored values in it made visible), wrapped at its spaces only, never in
    a :class:`Whole` value."""
    _print_wrapped(out, _words(message), out.width)


def _print_wrapped(out: Console, words: list[str], width: int, style: str = "") -> None:
    for line in _lines(None, words, 0, width):
        out.print(Text(line, style=style), soft_wrap=True)


def print_table(out: Console, table: Table) -> None:
    """The one layout rule of the CLI's tables: a value a user copies into the next command
    (the columns or fields a :class:`Listing` names whole) is never broken, cut short or
    ellipsized, and no word of the others is broken.

    The table is printed when it fits the terminal so: whole columns as wide as their widest
    cell, the others at least as wide as their longest word (they wrap at spaces). When it
    does not (``quarantine ls`` in 80 columns), each row is printed as a block of
    ``field: value`` lines instead, a blank line after each, as ``psql``'s expanded mode
    does. Piped output is a table always, as wide as its widest row (200 columns at least),
    so that a script that reads it sees one line per row, whatever the terminal it ran in."""
    grid = _Grid.of(table)
    narrowest, widest = grid.measure()
    chrome = _chrome(table)
    need = sum(narrowest) + chrome
    # piped: a row is one line, every cell whole, for the script that reads it (grep, awk)
    width = out.width if _on_terminal(out.file) else max(out.width, sum(widest) + chrome)
    title = "" if table.title is None else _plain(table.title)
    words = table.title_words if isinstance(table, Listing) else None
    words = title.split(" ") if words is None else words
    if need > width:
        _print_blocks(out, grid, words if title else [], width)
        return
    widths = _spread(narrowest, widest, width - chrome)
    for column, w in zip(table.columns, widths, strict=True):
        column.width, column.min_width, column.max_width = w, None, None
        column.no_wrap, column.overflow = False, "fold"
    if cell_len(title) > sum(widths) + chrome:  # rich would fold it at the table's width
        table.title = None
        _print_wrapped(out, words, width, "table.title")
    wide, out.width = out.width, width
    try:
        out.print(table)
    finally:
        out.width = wide


def _print_blocks(out: Console, grid: _Grid, title: list[str], width: int) -> None:
    if title:
        _print_wrapped(out, title, width, "table.title")
    if grid.fields:
        labels = [row[0] for row in grid.rows]
        blocks = [[(row[0], row[-1], grid.whole[r][-1]) for r, row in enumerate(grid.rows)]]
    else:
        labels = grid.headers
        blocks = [
            list(zip(grid.headers, row, grid.whole[r], strict=True))
            for r, row in enumerate(grid.rows)
        ]
        out.print()
    indent = max((cell_len(label) for label in labels), default=0) + 2
    for block in blocks:
        for label, value, whole in block:
            for line in _lines(label, _pieces(value, whole), indent, width):
                out.print(Text(line), soft_wrap=True)
        out.print()


def fields_table(
    title: Phrase, rows: Sequence[tuple[str, object]], whole: Collection[str] = ()
) -> Listing:
    """Two columns, field and value, every cell literal; the fields named ``whole`` are
    never broken (:func:`print_table`)."""
    table = new_table(title, whole=whole, show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for name, value in rows:
        table.add_row(literal(name), literal(value))
    return table


def add_row(table: Table, *cells: object, style: str = "") -> None:
    """A row of literal cells."""
    table.add_row(*(literal(c) for c in cells), style=style or None)


def record_table(record: OperationRecord) -> Listing:
    state = record.state.value + (f" ({record.reason})" if record.reason else "")
    lease = _when(record.lease_expires_at) if record.lease_expires_at else "-"
    return fields_table(
        ("operation ", Whole(record.operation_id)),
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
        whole=("fingerprint", "binding", "generation", "attempt id", "result sha256"),
    )


def attempts_table(attempts: list[AttemptObservation]) -> Listing:
    table = new_table(
        "attempt log (oldest first)", whole=("generation", "attempt id"), title_justify="left"
    )
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


def entries_table(entries: list[QuarantineEntry], title: Phrase = "quarantine") -> Listing:
    whole = ("id", "operation", "presented gen", "current")
    table = new_table(title, whole=whole, title_justify="left")
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


def entry_table(e: QuarantineEntry) -> Listing:
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
    whole = (
        "operation",
        "attempt id",
        "presented generation",
        "presented binding",
        "presented fingerprint",
        "current record",
    )
    return fields_table(("quarantine entry ", Whole(e.ref)), rows, whole)


def entry_line(e: QuarantineEntry) -> str:
    """One line per entry, for ``quarantine tail`` (the operation id made visible)."""
    return (
        f"{_when(e.at)}  {e.ref}  {e.kind.value:<22} {e.action.value:<16} "
        f"op={visible(e.operation_id)} gen={e.presented.generation} current={_current(e)}"
    )
