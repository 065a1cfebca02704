"""Server time per call of each settle script, one script (and path) per ``INFO
commandstats`` window: the window holds only that script's calls, made the way settle makes
them on this server (FCALL of its FUNCTION library on Redis 7+ and Valkey, EVALSHA on 6.2);
the trivial yardstick script is called the same way."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import redis

from benchmarks._cases import PRINCIPAL, REQUEST, RESULT
from benchmarks._server import CommandStats
from settle import Reservation, Reserved, Settler
from settle._runtime.topology import has_functions

__all__ = ["TRIVIAL", "script_costs"]

_ids = itertools.count()


def _fresh(settler: Settler, n: int) -> list[Reservation]:
    out = []
    for _ in range(n):
        got = settler.reserve(f"script-{next(_ids)}", REQUEST, principal=PRINCIPAL)
        assert isinstance(got, Reserved)
        out.append(got.reservation)
    return out


def _load_every_script(settler: Settler) -> None:
    """Run each script once: its first EVALSHA on a server answers NOSCRIPT (a failed call
    that commandstats would count), then the script is loaded (a FUNCTION library is loaded
    by the settler's start-up)."""
    first, second, third = _fresh(settler, 3)
    settler.complete(first, RESULT)
    settler.fail(second, ValueError("declined"))
    settler.renew(third)
    settler.mark_provisional(third, reason="warm-up")
    settler.get(first.operation_id)


def _path_window(
    stats: CommandStats, path: str, calls: int, run: Callable[[], object]
) -> dict[str, Any]:
    stats.reset()
    run()
    read = stats.read()
    made = read.get(path, {"calls": 0, "usec": 0})
    if made["calls"] != calls:
        raise AssertionError(f"expected {calls} {path.upper()} calls in the window, saw {read}")
    inner = {k: round(v["calls"] / calls, 2) for k, v in sorted(read.items()) if k != path}
    return {
        "usec_per_call": round(made["usec"] / calls, 2),
        "calls": calls,
        "path": path,
        "commands_inside_per_call": inner,
    }


#: The yardstick every script's server time is compared with (benchmarks._report).
TRIVIAL = "calibration: trivial two-command script (TIME + GET)"

#: The calibration scripts: their name, then their body. Besides the yardstick, the very
#: commands settle's two write scripts of a pair run, with no rules around them (settle's
#: state HASH, a missing record read, a settled value of settle's size written): what Redis
#: itself charges for those calls, which no change to the rules can go below.
_CALIBRATIONS = {
    TRIVIAL: "redis.call('TIME'); return redis.call('GET', KEYS[1])",
    "calibration: reserve (new)'s commands, no rules": (
        "redis.call('HGET', KEYS[2], 'shards'); redis.call('TIME'); "
        "redis.call('GET', KEYS[1]); redis.call('HGET', KEYS[2], 'gen'); "
        "redis.call('HSET', KEYS[2], 'gen', '1764785000000000'); "
        "redis.call('SET', KEYS[1], ARGV[1], 'PX', '86460000'); return 1"
    ),
    "calibration: complete (accepted)'s commands, no rules": (
        "redis.call('HGET', KEYS[2], 'shards'); redis.call('TIME'); "
        "redis.call('GET', KEYS[1]); "
        "redis.call('SET', KEYS[1], ARGV[1], 'PX', '86400000'); return 1"
    ),
    "calibration: no commands, a reserve's 3 keys and 10 arguments": "return 1",
}

#: A calibration called with other keys and arguments than the pair's (``_calibrations``):
#: the empty script gets as many as settle's reserve sends, of the same sizes, so its row is
#: what the call's shape alone costs (parsing them, making each a Lua string).
_SHAPES: dict[str, tuple[int, tuple[str, ...]]] = {
    "calibration: no commands, a reserve's 3 keys and 10 arguments": (
        3,
        (
            "settle:{bench:5}:op:order-000042",
            "settle:{bench:5}:log:order-000042",
            "settle:{bench:5}:gen",
            "order-000042",
            "\0" + "f" * 32,
            "1",
            "alice",
            "30000",
            "86400000",
            "\0" + "a" * 16,
            "64",
            "16",
            "0",
        ),
    ),
}

#: A value of the size settle stores for an operation with a 40-byte result (docs/benchmarks.md,
#: "Memory per settled operation").
_VALUE = "x" * 230


#: How the yardstick and the command floors are called: their number of keys, then the keys
#: and the argument (a value of settle's size).
PAIR_SHAPE = (2, "settle-bench:{c}:op", "settle-bench:{c}:state", _VALUE)


def _calibrations(
    client: redis.Redis, stats: CommandStats, path: str, n: int
) -> dict[str, dict[str, Any]]:
    """The yardstick and the command floors, each called the way settle calls its own
    scripts on this server right now."""
    pair = (PAIR_SHAPE[0], PAIR_SHAPE[1:])
    out = {}
    if path == "fcall":
        names = {name: f"settle_bench_{i}" for i, name in enumerate(_CALIBRATIONS)}
        library = "#!lua name=settle_bench\n" + "\n".join(
            f"redis.register_function('{names[name]}', function(KEYS, ARGV) {body} end)"
            for name, body in _CALIBRATIONS.items()
        )
        client.function_load(library, replace=True)
        for name in _CALIBRATIONS:
            nkeys, args = _SHAPES.get(name, pair)
            client.fcall(names[name], nkeys, *args)
            out[name] = _path_window(
                stats,
                path,
                n,
                lambda f=names[name], k=nkeys, a=args: [client.fcall(f, k, *a) for _ in range(n)],
            )
        return out
    for name, body in _CALIBRATIONS.items():
        nkeys, args = _SHAPES.get(name, pair)
        sha = client.script_load(body)
        client.evalsha(sha, nkeys, *args)
        out[name] = _path_window(
            stats,
            path,
            n,
            lambda s=sha, k=nkeys, a=args: [client.evalsha(s, k, *a) for _ in range(n)],
        )
    return out


def script_costs(
    settler: Settler, client: redis.Redis, stats: CommandStats, n: int
) -> dict[str, dict[str, Any]]:
    """Each script on its common path, and the paths a fault takes (takeover, quarantine)."""
    costs: dict[str, dict[str, Any]] = {}
    path = "fcall" if has_functions(client.info("server")) else "evalsha"

    def _window(stats: CommandStats, calls: int, run: Callable[[], object]) -> dict[str, Any]:
        return _path_window(stats, path, calls, run)

    _load_every_script(settler)
    pending: list[Reservation] = []
    costs["reserve (new)"] = _window(stats, n, lambda: pending.extend(_fresh(settler, n)))
    costs["complete (accepted)"] = _window(
        stats, n, lambda: [settler.complete(r, RESULT) for r in pending]
    )
    # The repeat of a completion whose reply was lost: once per operation, as it happens
    # (each log: a reserve, a complete) ...
    costs["complete (absorbed duplicate)"] = _window(
        stats, n, lambda: [settler.complete(r, RESULT) for r in pending]
    )
    done = pending[0].operation_id
    costs["reserve (replay)"] = _window(
        stats, n, lambda: [settler.reserve(done, REQUEST, principal=PRINCIPAL) for _ in range(n)]
    )
    # ... and n times over on one operation, whose log each one adds to until it is full
    # (attempt_log_size): every one after that drops the oldest entry.
    costs["complete (absorbed duplicate, log at its cap)"] = _window(
        stats, n, lambda: [settler.complete(pending[0], RESULT) for _ in range(n)]
    )
    to_fail = _fresh(settler, n)
    costs["fail (accepted)"] = _window(
        stats, n, lambda: [settler.fail(r, ValueError("card declined")) for r in to_fail]
    )
    to_mark = _fresh(settler, n)
    costs["mark_provisional (accepted)"] = _window(
        stats, n, lambda: [settler.mark_provisional(r, reason="timeout") for r in to_mark]
    )
    costs["reserve (takeover of provisional)"] = _window(
        stats,
        n,
        lambda: [settler.reserve(r.operation_id, REQUEST, principal=PRINCIPAL) for r in to_mark],
    )
    costs["complete (quarantined: stale generation)"] = _window(
        stats, n, lambda: [settler.complete(r, RESULT) for r in to_mark]
    )
    costs.update(_calibrations(client, stats, path, n))
    live, settled = _fresh(settler, 2)
    costs["renew"] = _window(stats, n, lambda: [settler.renew(live) for _ in range(n)])
    # A settled operation as most are (its log: one reserve, one complete), not ``done``,
    # whose log the absorbed duplicates above filled to its cap.
    settler.complete(settled, RESULT)
    op = settled.operation_id
    costs["get"] = _window(stats, n, lambda: [settler.get(op) for _ in range(n)])
    return costs
