"""Stored values as text a person can read and a browser never runs.

Templates autoescape everything; these helpers add what escaping alone does not: control
and invisible characters (including bidi overrides) made visible, a payload shown as its
stored text (JSON re-indented, never re-serialized) or a hex dump within a bounded size,
and the overview's chart drawn as SVG on the server.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import groupby
from typing import Any

from markupsafe import Markup, escape

from settle.cli._render import escape_char, hidden

__all__ = [
    "PayloadView",
    "chart_svg",
    "payload_view",
    "shell_word",
    "visible",
    "visible_text",
    "when",
]

_MARK = Markup('<span class="ctl" title="control character">{}</span>')
_LINES = frozenset("\t\n")


def _mark(text: str, keep: frozenset[str] = frozenset()) -> Markup:
    """``text`` escaped, each character the CLI would not write as it is (one rule,
    :func:`settle.cli._render.hidden`) marked as its escape, except those in ``keep``."""
    out: list[Markup] = []
    for masked, run in groupby(text, key=lambda ch: ch not in keep and hidden(ch)):
        if masked:
            out.extend(_MARK.format(escape_char(ch)) for ch in run)
        else:
            out.append(escape("".join(run)))
    return Markup("").join(out)


def visible(value: Any) -> Markup:
    """A one-line value (operation id, principal, note) escaped, every control or
    invisible character shown as a marked ``\\xNN`` / ``\\uNNNN`` / ``\\UNNNNNNNN``, line
    breaks included."""
    return _mark("" if value is None else str(value))


def visible_text(value: str) -> Markup:
    """Like :func:`visible`, but newlines and tabs are kept (for ``<pre>`` blocks)."""
    return _mark(value, _LINES)


def shell_word(text: str) -> str:
    """``text`` as one word of a command the reader pastes into a POSIX shell: quoted (an
    operation id comes from outside: unquoted, ``order-$(...)`` ran its commands). A
    character the page marks rather than shows (private use, unassigned) is spelt by
    ``printf`` as its UTF-8 bytes: marked, the pasted command named another operation."""
    if not any(hidden(ch) for ch in text):
        return shlex.quote(text)
    spelt = "".join(_PRINTF.get(ch, ch) if not hidden(ch) else _octal(ch) for ch in text)
    return f'"$(printf -- {shlex.quote(spelt)})"'


#: What a ``printf`` format reads as an escape or a conversion, written as itself.
_PRINTF = {"\\": "\\\\", "%": "%%"}


def _octal(ch: str) -> str:
    """``ch`` as ``printf``'s octal escapes of its UTF-8 bytes."""
    return "".join(f"\\{byte:03o}" for byte in ch.encode("utf-8", "surrogatepass"))


def when(value: datetime | None) -> str:
    """UTC to the millisecond, the way every page shows time."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


#: The most HTML one payload view renders, in bytes of UTF-8 (the entry page has two: the
#: payload and the operation's stored result): a view that would be longer shows the stored
#: text up to this size and says how many bytes it left out (docs/console.md, "The pages").
VIEW_LIMIT = 256 * 1024
#: Whitespace between JSON tokens (RFC 8259): the only characters re-indenting changes.
_JSON_SPACE = " \t\n\r"
#: A token of strict JSON text: a string, a structural character, a bare scalar (number,
#: true, false, null), or whitespace between them.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\],:]|[^ \t\n\r{}\[\],:"]+|[ \t\n\r]+')
#: Characters of stored text marked or escaped together (a view stops between two pieces).
_PIECE = 256


@dataclass(frozen=True, slots=True)
class PayloadView:
    form: str  # json | text | bytes | empty
    body: Markup
    #: Stored bytes left out because the view reached :data:`VIEW_LIMIT` (export to see all).
    more: int = 0
    #: True when the JSON is shown re-indented (only whitespace between tokens changed).
    reindented: bool = False


def payload_view(data: bytes, decoded: Any, *, whole: bool = True) -> PayloadView:
    """The stored bytes as they are: UTF-8 text with invisible characters marked (by the
    CLI's rule), else a hex dump. Strict JSON (``decoded`` is what ``entry_json`` parsed, or
    the text is ``null``) is re-indented when the result fits in the view: only whitespace
    between tokens changes, every string, number and key is the stored text. Bytes that are
    not ``whole`` (a truncated payload's kept bytes) are never JSON, whatever they read as.
    Never more than :data:`VIEW_LIMIT` of HTML: past it, the stored text is cut and
    ``more`` says how many bytes were left out."""
    if not data:
        return PayloadView("empty", Markup(""))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        dump, shown = _hexdump(data, VIEW_LIMIT)
        return PayloadView("bytes", dump, len(data) - shown)
    form = "text"
    # ``decoded`` is None for a cut payload, but kept bytes that read ``null`` would pass
    # the check of the JSON null: a cut payload was shown as the JSON ``null``.
    if whole and (decoded is not None or text.strip(_JSON_SPACE) == "null"):
        form = "json"
        pretty = _reindent(text, VIEW_LIMIT)
        if pretty is not None:
            body, shown = _marked(pretty, _LINES, VIEW_LIMIT)
            if shown == len(pretty):
                return PayloadView(form, body, reindented=pretty != text)
    body, shown = _marked(text, _LINES, VIEW_LIMIT)
    return PayloadView(form, body, len(data) - len(text[:shown].encode("utf-8")))


def _reindent(text: str, limit: int) -> str | None:
    """Strict JSON ``text`` indented by two spaces a level (as ``json.dumps(indent=2)``
    lays it out), every token copied as it is stored; None once it grows past ``limit``
    characters (deep nesting indents every line: the layout could be far larger than the
    text)."""
    out: list[str] = []
    size = depth = 0
    opened = False  # the last lexeme opened an object or array
    for match in _JSON_TOKEN.finditer(text):
        lexeme = match.group()
        if lexeme[0] in _JSON_SPACE:
            continue
        if lexeme in ("]", "}"):
            depth -= 1
            piece = lexeme if opened else "\n" + "  " * depth + lexeme
        else:
            piece = ("\n" + "  " * depth if opened else "") + lexeme
            if lexeme == ",":
                piece += "\n" + "  " * depth
            elif lexeme == ":":
                piece += " "
            elif lexeme in ("[", "{"):
                depth += 1
        opened = lexeme in ("[", "{")
        out.append(piece)
        size += len(piece)
        if size > limit:
            return None
    return "".join(out)


def _marked(text: str, keep: frozenset[str], limit: int) -> tuple[Markup, int]:
    """:func:`_mark` of as much of ``text`` as fits in ``limit`` bytes of HTML (UTF-8, as
    the page is sent: counted in characters, a view of four-byte characters was four times
    the limit), and how many characters of ``text`` that is (stopping between two pieces)."""
    out: list[Markup] = []
    size = shown = 0
    for start in range(0, len(text), _PIECE):
        piece = text[start : start + _PIECE]
        html = _mark(piece, keep)
        length = len(html) if html.isascii() else len(html.encode("utf-8"))
        if size + length > limit:
            break
        out.append(html)
        size += length
        shown += len(piece)
    return Markup("").join(out), shown


def _hexdump(data: bytes, limit: int) -> tuple[Markup, int]:
    """A hex dump of as many 16-byte lines of ``data`` as fit in ``limit`` characters of
    HTML, and how many bytes it shows."""
    lines: list[Markup] = []
    size = shown = 0
    for offset in range(0, len(data), 16):
        chunk = data[offset : offset + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in chunk)
        line = escape(f"{offset:08x}  {hexes:<47}  |{text}|\n")
        if size + len(line) > limit:
            break
        lines.append(line)
        size += len(line)
        shown += len(chunk)
    return Markup("").join(lines).rstrip("\n"), shown


def chart_svg(
    buckets: list[tuple[datetime, int]], *, width: int = 720, height: int = 200
) -> Markup:
    """A bar chart of quarantined responses per time bucket, as inline SVG (no script,
    no style attribute: colours come from the shipped stylesheet's classes). Every value
    goes through ``Markup.format``, which escapes it."""
    left, bottom, top = 40, 28, 10
    plot_w, plot_h = width - left - 8, height - bottom - top
    peak = max((c for _, c in buckets), default=0)
    scale = max(peak, 1)
    n = max(len(buckets), 1)
    slot = plot_w / n
    base = top + plot_h
    parts = [
        Markup(
            '<svg class="chart" viewBox="0 0 {} {}" role="img" '
            'xmlns="http://www.w3.org/2000/svg" aria-label="quarantined responses over time">'
            '<line class="axis" x1="{}" y1="{}" x2="{}" y2="{}"/>'
            '<text class="tick" x="{}" y="{}" text-anchor="end">{}</text>'
            '<text class="tick" x="{}" y="{}" text-anchor="end">0</text>'
        ).format(
            width, height, left, base, width - 8, base, left - 6, top + 4, peak, left - 6, base
        )
    ]
    label_every = max(1, n // 6)
    for i, (start, count) in enumerate(buckets):
        h = plot_h * count / scale
        x = left + i * slot + 1
        parts.append(
            Markup(
                '<rect class="bar" x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}">'
                "<title>{} UTC: {}</title></rect>"
            ).format(x, base - h, max(slot - 2, 1), h, when(start), count)
        )
        if i % label_every == 0:
            label = start.astimezone(UTC).strftime("%m-%d %H:%M")
            parts.append(
                Markup('<text class="tick" x="{:.1f}" y="{}">{}</text>').format(
                    x, height - 8, label
                )
            )
    parts.append(Markup("</svg>"))
    return Markup("").join(parts)
