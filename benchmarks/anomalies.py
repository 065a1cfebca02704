"""``python -m benchmarks.anomalies``: the same faults against settle's ``@operation`` and
against the peer (Powertools ``idempotent_function`` on Redis), on one redis-server.

Each scenario is one operation (one charge of one order) that should have one effect. A
downstream ledger (a Redis list) counts every effect the function performs; the provider
behind it has no idempotency key of its own, so every re-execution is a duplicate effect.
After every call the scenario reads what the library's store holds as the committed result:
a committed result replaced by another is *overwritten*; one that disappears is *lost*.

The deployment rows (``benchmarks._deployment``) break the store's Redis instead: an evicting
policy, a restart without persistence, a Sentinel failover with the replica behind.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from benchmarks._contenders import Peer, Settle, order
from benchmarks._deployment import DEPLOYMENT_SCENARIOS
from benchmarks._outcomes import describe, outcome
from benchmarks._report import table
from benchmarks._server import machine, quiet_logs, redis_server

DEFAULT_JSON = Path(__file__).parent / "results" / "anomalies.json"
ROOT = Path(__file__).resolve().parent.parent
Contender = Settle | Peer


@dataclass
class Env:
    url: str
    lease: float
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    downstream: redis.Redis = field(init=False)

    def __post_init__(self) -> None:
        self.downstream = redis.Redis.from_url(self.url)


@dataclass
class Observation:
    """What the callers saw, in order, and the store's committed result after each call."""

    effects_key: str
    calls: list[tuple[str, str]] = field(default_factory=list)
    snapshots: list[dict[str, Any] | None] = field(default_factory=list)


def _observe(obs: Observation, who: str, seen: str, contender: Contender, oid: str) -> None:
    obs.calls.append((who, seen))
    obs.snapshots.append(contender.stored(oid))


def charger(
    env: Env, effects: str, by: str, *, work: float = 0.0, fail_first: bool = False
) -> Callable[..., dict[str, Any]]:
    def body(order: dict[str, Any]) -> dict[str, Any]:
        n = env.downstream.rpush(effects, by)
        if work:
            time.sleep(work)
        if fail_first and n == 1:
            raise TimeoutError("read timed out after the provider charged")
        return {"charge_id": f"ch_{n}", "by": by, "order_id": order["order_id"]}

    return body


# -- scenarios ---------------------------------------------------------------------------


def _wait_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            proc.kill()
            raise TimeoutError("the worker did not report its charge in time")
    return proc.stdout.readline().strip()


def late_worker(contender: Contender, env: Env, scope: str, *, then: str) -> Observation:
    """Worker A charges, then stalls (SIGSTOP: a GC pause, a frozen VM) past its lease;
    B retries the operation; A wakes up and reports ``then`` (success or failure) late;
    later the caller's retry C asks again."""
    oid = f"late-{then}-{env.run}"
    obs = Observation(f"effects:{scope}")
    env_vars = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [contender.name, env.url, scope, oid, str(env.lease), obs.effects_key]
    proc = subprocess.Popen(  # our own worker module, with our own arguments
        [sys.executable, "-m", "benchmarks._worker", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env_vars,
    )
    try:
        if _wait_line(proc, 60) != "charged":
            raise RuntimeError("the worker failed before its charge")
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(env.lease * 2.5)
        b = contender.function(charger(env, obs.effects_key, "B"), lease=env.lease, wait=0)
        _observe(obs, "B", outcome(lambda: b(order=order(oid))), contender, oid)
        os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate(f"{then}\n", timeout=60)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
    _observe(obs, "A", json.loads(out.strip().splitlines()[-1])["saw"], contender, oid)
    c = contender.function(charger(env, obs.effects_key, "C"), lease=env.lease, wait=0)
    _observe(obs, "retry", outcome(lambda: c(order=order(oid))), contender, oid)
    return obs


def timeout_after_success(contender: Contender, env: Env, scope: str) -> Observation:
    """The provider charges, then the caller's read times out (the function raises
    TimeoutError). A caller that gets the error retries once; then one more call."""
    oid = f"timeout-{env.run}"
    obs = Observation(f"effects:{scope}")
    fn = contender.function(
        charger(env, obs.effects_key, "A", fail_first=True), lease=env.lease, wait=0
    )
    seen = outcome(lambda: fn(order=order(oid)))
    _observe(obs, "A", seen, contender, oid)
    if not seen.startswith("ch_"):
        _observe(obs, "A's retry", outcome(lambda: fn(order=order(oid))), contender, oid)
    _observe(obs, "later call", outcome(lambda: fn(order=order(oid))), contender, oid)
    return obs


def takeover_while_running(contender: Contender, env: Env, scope: str) -> Observation:
    """A is alive and working for three leases; B retries after 1.6 leases."""
    oid = f"takeover-{env.run}"
    obs = Observation(f"effects:{scope}")
    a = contender.function(
        charger(env, obs.effects_key, "A", work=env.lease * 3),
        lease=env.lease,
        wait=env.lease * 8,
    )
    b = contender.function(charger(env, obs.effects_key, "B"), lease=env.lease, wait=env.lease * 8)
    seen_a: list[str] = []
    worker = threading.Thread(target=lambda: seen_a.append(outcome(lambda: a(order=order(oid)))))
    worker.start()
    time.sleep(env.lease * 1.6)
    _observe(obs, "B", outcome(lambda: b(order=order(oid))), contender, oid)
    worker.join()
    _observe(obs, "A", seen_a[0], contender, oid)
    _observe(obs, "later call", outcome(lambda: b(order=order(oid))), contender, oid)
    return obs


def changed_payload(contender: Contender, env: Env, scope: str) -> Observation:
    """The same order id sent again with another amount."""
    oid = f"payload-{env.run}"
    obs = Observation(f"effects:{scope}")
    fn = contender.function(charger(env, obs.effects_key, "A"), lease=env.lease, wait=0)
    _observe(obs, "amount 1250", outcome(lambda: fn(order=order(oid))), contender, oid)
    seen = outcome(lambda: fn(order=order(oid, amount=9999)))
    _observe(obs, "amount 9999", seen, contender, oid)
    return obs


def identical_retry(contender: Contender, env: Env, scope: str) -> Observation:
    """An identical retry of a completed call (the peer with payload validation on)."""
    oid = f"identical-{env.run}"
    obs = Observation(f"effects:{scope}")
    fn = contender.function(charger(env, obs.effects_key, "A"), lease=env.lease, wait=0)
    _observe(obs, "first", outcome(lambda: fn(order=order(oid))), contender, oid)
    _observe(obs, "identical retry", outcome(lambda: fn(order=order(oid))), contender, oid)
    return obs


def other_principal(contender: Contender, env: Env, scope: str) -> Observation:
    """Another tenant sends the same order id (ids are not secret: they leak, or collide)."""
    oid = f"principal-{env.run}"
    obs = Observation(f"effects:{scope}")
    fn = contender.function(charger(env, obs.effects_key, "acme"), lease=env.lease, wait=0)
    seen = outcome(lambda: fn(order=order(oid), tenant="tenant:acme"))
    _observe(obs, "tenant:acme", seen, contender, oid)
    seen = outcome(lambda: fn(order=order(oid), tenant="tenant:globex"))
    _observe(obs, "tenant:globex", seen, contender, oid)
    return obs


def async_function(contender: Contender, env: Env, scope: str) -> Observation:
    """An ``async def`` charge, called, then called again."""
    oid = f"async-{env.run}"
    obs = Observation(f"effects:{scope}")

    async def body(order: dict[str, Any]) -> dict[str, Any]:
        n = env.downstream.rpush(obs.effects_key, "A")
        await asyncio.sleep(0)
        return {"charge_id": f"ch_{n}", "by": "A", "order_id": order["order_id"]}

    fn = contender.async_function(body, lease=env.lease)

    async def call() -> object:
        got = fn(order=order(oid))
        while inspect.isawaitable(got):
            got = await got
        return got

    async def both() -> list[str]:
        seen = []
        for _ in range(2):
            try:
                seen.append(describe(await call()))
            except Exception as exc:
                seen.append(type(exc).__name__)
        return seen

    for who, seen in zip(("first", "again"), asyncio.run(both()), strict=True):
        _observe(obs, who, seen, contender, oid)
    return obs


Scenario = Callable[[Contender, Env, str], Observation]
SCENARIOS: list[tuple[str, str, Scenario]] = [
    (
        "late_success",
        "late success from a worker that lost its lease",
        lambda c, e, s: late_worker(c, e, s, then="ok"),
    ),
    (
        "late_failure",
        "late failure from a worker that lost its lease",
        lambda c, e, s: late_worker(c, e, s, then="fail"),
    ),
    ("timeout", "timeout after the downstream succeeded", timeout_after_success),
    ("takeover", "takeover while the first worker still runs", takeover_while_running),
    ("changed_payload", "same key, changed payload", changed_payload),
    ("identical_validated", "identical retry, peer payload validation on", identical_retry),
    ("other_principal", "same key, another principal", other_principal),
    ("async", "async function", async_function),
]


def judge(obs: Observation, downstream: redis.Redis) -> dict[str, Any]:
    effects = int(downstream.llen(obs.effects_key))
    pairs = list(zip(obs.snapshots, obs.snapshots[1:], strict=False))
    overwritten = sum(1 for a, b in pairs if a is not None and b is not None and a != b)
    lost = sum(1 for a, b in pairs if a is not None and b is None)
    return {
        "effects": effects,
        "duplicate_effects": max(0, effects - 1),
        "results_overwritten": overwritten,
        "results_lost": lost,
        "caller_saw": "; ".join(f"{who}: {seen}" for who, seen in obs.calls),
        "stored_after_each_call": [describe(s) if s else None for s in obs.snapshots],
    }


def _contender(lib: str, url: str, scope: str, key: str) -> Contender:
    if lib == "settle":
        return Settle(url, scope)
    return Peer(url, scope, validate=key == "identical_validated")


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with redis_server() as server:
        env = Env(server.url, args.lease)
        for key, title, scenario in SCENARIOS:
            if args.only and key not in args.only:
                continue
            for lib in ("settle", "powertools"):
                scope = f"{key}-{lib}-{env.run}"
                contender = _contender(lib, server.url, scope, key)
                try:
                    obs = scenario(contender, env, scope)
                finally:
                    contender.close()
                rows.append(
                    {"scenario": key, "title": title, "library": lib, **judge(obs, env.downstream)}
                )
        for key, title, deployed in DEPLOYMENT_SCENARIOS:
            if args.only and key not in args.only:
                continue
            for lib in ("settle", "powertools"):
                obs = deployed(lib, env, f"{key}-{lib}-{env.run}")
                rows.append(
                    {"scenario": key, "title": title, "library": lib, **judge(obs, env.downstream)}
                )
        about = machine(server)
        env.downstream.close()
    return {
        "machine": about,
        "lease_s": args.lease,
        "rows": rows,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


def print_report(result: dict[str, Any]) -> None:
    m = result["machine"]
    print(
        f"machine: nproc={m['nproc']} cpu={m['cpu_model']} python={m['python']} "
        f"redis-server={m['redis_server']}; lease {result['lease_s']} s; "
        f"elapsed {result['elapsed_s']} s\n"
    )
    print(
        table(
            [
                "scenario",
                "library",
                "effects",
                "duplicate effects",
                "results overwritten",
                "results lost",
                "what the callers saw",
            ],
            [
                [
                    r["title"],
                    r["library"],
                    r["effects"],
                    r["duplicate_effects"],
                    r["results_overwritten"],
                    r["results_lost"],
                    r["caller_saw"],
                ]
                for r in result["rows"]
            ],
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.anomalies", description=__doc__)
    parser.add_argument("--lease", type=float, default=0.5, help="seconds (both libraries)")
    parser.add_argument("--only", nargs="*", help="scenario keys to run")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    quiet_logs()
    result = run(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print_report(result)
    print(f"\nJSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
