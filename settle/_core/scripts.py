"""The Lua sources, assembled once: each script is ``_lib.lua`` (+ ``_settle.lua`` for the
settlement scripts) followed by its own file. Redis has no ``require``; this is it."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

__all__ = ["SCRIPT_NAMES", "WRITING_SCRIPTS", "source"]

_SETTLEMENT = frozenset({"complete", "fail", "mark_provisional"})
SCRIPT_NAMES = (
    "reserve",
    "complete",
    "fail",
    "mark_provisional",
    "renew",
    "get",
    "attempts",
    "quarantine_read",
    "quarantine_resolve",
    "namespace",
)
#: Scripts that may write: with ``min_replicas`` each is followed by WAIT.
WRITING_SCRIPTS = frozenset(SCRIPT_NAMES) - {"get", "attempts", "quarantine_read"}


def _read(name: str) -> str:
    return (files("settle") / "lua" / f"{name}.lua").read_text(encoding="utf-8")


@cache
def source(name: str) -> str:
    if name not in SCRIPT_NAMES:
        raise KeyError(name)
    parts = [_read("_lib")]
    if name in _SETTLEMENT:
        parts.append(_read("_settle"))
    parts.append(_read(name))
    return "\n".join(parts)
