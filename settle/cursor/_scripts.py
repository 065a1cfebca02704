"""The cursor Lua sources, each ``lua/_lib.lua`` followed by the script's own file."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

__all__ = ["SCRIPT_NAMES", "source"]

SCRIPT_NAMES = ("init", "load", "witness", "outcome", "promote", "reset", "witnesses")


def _read(name: str) -> str:
    return (files("settle.cursor") / "lua" / f"{name}.lua").read_text(encoding="utf-8")


@cache
def source(name: str) -> str:
    if name not in SCRIPT_NAMES:
        raise KeyError(name)
    return _read("_lib") + "\n" + _read(name)
