"""The core's Lua keeps a few tables twice, once as a list and once reversed as a literal
constructor (one allocation per call instead of a table grown key by key): the two must say
the same, and the same as the Python that reads what the scripts write."""

from __future__ import annotations

import re
from importlib.resources import files

from settle._core.codec import RECORD_FIELDS
from settle._core.layout import WORDS

LIB = files("settle").joinpath("lua/_lib.lua").read_text()


def _list(name: str) -> list[str]:
    found = re.search(rf"^local {name} = \{{(.*?)\}}", LIB, re.MULTILINE | re.DOTALL)
    assert found, name
    return re.findall(r"'([a-z_]+)'", found.group(1))


def _reversed_literal(name: str) -> dict[str, int]:
    found = re.search(
        rf"^\s*(?:local )?{name} = \{{([a-z_]+ = .*?)\}}", LIB, re.MULTILINE | re.DOTALL
    )
    assert found, name
    return {k: int(v) for k, v in re.findall(r"([a-z_]+) = (\d+)", found.group(1))}


def test_the_word_table_is_words_reversed_and_the_same_as_the_python_layouts() -> None:
    words = _list("WORDS")
    assert [w.encode() for w in words] == list(WORDS)
    assert _reversed_literal("WORD") == {w: i for i, w in enumerate(words, 1)}


def test_the_field_index_is_fields_reversed_and_the_same_as_the_reply_format() -> None:
    fields = _list("FIELDS")
    assert tuple(fields) == RECORD_FIELDS
    assert _reversed_literal("INDEX") == {f: i for i, f in enumerate(fields, 1)}
