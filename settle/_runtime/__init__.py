"""The one Redis runtime under every part of settle: the core, ``settle.cursor`` and
``settle.progress`` plan :class:`Call` objects in their sans-I/O cores, and one runner
(:class:`~settle._runtime._async.AsyncRunner`, with its generated sync twin) carries them
out: EVALSHA with NOSCRIPT recovery, tenacity retries of transient errors only, ``WAIT`` for
``min_replicas``, cluster routing, and the start-up checks. Every script answers in one
shape, :class:`Reply` (``{code, detail, now_ms, ...body}``, see ``lua/prelude.lua``).

A part brings its own :class:`ScriptSet` (its Lua files and which of them write) and its own
rules; nothing else about talking to Redis lives outside this package.
"""

from settle._runtime.calls import Call, Reply, RunScript, naming, parse_reply
from settle._runtime.options import Durability
from settle._runtime.scripts import ScriptSet

__all__ = ["Call", "Durability", "Reply", "RunScript", "ScriptSet", "naming", "parse_reply"]
