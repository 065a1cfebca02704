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

__all__ = ["script_costs"]

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


_TRIVIAL = "redis.call('TIME'); return redis.call('GET', KEYS[1])"


def _trivial(client: redis.Redis, stats: CommandStats, path: str, n: int) -> dict[str, Any]:
    """The yardstick: what any two-command script costs on this server right now, called
    the way settle calls its own scripts."""
    key = "settle-bench:nothing"
    if path == "fcall":
        library = (
            "#!lua name=settle_bench\n"
            "redis.register_function('settle_bench_trivial', function(KEYS, ARGV) "
            f"{_TRIVIAL} end)"
        )
        client.function_load(library, replace=True)
        client.fcall("settle_bench_trivial", 1, key)
        return _path_window(
            stats, path, n, lambda: [client.fcall("settle_bench_trivial", 1, key) for _ in range(n)]
        )
    sha = client.script_load(_TRIVIAL)
    client.evalsha(sha, 1, key)
    return _path_window(stats, path, n, lambda: [client.evalsha(sha, 1, key) for _ in range(n)])


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
    done = pending[0].operation_id
    costs["reserve (replay)"] = _window(
        stats, n, lambda: [settler.reserve(done, REQUEST, principal=PRINCIPAL) for _ in range(n)]
    )
    costs["complete (absorbed duplicate)"] = _window(
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
    costs["calibration: trivial two-command script (TIME + GET)"] = _trivial(client, stats, path, n)
    live = _fresh(settler, 1)[0]
    costs["renew"] = _window(stats, n, lambda: [settler.renew(live) for _ in range(n)])
    costs["get"] = _window(stats, n, lambda: [settler.get(done) for _ in range(n)])
    return costs
