"""Every rule of the state machine has one id, and the four places that state it agree.

``docs/concepts.md`` ("Rules") lists each id once, in a table. The Lua scripts mark the branch
that implements a rule with ``-- rule: S4``; the reference model (``settle/_core/reference.py``)
and the model checker's oracle (``tests/modelcheck/spec.py``) with ``# rule: S4``. These tests
check that the docs, the Lua, the reference model and the oracle carry exactly the same ids, and
that each mark sits in code that can produce the rule's outcome: a settlement rule in the
settlement script, not in ``reserve.lua``.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "concepts.md"
LUA = ROOT / "settle" / "lua"
REFERENCE = ROOT / "settle" / "_core" / "reference.py"
ORACLE = ROOT / "tests" / "modelcheck" / "spec.py"

# 'rule: S8, S10, S11' after a comment marker; what follows the ids is free text.
_IDS = re.compile(r"rule: ([A-Z][0-9]+(?:, [A-Z][0-9]+)*)")
_ROW = re.compile(r"^\| ([A-Z][0-9]+) \|", re.MULTILINE)


@dataclass(frozen=True)
class Home:
    """Where the rules of one family are decided, in each of the three code places."""

    what: str
    lua: tuple[str, str | None]  # (script file, enclosing Lua function; None: the top level)
    reference: str  # the function of settle/_core/reference.py
    oracle: str  # the function of tests/modelcheck/spec.py


HOMES = {
    "L": Home("lease expiry", ("_lib.lua", "effective_state"), "effective_state", "effective"),
    "R": Home("reserve", ("reserve.lua", None), "reserve", "expect_reserve"),
    "S": Home("settlement", ("_settle.lua", "settle"), "settle", "expect_settle"),
    "N": Home("renew", ("renew.lua", None), "renew", "expect_renew"),
}


@dataclass(frozen=True)
class Mark:
    rule: str
    path: Path
    line: int
    function: str | None  # the innermost enclosing function; None at a script's top level

    def __str__(self) -> str:
        where = f"{self.function}()" if self.function else "the top level"
        return f"{self.path.relative_to(ROOT)}:{self.line} (in {where})"


def doc_ids(text: str) -> list[str]:
    """The ids of the "Rules" section's tables, in order."""
    start = text.index("\n## Rules\n")
    end = text.find("\n## ", start + 1)
    return _ROW.findall(text[start : end if end != -1 else len(text)])


def lua_marks(path: Path) -> list[Mark]:
    """The '-- rule:' marks of one Lua file, with the top-level function each sits in."""
    marks: list[Mark] = []
    function: str | None = None
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if found := re.match(r"local function (\w+)\(", line):
            function = found[1]
        elif line.rstrip() == "end":
            function = None
        _, dashes, comment = line.partition("--")
        if dashes and (ids := _IDS.search(comment)):
            marks += [Mark(rule, path, n, function) for rule in ids[1].split(", ")]
    return marks


def python_marks(path: Path) -> list[Mark]:
    """The '# rule:' comments of one Python file, with the innermost function each sits in."""
    source = path.read_text(encoding="utf-8")
    spans = [
        (node.lineno, node.end_lineno or node.lineno, node.name)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    marks: list[Mark] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and (ids := _IDS.search(tok.string)):
            line = tok.start[0]
            inside = [s for s in spans if s[0] <= line <= s[1]]
            function = max(inside)[2] if inside else None
            marks += [Mark(rule, path, line, function) for rule in ids[1].split(", ")]
    return marks


def places() -> dict[str, list[Mark]]:
    return {
        "the Lua (settle/lua/*.lua)": [m for p in sorted(LUA.glob("*.lua")) for m in lua_marks(p)],
        "the reference model (settle/_core/reference.py)": python_marks(REFERENCE),
        "the model checker's oracle (tests/modelcheck/spec.py)": python_marks(ORACLE),
    }


def home_of(mark: Mark, place: str) -> str | None:
    """Where the mark's rule should be decided in this place, or None when it is there."""
    home = HOMES[mark.rule[0]]
    if place.startswith("the Lua"):
        script, function = home.lua
        if (mark.path.name, mark.function) == (script, function):
            return None
        return f"{script} ({f'in {function}()' if function else 'at the top level'})"
    wanted = home.reference if place.startswith("the reference") else home.oracle
    return None if mark.function == wanted else f"{wanted}()"


def test_the_docs_list_each_rule_once() -> None:
    ids = doc_ids(DOC.read_text(encoding="utf-8"))
    assert ids, "docs/concepts.md has no '## Rules' tables with '| <id> |' rows"
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    assert not repeated, f"docs/concepts.md lists these rule ids more than once: {repeated}"
    unknown = [i for i in ids if i[0] not in HOMES]
    assert not unknown, f"docs/concepts.md has ids of no known family {sorted(HOMES)}: {unknown}"
    for family in HOMES:
        assert any(i.startswith(family) for i in ids), f"no {family} rules in docs/concepts.md"


@pytest.mark.parametrize("place", list(places()))
def test_each_place_carries_exactly_the_ids_of_the_docs(place: str) -> None:
    documented = set(doc_ids(DOC.read_text(encoding="utf-8")))
    marks = places()[place]
    marked = {m.rule for m in marks}
    problems = [
        f"{rule} is in docs/concepts.md but marked nowhere in {place}"
        for rule in sorted(documented - marked)
    ] + [
        f"{m.rule} is marked at {m} but is not in the docs/concepts.md 'Rules' tables"
        for m in marks
        if m.rule not in documented
    ]
    assert not problems, "rule ids disagree:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("place", list(places()))
def test_each_mark_sits_where_its_outcome_is_decided(place: str) -> None:
    problems = [
        f"{m.rule} ({HOMES[m.rule[0]].what}) is marked at {m}; it is decided in {wanted}"
        for m in places()[place]
        if m.rule[0] in HOMES and (wanted := home_of(m, place)) is not None
    ]
    assert not problems, "rule marks out of place:\n  " + "\n  ".join(problems)


def test_marks_elsewhere_in_the_package_name_documented_rules() -> None:
    """A rule marked anywhere else in settle/ (the decoder, say) must be a documented one."""
    documented = set(doc_ids(DOC.read_text(encoding="utf-8")))
    stray = [
        f"{m.rule} at {m}"
        for path in sorted((ROOT / "settle").rglob("*.py"))
        if path != REFERENCE
        for m in python_marks(path)
        if m.rule not in documented
    ]
    assert not stray, "marks of rules that docs/concepts.md lacks:\n  " + "\n  ".join(stray)
