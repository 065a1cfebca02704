"""The cursor's Lua scripts: the runtime's prelude, ``lua/_lib.lua``, then the script's own
file (see :class:`settle._runtime.ScriptSet`)."""

from __future__ import annotations

from settle._runtime import ScriptSet

__all__ = ["SCRIPTS"]

_LIB = ("_lib",)

SCRIPTS = ScriptSet(
    "settle.cursor",
    dict.fromkeys(
        (
            "init",
            "load",
            "witness",
            "resume",
            "outcome",
            "promote",
            "reset",
            "witnesses",
            "receipts",
        ),
        _LIB,
    ),
    writing=frozenset({"init", "witness", "resume", "outcome", "promote", "reset"}),
    read_only=frozenset({"load", "witnesses", "receipts"}),
    #: Called only after ``load`` found the checkpoint: one that answers without it says the
    #: server lost the stream's keys during the step (ScriptSet.gone).
    gone=frozenset({"witness", "resume", "outcome", "promote"}),
)
