"""The Lua scripts of ``settle.progress``, as two script sets of the runtime: the progress
server's (the runtime's prelude, ``lua/_lib.lua``, then the script; the two read-only index
scripts need only the prelude) and the stream server's (prelude, then the script)."""

from __future__ import annotations

from settle._runtime import ScriptSet

__all__ = ["PROGRESS", "STREAM"]

_LIB = ("_lib",)
_WRITERS = ("begin", "record", "dead_letter", "defer", "receipt", "observe", "lost")

PROGRESS = ScriptSet(
    "settle.progress",
    {
        **dict.fromkeys((*_WRITERS, "read"), _LIB),
        "scopes": (),
        "receipts": (),
    },
    writing=frozenset(_WRITERS),
    read_only=frozenset({"read", "scopes", "receipts"}),
    #: A scope's state gone at a write (``unclaimed()`` in lua/_lib.lua): the progress
    #: server lost its data, or the scope is new (the store makes it after the check).
    lost=frozenset({"unclaimed"}),
)
STREAM = ScriptSet(
    "settle.progress",
    {"stream_scope": (), "stream_settle": (), "stream_evidence": (), "stream_hold": ()},
    # stream_hold (a held delivery made fresh) writes no more than the XREADGROUP and
    # XAUTOCLAIM that hand deliveries out, which no WAIT follows: neither does it.
    writing=frozenset({"stream_scope", "stream_settle"}),
    read_only=frozenset({"stream_evidence"}),
    #: The group or the stream a delivery was read from is gone at its settlement: the
    #: stream server lost its data (or the stream was deleted), as a NOGROUP says.
    lost=frozenset({"no_group"}),
)
