"""``python -m tests.modelcheck``: explore the settlement state machine to chosen bounds.

    python -m tests.modelcheck --workers 3 --reserves 1 --depth 8
    python -m tests.modelcheck --depth 6 --replay all            # then every trace on Redis
    python -m tests.modelcheck --workers 2 --depth 5 --loss      # Redis losing data, too
    python -m tests.modelcheck --depth 7 --replay 5000 --redis-url redis://localhost:6379/0

Exit status 1 when an invariant is violated (the counterexample is printed) or when Redis
and the model disagree on a replayed trace (the trace and both answers are printed).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator

from settle.embedded import EmbeddedRedis
from tests.modelcheck.explore import Bounds, explore
from tests.modelcheck.replay import covering_traces, replay, sample


@contextlib.contextmanager
def _redis(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    with EmbeddedRedis() as server:
        yield server.url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.modelcheck", description=__doc__)
    parser.add_argument("--workers", type=int, default=3, help="workers on the operation")
    parser.add_argument("--reserves", type=int, default=1, help="new attempts per worker")
    parser.add_argument("--depth", type=int, default=6, help="steps per trace")
    parser.add_argument(
        "--retention", action="store_true", help="also let the record outlive its retention"
    )
    parser.add_argument(
        "--loss",
        action="store_true",
        help="also let Redis lose data: restart empty, lose the counter, fail over",
    )
    parser.add_argument(
        "--replay",
        default=None,
        help="replay explored traces on Redis: 'all' or a number to sample (seed 10)",
    )
    parser.add_argument("--replay-depth", type=int, default=None, help="only traces up to this")
    parser.add_argument("--redis-url", default=None, help="default: an embedded redis-server")
    args = parser.parse_args(argv)
    bounds = Bounds(
        workers=args.workers,
        reserves=args.reserves,
        depth=args.depth,
        retention=args.retention,
        loss=args.loss,
    )

    def progress(depth: int, states: int, transitions: int) -> None:
        print(f"  depth {depth}: {states} states, {transitions} transitions", flush=True)

    print(f"exploring {bounds}")
    result = explore(bounds, progress=progress)
    print(
        f"explored {result.states} states, {result.transitions} transitions, "
        f"{result.traces} distinct traces of 1..{result.depth_reached} steps "
        f"({'state space exhausted' if result.exhausted else 'depth-bounded'}) "
        f"in {result.seconds:.1f} s"
    )
    if result.counterexample is not None:
        print(result.counterexample)
        return 1
    print("all six invariants and the SPEC §2 tables held in every state")
    if args.replay is None:
        return 0
    traces = covering_traces(result, args.replay_depth)
    chosen = sample(traces, None if args.replay == "all" else int(args.replay))
    print(f"replaying {len(chosen)} of {len(traces)} covering traces on Redis")
    with _redis(args.redis_url) as url:
        report = replay(url, bounds, chosen)
    print(
        f"replayed {report.traces} traces ({report.steps} steps) in {report.seconds:.1f} s, "
        f"{len(report.divergences)} divergences"
    )
    for divergence in report.divergences:
        print(divergence)
    return 1 if report.divergences else 0


if __name__ == "__main__":
    sys.exit(main())
