"""The console's Lua scripts (``lua/session_*.lua``), as a script set of the runtime: run
by a runner on the settler's own client, as FCALL of a FUNCTION library on Redis 7+ and
Valkey and EVALSHA on 6.2 (see :class:`settle._runtime.ScriptSet`)."""

from __future__ import annotations

from settle._runtime import ScriptSet

__all__ = ["SCRIPTS"]

SCRIPTS = ScriptSet(
    "settle.web",
    {"session_check": (), "session_start": ()},
    writing=frozenset({"session_start"}),
    read_only=frozenset({"session_check"}),
)
