"""The quarantine console's sessions in Redis: their Lua scripts (``lua/session_*.lua``), as
a script set of the runtime, run by a companion of the settler's runner on its own client
(FCALL of a FUNCTION library on Redis 7+ and Valkey, EVALSHA on 6.2; see
:class:`settle._runtime.ScriptSet`).

Apart from ``settle.web`` (which needs the ``web`` extra to import) so that ``settle
doctor`` checks and loads them with settle's other scripts wherever the CLI is installed.
"""

from __future__ import annotations

from settle._runtime import ScriptSet

__all__ = ["SCRIPTS"]

SCRIPTS = ScriptSet(
    "settle._sessions",
    {"session_check": (), "session_start": (), "session_end": (), "epoch_renew": ()},
    #: Followed by WAIT with the settler's min_replicas: a failover must not lose a sign-in,
    #: nor revive a session a sign-out or end_sessions ended.
    writing=frozenset({"session_start", "session_end", "epoch_renew"}),
    read_only=frozenset({"session_check"}),
)
