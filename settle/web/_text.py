"""Stored values as text a person can read and a browser never runs.

Templates autoescape everything; these helpers add what escaping alone does not: control
and invisible characters (including bidi overrides) made visible, a payload shown as
pretty JSON, text or a hex dump, and the overview's chart drawn as SVG on the server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import groupby
from typing import Any

from markupsafe import Markup, escape

from settle.cli._render import escape_char, hidden

__all__ = ["PayloadView", "chart_svg", "payload_view", "visible", "visible_text", "when"]

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


def when(value: datetime | None) -> str:
    """UTC to the millisecond, the way every page shows time."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


@dataclass(frozen=True, slots=True)
class PayloadView:
    form: str  # json | text | bytes | empty
    body: Markup


def payload_view(data: bytes, decoded: Any) -> PayloadView:
    """Pretty JSON when the stored bytes are JSON (``decoded`` is what ``entry_json``
    parsed), UTF-8 text when they are text, a hex dump otherwise."""
    if not data:
        return PayloadView("empty", Markup(""))
    if decoded is not None or data.strip() == b"null":
        pretty = json.dumps(decoded, indent=2, ensure_ascii=False, sort_keys=False)
        return PayloadView("json", visible_text(pretty))
    try:
        return PayloadView("text", visible_text(data.decode("utf-8")))
    except UnicodeDecodeError:
        return PayloadView("bytes", escape(_hexdump(data)))


def _hexdump(data: bytes) -> str:
    lines = []
    for offset in range(0, len(data), 16):
        chunk = data[offset : offset + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in chunk)
        lines.append(f"{offset:08x}  {hexes:<47}  |{text}|")
    return "\n".join(lines)


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
