"""``python -m benchmarks.anatomy``: where the server's instructions go in a replay (a
``reserve`` of a completed operation), step by step.

The replay is the script call a retried request pays for most: its goal is a read's (at most
1.5x the trivial two-command script, issue 19). This counts, on a redis-server run under
``valgrind --tool=callgrind`` (as ``python -m benchmarks.instructions`` does), the script settle
sends cut short after each step of its head (``settle/lua/reserve_head.lua``: the replay is
its first case), called with the keys and arguments of a real replay: the call with no script
at all, the helpers the script defines (the prelude's and the head files' its head uses:
``head_uses`` in settle/_core/scripts.py), the record's GET, the clock, the value unpacked, the
record checked and its reply row built, the shard check, the reply. Each step's count is
cumulative; the last line is settle's own script, whose reply the steps' last one must equal.

Every cut is sent with EVALSHA, on every server (on Redis 7+ and Valkey settle calls its
FUNCTION library, which defines the helpers once, at load: there the helpers step costs
nothing per call). It needs valgrind (``apt-get install valgrind``).
"""

from __future__ import annotations

import sys
from importlib import resources
from typing import Any

import redis

from benchmarks._cases import PRINCIPAL, REQUEST, RESULT
from benchmarks._report import table
from benchmarks._scripts import _CALIBRATIONS, PAIR_SHAPE, TRIVIAL, _path_window
from benchmarks._server import machine
from benchmarks.instructions import command, counted_server
from settle import Reserved, Settler
from settle._core.scripts import SCRIPTS

__all__ = ["STEPS", "cuts", "main", "measure"]

_READ = "HEAD_BLOB, HEAD_NOW, HEAD_US = head_read(KEYS[1])\n"
_UNPACK = "local t = head_values(pcall(cmsgpack.unpack, string.sub(HEAD_BLOB, 2)))\n"
_RECORD = "local row, state, t = head_record(KEYS[1], HEAD_BLOB, HEAD_NOW)\n"
_CLAIMED = "local claimed = head_claimed()\n"
#: Stands for the head's own text (``reserve_head.lua`` as it is) in a step.
_HEAD = "<reserve_head.lua>"

#: Each step: its name, then the Lua run after the helpers are defined (``None``: nothing,
#: not even the helpers; the first step is called without keys or arguments, every other
#: with the replay's). Cumulative: a step runs every earlier one's work too. The last runs
#: the head itself, which answers the replay: settle's own path, but for the libraries the
#: whole script defines after the head (never reached on a replay).
STEPS: tuple[tuple[str, str | None], ...] = (
    ("an empty script (`return 1`), no keys or arguments", None),
    ("+ a replay's 3 keys and 10 arguments", None),
    ("+ the prelude's and the head files' helpers defined", "return 1"),
    ("+ the record's GET", "local blob = redis.pcall('GET', KEYS[1])\nreturn 1"),
    ("+ the clock (TIME)", _READ + "return 1"),
    ("+ the value unpacked (cmsgpack)", _READ + _UNPACK + "return 1"),
    ("+ the record checked, its reply row built", _READ + _RECORD + "return 1"),
    ("+ the shard's claim checked (HGET)", _READ + _RECORD + _CLAIMED + "return 1"),
    ("+ the caller's checks and the reply: the head as it is", _HEAD),
)
_WHOLE = "settle's replay (the script it sends)"


def cuts() -> dict[str, str]:
    """Each step's script: what settle's ``reserve`` script defines before its head, then
    the step's Lua; and settle's own script, last."""
    source = SCRIPTS.source("reserve")
    head = resources.files("settle").joinpath("lua", "reserve_head.lua").read_text()
    helpers = source[: source.index(head)]
    out = {
        name: "return 1" if lua is None else helpers + "\n" + lua.replace(_HEAD, head)
        for name, lua in STEPS
    }
    out[_WHOLE] = source
    return out


def measure(calls: int, binary: str | None = None) -> dict[str, Any]:
    """Every step's instructions per call, and the trivial script's (called as
    ``benchmarks.instructions`` calls it), on one server."""
    with counted_server(binary) as (server, stats, real):
        settler = Settler.from_url(server.url, namespace="anatomy")
        client = redis.Redis.from_url(server.url)
        try:
            settler.check()
            got = settler.reserve("anatomy-1", REQUEST, principal=PRINCIPAL)
            assert isinstance(got, Reserved)
            settler.complete(got.reservation, RESULT)
            # the replay's very keys and arguments, as settle sends them
            call = settler._core.plan_reserve("anatomy-1", REQUEST, principal=PRINCIPAL)
            replay = (len(call.keys), *call.keys, *call.args)
            shapes: dict[str, tuple[Any, ...]] = {STEPS[0][0]: (0,)}
            scripts = {TRIVIAL: _CALIBRATIONS[TRIVIAL], **cuts()}
            rows, replies, inner = [], {}, {}
            for name, script in scripts.items():
                sha = client.script_load(script)
                shape = PAIR_SHAPE if name == TRIVIAL else shapes.get(name, replay)
                replies[name] = client.evalsha(sha, *shape)
                window = _path_window(
                    stats,
                    "evalsha",
                    calls,
                    lambda s=sha, a=shape: [client.evalsha(s, *a) for _ in range(calls)],
                )
                inner[name] = window["commands_inside_per_call"]
                rows.append({"step": name, "instructions_per_call": round(window["usec_per_call"])})
            described = machine(server)
        finally:
            settler.close()
            client.close()
    last = STEPS[-1][0]
    # The last cut runs settle's own head: it replies what settle's script does (but the
    # clock) and runs the same commands inside.
    if replies[last][:2] != [b"replay", b"completed"] or replies[last][3:] != replies[_WHOLE][3:]:
        raise AssertionError(f"the cut replay replied {replies[last]!r}, not settle's")
    if inner[last] != inner[_WHOLE]:
        raise AssertionError(f"the cut replay ran {inner[last]}, settle's {inner[_WHOLE]}")
    described["redis_binary"] = real
    return {"machine": described, "calls": calls, "rows": rows}


def _print(result: dict[str, Any]) -> None:
    m = result["machine"]
    print(
        f"A replay's instructions, step by step: redis-server {m['redis_server']} under "
        f"callgrind (EVALSHA), {result['calls']} calls per step\n"
    )
    rows = result["rows"]
    trivial = rows[0]["instructions_per_call"]
    body, before = [], 0
    for row in rows:
        n = row["instructions_per_call"]
        added = "" if row["step"] in (TRIVIAL, _WHOLE) or not before else f"{n - before:+,}"
        body.append([row["step"], f"{n:,}", added, f"{n / trivial:.2f}"])
        if row["step"] != TRIVIAL:
            before = n
    print(table(["step", "instructions per call", "the step", "x trivial script"], body))


def main(argv: list[str] | None = None) -> int:
    return command(
        argv, "python -m benchmarks.anatomy", __doc__, (1000, "calls per step"), measure, _print
    )


if __name__ == "__main__":
    sys.exit(main())
