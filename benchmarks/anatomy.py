"""``python -m benchmarks.anatomy``: where the server's instructions go in a replay (a
``reserve`` of a completed operation), step by step.

The replay is the script call a retried request pays for most: its goal is a read's (at most
1.5x the trivial two-command script, issue 19). This counts, on a redis-server run under
``valgrind --tool=callgrind`` (as ``python -m benchmarks.instructions`` does), the script settle
sends cut short after each step of its head (``settle/lua/reserve_head.lua``: the replay is
its first case), called with the keys and arguments of a real replay: the call with no script
at all, the helpers the script defines, the record's GET, the clock, the value unpacked, the
record checked and its reply row built, the shard check, the reply. Each step's count is
cumulative; the last line is settle's own script, whose reply the steps' last one must equal.

Every cut is sent with EVALSHA, on every server (on Redis 7+ and Valkey settle calls its
FUNCTION library, which defines the helpers once, at load: there the second step costs
nothing per call). It needs valgrind (``apt-get install valgrind``).
"""

from __future__ import annotations

import sys
from importlib import resources
from typing import Any

import redis

from benchmarks._cases import PRINCIPAL, REQUEST, RESULT
from benchmarks._report import table
from benchmarks._scripts import TRIVIAL, _path_window
from benchmarks._server import machine
from benchmarks.instructions import command, counted_server
from settle import Reserved, Settler
from settle._core.scripts import SCRIPTS

__all__ = ["STEPS", "cuts", "main", "measure"]

_READ = "HEAD_BLOB, HEAD_NOW, HEAD_US = head_read(KEYS[1])\n"
_UNPACK = "local t = head_values(pcall(cmsgpack.unpack, string.sub(HEAD_BLOB, 2)))\n"
_RECORD = "local row, state, t = head_record(KEYS[1], HEAD_BLOB, HEAD_NOW)\n"
_CLAIMED = "local claimed = head_claimed()\n"

#: Each step: its name, then the Lua run after the helpers are defined (``None``: nothing,
#: not even the helpers). Cumulative: a step runs every earlier one's work too.
STEPS: tuple[tuple[str, str | None], ...] = (
    ("the call alone: 3 keys, 10 arguments, `return 1`", None),
    ("+ the prelude's and _head.lua's helpers defined", "return 1"),
    ("+ the record's GET", "local blob = redis.pcall('GET', KEYS[1])\nreturn 1"),
    ("+ the clock (TIME)", _READ + "return 1"),
    ("+ the value unpacked (cmsgpack)", _READ + _UNPACK + "return 1"),
    ("+ the record checked, its reply row built", _READ + _RECORD + "return 1"),
    ("+ the shard's claim checked (HGET)", _READ + _RECORD + _CLAIMED + "return 1"),
    (
        "+ the reply",
        _READ + _RECORD + _CLAIMED + "return {'replay', row[7], HEAD_NOW, '', row}",
    ),
)
_WHOLE = "settle's replay (the script it sends)"


def cuts() -> dict[str, str]:
    """Each step's script: what settle's ``reserve`` script defines before its head, then
    the step's Lua; and settle's own script, last."""
    source = SCRIPTS.source("reserve")
    head = resources.files("settle").joinpath("lua", "reserve_head.lua").read_text()
    helpers = source[: source.index(head)]
    out = {name: "return 1" if lua is None else helpers + "\n" + lua for name, lua in STEPS}
    out[_WHOLE] = source
    return out


def measure(calls: int, binary: str | None = None) -> dict[str, Any]:
    """Every step's instructions per call, and the trivial script's, on one server."""
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
            keys, args = list(call.keys), list(call.args)
            rows = []
            replies = {}
            trivial = client.script_load("redis.call('TIME'); return redis.call('GET', KEYS[1])")
            for name, script in [(TRIVIAL, None), *cuts().items()]:
                if script is None:
                    sha, shape = trivial, (2, "settle-bench:{c}:op", "settle-bench:{c}:state", "x")
                else:
                    sha, shape = client.script_load(script), (len(keys), *keys, *args)
                replies[name] = client.evalsha(sha, *shape)
                window = _path_window(
                    stats,
                    "evalsha",
                    calls,
                    lambda s=sha, a=shape: [client.evalsha(s, *a) for _ in range(calls)],
                )
                rows.append({"step": name, "instructions_per_call": round(window["usec_per_call"])})
            described = machine(server)
        finally:
            settler.close()
            client.close()
    last, whole = replies[STEPS[-1][0]], replies[_WHOLE]
    # the steps cut settle's own replay: their last one replies what it does (but the clock)
    if last[:2] != [b"replay", b"completed"] or last[3:] != whole[3:]:
        raise AssertionError(f"the cut replay replied {last!r}, settle's {whole!r}")
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
        argv, "python -m benchmarks.anatomy", __doc__, (300, "calls per step"), measure, _print
    )


if __name__ == "__main__":
    sys.exit(main())
