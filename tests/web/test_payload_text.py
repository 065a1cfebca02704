"""The payload view against what is stored, for every JSON text Hypothesis can write.

Strict JSON is shown re-indented: without the whitespace between tokens, the view is the
stored text, token for token (strings, escapes, numbers and keys as stored). Anything else,
however much it looks like JSON, is shown as its text and never called JSON. Whatever the
payload, the view is escaped HTML: the only markup in it is the console's own marks.
"""

from __future__ import annotations

import html
import json
import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from settle.cli._render import _decoded
from settle.web._text import VIEW_LIMIT, payload_view

_MARKED = re.compile(
    r'<span class="ctl" title="control character">\\(x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})</span>'
)


def shown(body: str) -> str:
    """The text a view stands for: its marks turned back into the characters they mark,
    then unescaped (and no other markup: a tag left over is a hole in the escaping)."""
    text = _MARKED.sub(lambda m: chr(int(m.group(1)[1:], 16)), body)
    assert "<" not in text, body
    assert ">" not in text, body
    return html.unescape(text)


def squeezed(text: str) -> str:
    """``text`` without the JSON whitespace outside its strings (read by hand, not by the
    code under test)."""
    out = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            out.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
            out.append(ch)
        elif ch not in " \t\n\r":
            out.append(ch)
    return "".join(out)


_space = st.sampled_from(["", "", " ", "\n", "\t", "\r\n", "  \n\t "])


@st.composite
def _escaped_string(draw: st.DrawFn) -> str:
    """A JSON string literal spelled as a writer might: characters as they are or escaped
    (``\\"``, ``\\\\``, ``\\/``, ``\\n``, ``\\u00e9``, lone surrogates ``\\ud800``)."""
    parts = ['"']
    for ch in draw(st.text(max_size=8)):
        style = draw(st.integers(0, 2))
        if style == 2 and ord(ch) <= 0xFFFF:
            parts.append(f"\\u{ord(ch):04X}")
        elif ch in '"\\' or ord(ch) < 0x20 or style == 1:
            parts.append(json.dumps(ch)[1:-1])  # \", \\, \n, \u00e9, a surrogate pair
        else:
            parts.append(ch)
    parts.append(draw(st.sampled_from(["", "", "\\ud800", "\\/", '\\"\\\\', "\\u00E9"])))
    parts.append('"')
    return "".join(parts)


_number = st.sampled_from(
    ["0", "-0", "1", "-1", "12345678901234567.89", "1.50", "1e2", "1E+2", "-0.0e-0", "1e308"]
) | st.integers(-(10**20), 10**20).map(str)
_scalar = _escaped_string() | _number | st.sampled_from(["true", "false", "null"])


@st.composite
def json_text(draw: st.DrawFn, depth: int = 0) -> str:
    """Strict JSON text with whitespace of every kind between its tokens."""
    s = lambda: draw(_space)  # noqa: E731
    if depth >= 3 or draw(st.integers(0, 2)) == 0:
        return draw(_scalar)
    if draw(st.booleans()):
        items = [draw(json_text(depth + 1)) for _ in range(draw(st.integers(0, 3)))]
        return "[" + s() + ("," + s()).join(i + s() for i in items) + "]"
    keys = draw(st.lists(_escaped_string(), max_size=3, unique_by=json.loads))
    pairs = [k + s() + ":" + s() + draw(json_text(depth + 1)) + s() for k in keys]
    return "{" + s() + ("," + s()).join(pairs) + "}"


@given(text=st.builds(lambda a, t, b: a + t + b, _space, json_text(), _space))
@example(text='{"a":[[],{}],"b":{"c":[]},"d":""}')
@example(text=' "\\ud800" ')
@example(text='"\\"\\\\\\u0022"')
@example(text="-0")
@example(text='{"</pre><script>x</script>":"</pre><script>alert(1)</script>"}')
def test_strict_json_is_shown_token_for_token(text: str) -> None:
    data = text.encode("utf-8")
    decoded = _decoded(data)
    assert decoded is not None or text.strip(" \t\n\r") == "null", text  # strict JSON
    view = payload_view(data, decoded)
    assert view.form == "json"
    assert view.more == 0
    body = shown(str(view.body))
    assert squeezed(body) == squeezed(text)
    assert view.reindented == (body != text)
    assert json.loads(body) == json.loads(text)  # the same value too


_NOT_JSON = [
    "[1,2,]",
    '{"a":1,}',
    "NaN",
    "[Infinity]",
    "-Infinity",
    "{'a': 1}",
    '{"amount": 1, "amount": 1000}',
    "\ufeff{}",
    "1e400",
    "[1e400]",
    "\x0cnull",
    "null\x0c",
    "01",
    "[.5]",
    '"tab\tinside"',
    '"unclosed',
    '["unclosed]',
    "[1] [2]",
    "{}}",
    "[[[]]",
    "nul",
    "True",
    '"\\x41"',
    '"\\u12"',
    "</pre><script>alert(1)</script>",
]


@given(text=st.sampled_from(_NOT_JSON) | st.text(alphabet='[]{}:," \\tnul0-1e.aNI', max_size=12))
def test_what_is_not_strict_json_is_shown_as_its_text(text: str) -> None:
    data = text.encode("utf-8")
    decoded = _decoded(data)
    if decoded is not None or text.strip(" \t\n\r") == "null":
        return  # strict JSON after all (the alphabet spells some)
    view = payload_view(data, decoded)
    assert view.form in ("text", "empty"), text
    assert not view.reindented
    if data:
        assert shown(str(view.body)) == text


@given(body=st.text(max_size=40), wrap=st.sampled_from(["{}", '{"p":%s}', "[%s]", "%s"]))
def test_a_view_is_escaped_html_whatever_the_payload(body: str, wrap: str) -> None:
    for text in (body, wrap.replace("%s", json.dumps(body)), "</pre><script>" + body):
        data = text.encode("utf-8")
        view = payload_view(data, _decoded(data))
        if view.form == "empty":
            continue
        rendered = shown(str(view.body))  # no tag but the marks
        assert "</pre>" not in str(view.body)
        if view.form == "json":
            assert squeezed(rendered) == squeezed(text)
        else:
            assert rendered == text


def test_a_view_of_bytes_is_a_bounded_hex_dump() -> None:
    data = bytes(range(256)) * 2_000
    view = payload_view(data, None)
    assert view.form == "bytes"
    assert len(str(view.body)) <= VIEW_LIMIT
    assert view.more > 0
    lines = str(view.body).split("\n")
    assert (len(data) - view.more) == 16 * len(lines)


@pytest.mark.parametrize(
    "text",
    [
        # Re-indented, it fits in VIEW_LIMIT characters, but not as HTML (each quote is
        # five characters escaped): the stored text is shown, cut, and the page says so.
        "[" + ",".join(['""'] * 30_000) + "]",
        "é" * 200_000,  # two bytes a character: what is left out is counted in bytes
        '{"k": "' + "€" * 100_000 + '"}',  # three bytes a character, strict JSON
        "\U0001f4b6" * 70_000,  # four bytes a character
        "<>" * 100_000,
    ],
)
def test_a_view_that_leaves_text_out_says_how_many_bytes(text: str) -> None:
    data = text.encode("utf-8")
    view = payload_view(data, _decoded(data))
    # VIEW_LIMIT is bytes of HTML: counted in characters, a view of three-byte characters
    # was three times the size the page promises.
    assert len(str(view.body).encode("utf-8")) <= VIEW_LIMIT
    body = shown(str(view.body))
    assert view.more > 0
    assert not view.reindented  # a cut view is the stored text, never a cut layout
    assert text.startswith(body)
    assert view.more == len(data) - len(body.encode("utf-8"))
