"""``python -m benchmarks.profile``: where the client's time goes in reserve + complete.

Starts its own redis-server, then profiles (``cProfile``) a loop of ``reserve`` of a fresh
operation then ``complete``, sync, one connection, as ``benchmarks.speed`` runs it, and
prints each part's share of the profiled time (own time of its functions, so the shares add
up to 100%) beside the same loop of the raw floor (``SET NX`` + ``SET``): waiting on the
socket (the server's work and the loopback round trips), redis-py, settle's runtime, its
rules (plan and decode), the fingerprint, pydantic, structlog, OpenTelemetry and the rest.
A profiler slows Python code more than the socket wait, so the shares overstate the Python
parts a little; the order is what to read.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections import defaultdict

import redis

from benchmarks._cases import PRINCIPAL, REQUEST, RESULT
from benchmarks._report import table
from benchmarks._server import quiet_logs, redis_server
from settle import Settler

#: A function's part, by the first fragment of its file path that matches (in this order).
PARTS: tuple[tuple[str, str], ...] = (
    ("socket wait (server + loopback)", "method 'recv_into'"),
    ("socket send", "method 'sendall'"),
    ("settle: runtime (settle/_runtime)", "settle/_runtime/"),
    ("settle: fingerprint", "settle/fingerprint.py"),
    ("settle: rules (plan, decode)", "settle/_core/"),
    ("settle: models", "settle/models.py"),
    ("settle: shells and logging", "settle/"),
    ("redis-py + hiredis", "redis/"),
    ("pydantic", "pydantic"),
    ("structlog", "structlog"),
    ("rfc8785 / json / hashlib", "rfc8785"),
    ("OpenTelemetry", "opentelemetry"),
)


def _part(where: str) -> str:
    for name, fragment in PARTS:
        if fragment in where:
            return name
    if "hiredis" in where or "built-in method hiredis" in where:
        return "redis-py + hiredis"
    return "other (stdlib, builtins)"


def _shares(stats: pstats.Stats) -> dict[str, float]:
    own: dict[str, float] = defaultdict(float)
    raw = stats.stats  # type: ignore[attr-defined]
    for (path, _line, func), (_cc, _nc, tottime, _ct, _callers) in raw.items():
        where = func if path == "~" else f"{path}:{func}"
        own[_part(where)] += tottime
    total = sum(own.values()) or 1.0
    return {k: v / total for k, v in sorted(own.items(), key=lambda kv: -kv[1])}


def profile(url: str, pairs: int) -> tuple[dict[str, float], dict[str, float], float, float]:
    """Shares of settle's loop and of the raw floor's, and each one's wall µs per op."""
    settler = Settler.from_url(url, namespace=f"profile-{time.monotonic_ns()}")
    raw = redis.Redis.from_url(url)
    n = iter(range(10**9))

    def settle_pair() -> None:
        r = settler.reserve(f"p-{next(n)}", REQUEST, principal=PRINCIPAL)
        settler.complete(r.reservation, RESULT)  # type: ignore[union-attr]

    def floor_pair() -> None:
        key = f"profile:floor:{next(n)}"
        raw.set(key, "pending", nx=True, px=30_000)
        raw.set(key, "receipt", px=86_400_000)

    out = []
    for pair in (settle_pair, floor_pair):
        for _ in range(300):
            pair()
        profiler = cProfile.Profile()
        start = time.perf_counter()
        profiler.enable()
        for _ in range(pairs):
            pair()
        profiler.disable()
        wall_us = (time.perf_counter() - start) / pairs * 1e6
        out.append((_shares(pstats.Stats(profiler)), wall_us))
    settler.close()
    raw.close()
    (settle_shares, settle_us), (floor_shares, floor_us) = out
    return settle_shares, floor_shares, settle_us, floor_us


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    parser.add_argument("--pairs", type=int, default=3000)
    args = parser.parse_args(argv)
    quiet_logs()
    with redis_server() as server:
        settle_shares, floor_shares, settle_us, floor_us = profile(server.url, args.pairs)
    parts = list(dict.fromkeys([*settle_shares, *floor_shares]))
    print(
        f"reserve + complete vs the raw floor, sync, one connection, {args.pairs} ops each, "
        f"under cProfile: {settle_us:.0f} vs {floor_us:.0f} µs per op (profiled)\n"
    )
    print(
        table(
            ["part", "settle reserve + complete", "raw floor (SET NX + SET)"],
            [
                [
                    p,
                    f"{settle_shares.get(p, 0):.1%} ({settle_shares.get(p, 0) * settle_us:.0f} µs)",
                    f"{floor_shares.get(p, 0):.1%} ({floor_shares.get(p, 0) * floor_us:.0f} µs)",
                ]
                for p in parts
            ],
        )
    )


if __name__ == "__main__":
    main()
