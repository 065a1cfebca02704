"""The Lua sources of ``settle.progress``: progress scripts get ``lua/_lib.lua`` prepended;
the two stream-side scripts stand alone (they run on the stream's server)."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

__all__ = ["PROGRESS_SCRIPTS", "STANDALONE", "STREAM_SCRIPTS", "source"]

PROGRESS_SCRIPTS = (
    "begin",
    "record",
    "dead_letter",
    "defer",
    "receipt",
    "observe",
    "read",
)
STANDALONE = ("scopes", "receipts")
STREAM_SCRIPTS = ("stream_scope", "stream_settle")


def _read(name: str) -> str:
    return (files("settle.progress") / "lua" / f"{name}.lua").read_text(encoding="utf-8")


@cache
def source(name: str) -> str:
    if name in STREAM_SCRIPTS or name in STANDALONE:
        return _read(name)
    if name not in PROGRESS_SCRIPTS:
        raise KeyError(name)
    return _read("_lib") + "\n" + _read(name)
