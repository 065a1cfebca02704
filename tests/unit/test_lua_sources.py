"""The core's Lua keeps a few tables twice, once as a list and once reversed as a literal
constructor (one allocation per call instead of a table grown key by key): the two must say
the same, and the same as the Python that reads what the scripts write. The write heads,
which run before those tables exist, write words as literal indexes: each must be its
word's."""

from __future__ import annotations

import re
from dataclasses import replace
from importlib.resources import files

import pytest

from settle._core.codec import RECORD_FIELDS
from settle._core.layout import WORDS
from settle._core.scripts import SCRIPTS
from settle._sessions import SCRIPTS as SESSIONS
from settle.cursor._scripts import SCRIPTS as CURSOR
from settle.progress._scripts import PROGRESS, STREAM

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


def _lua(name: str) -> str:
    return files("settle").joinpath(f"lua/{name}.lua").read_text()


def _index(word: str) -> int:
    return WORDS.index(word.encode()) + 1


def test_the_write_heads_store_the_words_they_name() -> None:
    """The write heads pack words as their WORDS index literally (they run before _lib.lua's
    table exists): each index must be the word the head means."""
    for script, action, state in (
        ("complete", "complete", "completed"),
        ("fail", "fail", "failed"),
        ("mark_provisional", "mark_provisional", "provisional"),
    ):
        found = re.search(r"head_settle\((\d+), (\d+)\)", _lua(f"{script}_head"))
        assert found, script
        assert (int(found.group(1)), int(found.group(2))) == (_index(action), _index(state))
    entry = re.search(r"cmsgpack\.pack\(nil, nil, (\d+), (\d+), (\d+), 0\)", _lua("reserve_head"))
    assert entry
    assert [int(g) for g in entry.groups()] == [
        _index("reserve"),
        _index("reserved"),
        _index("new"),
    ]
    record = re.search(r"tonumber\(gen\), 1, (\d+), 1,", _lua("reserve_head"))
    assert record
    assert int(record.group(1)) == _index("pending")
    # the takeover: its entry, its two details (word and index), the record's state
    taken = _lua("reserve_head")
    entry = re.search(r"cmsgpack\.pack\(new_aid, new_gen, (\d+), (\d+), detail,", taken)
    assert entry
    assert [int(g) for g in entry.groups()] == [_index("reserve"), _index("reserved")]
    details = re.findall(r"detail, word = (\d+), '([a-z_]+)'", taken)
    assert sorted(details) == sorted(
        [
            (str(_index("provisional")), "provisional"),
            (str(_index("lease_expired")), "lease_expired"),
        ]
    )
    state = re.search(r"cmsgpack\.pack\(t\[1\], t\[2\], t\[3\], g, t\[5\] \+ 1, (\d+),", taken)
    assert state
    assert int(state.group(1)) == _index("pending")
    head = "\n".join(_lua(lib) for lib in SCRIPTS.head_libs)
    # head_settle's two entries: a duplicate absorbed (its branch comes first), then accepted
    verdicts = re.findall(r"cmsgpack\.pack\(aid, gen, action, (\d+), ''", head)
    highest = re.search(r"x <= (\d+)\n", head)
    assert highest
    assert [int(v) for v in verdicts] == [_index("absorbed"), _index("accepted")]
    assert int(highest.group(1)) == len(WORDS)
    states = re.search(r"^local HEAD_STATES = \{(.*?)\}", head, re.MULTILINE)
    assert states
    assert re.findall(r"'([a-z_]+)'", states.group(1)) == [w.decode() for w in WORDS[:4]]
    # the words a mark_provisional head leaves to the rules as a reason (save() stores
    # them as their index): every word, between bars
    words = re.search(r"if string\.find\(((?:'[|a-z_]*'(?:\s*\.\.\s*)?)+), '\|' \.\. reason", head)
    assert words
    text = "".join(re.findall(r"'([|a-z_]*)'", words.group(1)))
    assert text == "|" + "|".join(w.decode() for w in WORDS) + "|"


def _functions(lua: str) -> dict[str, str]:
    """The ``local function``s in lua, each with its text."""
    return dict(re.findall(r"^local function ([a-z_]+)\((.*?^end)$", lua, re.MULTILINE | re.DOTALL))


def _calls(lua: str, names: set[str]) -> set[str]:
    return {f for f in names if re.search(rf"\b{f}\(", lua)}


def test_each_heads_script_defines_the_head_helpers_it_calls_and_no_other() -> None:
    """On Redis 6.2 every EVALSHA defines each helper its script holds again (a closure, its
    upvalues found, later collected): a head's script defines the head helpers that head
    calls, directly or through another, and none it never calls."""
    helpers: dict[str, str] = {}
    for lib in SCRIPTS.head_libs:
        helpers.update(_functions(_lua(lib)))
    every = set(helpers)
    for name, head in SCRIPTS.heads.items():
        source = SCRIPTS.source(name)
        defined = set(_functions(source[: source.index(_lua(head))])) & every
        called = _calls(_lua(head), every)
        while more := set().union(*(_calls(helpers[f], every) for f in called)) - called:
            called |= more
        assert defined == called, (name, sorted(defined - called), sorted(called - defined))


def test_head_uses_names_only_heads_and_head_libraries() -> None:
    """A head_uses entry for a script without a head, or naming a library that is not a
    head library, is refused when the set is made (it would define nothing, or a library
    twice)."""
    with pytest.raises(ValueError, match=r"without a head: \['attempts'\]"):
        replace(SCRIPTS, head_uses={"attempts": ("_head",)})
    with pytest.raises(ValueError, match=r"not in head_libs: \['_lib'\]"):
        replace(SCRIPTS, head_uses={"get": ("_head", "_lib")})
    assert replace(SCRIPTS).sources == SCRIPTS.sources


#: What a script may read that it does not define: the globals Redis (6.2, 7) and Valkey give
#: a script (a name read that is none of these and no local defined before it raises
#: "Script attempted to access nonexistent global variable" on 6.2, when that line runs).
_GLOBALS = {
    *("redis", "cmsgpack", "cjson", "bit", "struct", "string", "table", "math", "KEYS", "ARGV"),
    *("tonumber", "tostring", "type", "pcall", "select", "unpack", "error", "assert"),
    *("ipairs", "pairs", "next", "rawget", "rawset", "setmetatable", "getmetatable", "xpcall"),
}
_KEYWORDS = {
    *("and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in"),
    *("local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while"),
}
_TOKEN = re.compile(
    r"--\[(=*)\[.*?\]\1\]|--[^\n]*|\[(=*)\[.*?\]\2\]|'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\""
    r"|(?P<name>[A-Za-z_]\w*)|(?P<op>\.\.\.|\.\.|==|~=|<=|>=|\S)",
    re.DOTALL,
)


def _free_names(lua: str) -> set[str]:
    """The names ``lua`` reads or assigns before any local of that name is defined in it
    (its text read in order: a local of an earlier block counts, which is enough for the
    helpers, each defined once at the top level of its file). Comments and strings are
    skipped; a field (``t.x``, ``t:x``) and a constructor's key (``{x = 1}``) are not names."""
    tokens = [(m.lastgroup, m.group(m.lastgroup)) for m in _TOKEN.finditer(lua) if m.lastgroup]
    defined: set[str] = set()
    free: set[str] = set()
    declaring = False  # after `local`, `for` or a function's `(`: names being defined
    params = False  # after `function`, until its `(`
    for i, (kind, text) in enumerate(tokens):
        before = tokens[i - 1][1] if i else ""
        after = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if kind == "op":
            if text in ("=", ")") or text == "(":
                declaring = text == "(" and params
                params = False
            continue
        if text in ("local", "for"):
            declaring = True
            continue
        if text == "function":
            params = True
        if text == "in":
            declaring = False
        if text in _KEYWORDS:
            continue
        if declaring or (before == "function" and tokens[i - 2][1] == "local"):
            defined.add(text)
            declaring = after == ","  # `local x` then a statement: that one reads names
            continue
        if before in (".", ":") or (before in ("{", ",", ";") and after == "="):
            continue
        if text not in defined:
            free.add(text)
    return free - _GLOBALS


def test_every_script_reads_only_names_it_defines_or_redis_gives() -> None:
    """Each EVAL script (what Redis 6.2 runs by EVALSHA) defines every helper and constant
    it can reach on any path before it reads it: a head's script defines only the head
    libraries its ``head_uses`` names, and the whole script behind the head, an error path
    or a corrupt record's may call one the head does not (on Redis 7 and Valkey the FUNCTION
    library defines all of them, so only 6.2 would fail, and only on that line)."""
    for scripts in (SCRIPTS, CURSOR, PROGRESS, STREAM, SESSIONS):
        for name in scripts:
            assert _free_names(scripts.source(name)) == set(), (scripts.package, name)


def test_no_script_defines_a_helper_twice() -> None:
    """A library that a script's head and its rules both use (reserve's ``_head_gen``) is
    defined once, with the head's: on Redis 6.2 each definition is a closure made again on
    every EVALSHA."""
    for scripts in (SCRIPTS, CURSOR, PROGRESS, STREAM, SESSIONS):
        for name in scripts:
            found = re.findall(r"^local function ([A-Za-z_]\w*)", scripts.source(name), re.M)
            assert len(found) == len(set(found)), (scripts.package, name)
