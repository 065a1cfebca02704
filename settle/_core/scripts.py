"""The core's Lua scripts: each is the runtime's prelude, ``lua/_lib.lua`` (+ ``_settle.lua``
for the settlement scripts), then its own file (see :class:`settle._runtime.ScriptSet`)."""

from __future__ import annotations

from settle._runtime import ScriptSet

__all__ = ["SCRIPTS", "SCRIPT_NAMES", "WRITING_SCRIPTS", "source"]

_LIB = ("_lib",)
_SETTLE = ("_lib", "_settle")
#: reserve.lua issues generations with ``next_generation``, which its head uses too.
_RESERVE = ("_head_gen", "_lib")

SCRIPTS = ScriptSet(
    "settle",
    {
        "reserve": _RESERVE,
        "complete": _SETTLE,
        "fail": _SETTLE,
        "mark_provisional": _SETTLE,
        "renew": _LIB,
        "get": _LIB,
        "get_many": _LIB,
        "attempts": _LIB,
        "quarantine_read": _LIB,
        "quarantine_resolve": _LIB,
        "quarantine_trim": _LIB,
        "namespace": _LIB,
        "claim": _LIB,
    },
    #: Scripts that may write: with ``min_replicas`` each is followed by WAIT.
    writing=frozenset(
        {
            "reserve",
            "complete",
            "fail",
            "mark_provisional",
            "renew",
            "quarantine_resolve",
            "quarantine_trim",
            "namespace",
            # Not "claim": a claim needs no WAIT. One lost in a failover reads as
            # 'unclaimed' on the next write, which checks the metadata and claims again; and
            # the next WAITed write on that server covers it anyway. Reads keep working on a
            # settler started while its replica is down.
        }
    ),
    #: Scripts that never write (``no-writes`` functions on Redis 7+ and Valkey).
    read_only=frozenset({"get", "get_many", "attempts", "quarantine_read"}),
    #: Fast paths for the common calls, run before ``_lib`` is defined (``lua/_head.lua``).
    heads={
        "get": "get_head",
        "reserve": "reserve_head",
        "complete": "complete_head",
        "fail": "fail_head",
        "mark_provisional": "mark_provisional_head",
        "renew": "renew_head",
    },
    head_libs=("_head", "_head_write", "_head_gen", "_head_settle"),
    #: What each head calls (lua/_head.lua): on Redis 6.2 every EVALSHA defines every helper
    #: of its script again, so a head's script defines only these before the head.
    head_uses={
        "get": ("_head",),
        "reserve": ("_head", "_head_write", "_head_gen"),
        "renew": ("_head", "_head_write"),
        "complete": ("_head", "_head_write", "_head_settle"),
        "fail": ("_head", "_head_write", "_head_settle"),
        "mark_provisional": ("_head", "_head_write", "_head_settle"),
    },
)
SCRIPT_NAMES = SCRIPTS.names
WRITING_SCRIPTS = SCRIPTS.writing
source = SCRIPTS.source
