"""The layers of docs/architecture.md hold: the sans-I/O cores do no I/O (they import no
Redis client), the runtime knows no part, and a part reaches Redis only through the runtime."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SETTLE = Path(__file__).resolve().parents[2] / "settle"

#: The rules of each part: no redis client, no runner, no network.
SANS_IO = [
    "_core/engine.py",
    "_core/codec.py",
    "_core/keys.py",
    "_core/reference.py",
    "cursor/_core.py",
    "cursor/_classify.py",
    "cursor/_step.py",
    "progress/_core.py",
    "progress/_step.py",
    "progress/planning.py",
    "decorator/_plan.py",
    "http/_rules.py",
]
#: Every part but the runtime itself: the modules that must not talk to Redis on their own.
PARTS = ["_core", "cursor", "progress", "decorator", "asgi", "http", "wsgi", "web", "_sessions"]
IO_MODULES = ("redis", "socket", "httpx", "urllib.request")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _is(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


@pytest.mark.parametrize("relative", SANS_IO)
def test_the_rules_do_no_io(relative: str) -> None:
    found = [
        m
        for m in _imports(SETTLE / relative)
        if any(_is(m, io) for io in IO_MODULES)
        or _is(m, "settle._runtime._async")
        or _is(m, "settle._runtime._sync")
    ]
    assert not found, f"{relative} is a sans-I/O core but imports {found}"


def test_the_runtime_knows_no_part() -> None:
    for path in (SETTLE / "_runtime").glob("*.py"):
        parts = [
            m
            for m in _imports(path)
            if any(_is(m, f"settle.{p}") for p in PARTS) or _is(m, "settle.cli")
        ]
        assert not parts, f"{path.name} of the runtime imports a part: {parts}"


@pytest.mark.parametrize(
    "part", ["_core", "_async", "_sync", "cursor", "progress", "web", "_sessions"]
)
def test_a_part_runs_scripts_only_through_the_runtime(part: str) -> None:
    for path in (SETTLE / part).rglob("*.py") if (SETTLE / part).is_dir() else []:
        text = path.read_text(encoding="utf-8")
        for call in (
            "register_script(",
            ".evalsha(",
            "script_load(",
            ".fcall(",
            "function_load(",
            '"WAIT"',
        ):
            assert call not in text, f"{path.relative_to(SETTLE)} calls {call} itself"
