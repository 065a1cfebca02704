"""``python -m benchmarks.http``: the ASGI middleware over real HTTP, beside the bare endpoint
and a peer middleware.

Starts its own redis-server and three uvicorn servers (one worker each, loopback ports, in
subprocesses: :mod:`benchmarks._http_app`): the bare FastAPI endpoint, the same endpoint
behind settle's :class:`~settle.asgi.IdempotencyMiddleware`, and behind the
``fastapi-idempotency`` middleware on a one-script-per-call Redis store. Then loads them
with wrk (the Debian package) at ``-t1 -c<connections>``, in ``--rounds`` interleaved
rounds of ``--seconds`` for every variant:

* ``bare``: no middleware, no key;
* ``settle_new`` / ``peer_new``: a new ``Idempotency-Key`` on every request (a wrk Lua
  script numbers them per thread), so every request runs the handler and stores it;
* ``settle_replay`` / ``peer_replay``: one key, completed once before the rounds, so every
  request is answered from the store.

req/s is the median round, p99 the worst round's p99 (wrk's latency percentiles), and CPU
per request is the uvicorn process's own CPU time (``/proc/<pid>/stat`` utime + stime,
read before and after each round) over the requests wrk completed in that round, pooled.
Prints the table and the issue's target ratios, and writes ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._http_app import PATH
from benchmarks._report import publish, table, targets_table
from benchmarks._server import machine, redis_server
from settle.embedded import free_port

DEFAULT_JSON = Path(__file__).parent / "results" / "http.json"
BODY = json.dumps({"amount": 1250, "currency": "EUR", "customer": "cus_42"})
AUTH = "Bearer sk_test_acme"
REPLAY_KEY = "bench-replay-key"

#: variant -> (server, label, key mode: none | new | replay)
VARIANTS: dict[str, tuple[str, str, str]] = {
    "bare": ("bare", "no middleware", "none"),
    "settle_new": ("settle", "settle, a new key per request", "new"),
    "settle_replay": ("settle", "settle, replay", "replay"),
    "peer_new": ("peer", "fastapi-idempotency (Redis store, one script per call), new keys", "new"),
    "peer_replay": ("peer", "the same, replay", "replay"),
}

#: (name, numerator, denominator, at least)
TARGETS = [
    ("settle new key / bare", "settle_new", "bare", 0.5),
    ("settle new key / peer new key", "settle_new", "peer_new", 2.0),
    ("settle replay / bare", "settle_replay", "bare", 0.8),
    ("settle replay / peer replay", "settle_replay", "peer_replay", 1.5),
]

# The wrk script: a POST of the JSON body; ``key`` mode ``new`` numbers the key per request
# (run prefix + thread id + counter), ``replay`` sends one fixed key. ``done`` prints one
# JSON line with wrk's own counters and latency percentiles (microseconds).
WRK_SCRIPT = r"""
local mode, prefix = "none", "run"
local threads, counter = 0, 0
wrk.method = "POST"
wrk.body = __BODY__
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = __AUTH__

function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

function init(args)
  mode, prefix = args[1], args[2]
  if mode == "replay" then wrk.headers["Idempotency-Key"] = prefix end
  plain = wrk.format()
end

function request()
  if mode ~= "new" then return plain end
  counter = counter + 1
  local headers = {}
  for k, v in pairs(wrk.headers) do headers[k] = v end
  headers["Idempotency-Key"] = prefix .. "-" .. tid .. "-" .. counter
  return wrk.format(nil, nil, headers, nil)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "connect": %d, "read": %d, "write": %d, '
    .. '"status": %d, "timeout": %d, "p50_us": %d, "p99_us": %d, "max_us": %d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""


@dataclass
class Server:
    name: str
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{PATH}"

    def cpu_seconds(self) -> float:
        """utime + stime of the uvicorn process (fields 14 and 15 of /proc/<pid>/stat)."""
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Variant:
    key: str
    server: str
    label: str
    mode: str
    rates: list[float] = field(default_factory=list)
    p50_ms: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    requests: int = 0
    cpu_s: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)


def _post(url: str, key: str | None) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": "application/json", "Authorization": AUTH}
    if key is not None:
        headers["Idempotency-Key"] = key
    request = urllib.request.Request(url, data=BODY.encode(), headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()


def _start(name: str, redis_url: str, namespace: str, stack: ExitStack) -> Server:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks._http_app", name, redis_url, str(port), namespace],
        cwd=Path(__file__).resolve().parents[1],
    )
    server = Server(name, port, proc)
    stack.callback(_stop, proc)
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the {name} server exited with {proc.returncode} at start")
        try:
            status, _, _ = _post(server.url, None if name == "bare" else f"probe-{uuid.uuid4()}")
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {name} server did not answer within 30 s") from None
            time.sleep(0.1)
            continue
        if status != 201:
            raise RuntimeError(f"the {name} server answered {status}, not 201")
        return server


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _check_replay(server: Server) -> None:
    """Complete the replay key once; the second request must be its replay."""
    first = _post(server.url, REPLAY_KEY)
    again = _post(server.url, REPLAY_KEY)
    if first[0] != 201 or again[0] != 201 or again[2] != first[2]:
        raise RuntimeError(f"{server.name}: the replay key does not replay: {first} / {again}")
    if again[1].get("idempotent-replayed") != "true":
        raise RuntimeError(f"{server.name}: the replay has no Idempotent-Replayed header")


def _wrk(script: Path, server: Server, variant: Variant, args: argparse.Namespace) -> None:
    prefix = REPLAY_KEY if variant.mode == "replay" else f"k{uuid.uuid4().hex[:12]}"
    command = [
        args.wrk,
        "-t1",
        f"-c{args.connections}",
        f"-d{args.seconds}s",
        "--latency",
        "--timeout=10s",
        "-s",
        str(script),
        server.url,
        "--",
        variant.mode,
        prefix,
    ]
    before = server.cpu_seconds()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    cpu = server.cpu_seconds() - before
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("WRKJSON ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed on {variant.key}: {done.stdout}\n{done.stderr}")
    out = json.loads(line.removeprefix("WRKJSON "))
    # Only 2xx answers count: a non-2xx answer (wrk counts it a status error) is not throughput.
    answered = out["requests"] - out["status"]
    variant.rates.append(answered / (out["duration_us"] / 1e6))
    variant.p50_ms.append(out["p50_us"] / 1000)
    variant.p99_ms.append(out["p99_us"] / 1000)
    variant.requests += out["requests"]
    variant.cpu_s += cpu
    for name in ("connect", "read", "write", "status", "timeout"):
        variant.errors[name] = variant.errors.get(name, 0) + out[name]


def summarize(v: Variant) -> dict[str, Any]:
    return {
        "variant": v.key,
        "label": v.label,
        "requests": v.requests,
        "req_per_s": round(statistics.median(v.rates), 1),
        "round_req_per_s": [round(r, 1) for r in v.rates],
        "p50_ms": round(max(v.p50_ms), 2),
        "p99_ms": round(max(v.p99_ms), 2),
        "server_cpu_ms_per_request": round(v.cpu_s / max(v.requests, 1) * 1000, 3),
        "errors": v.errors,
    }


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target's ratio of 2xx req/s; never met when either side had an error."""
    by = {r["variant"]: r for r in rows}
    out = []
    for name, top, bottom, at in TARGETS:
        value = by[top]["req_per_s"] / by[bottom]["req_per_s"] if by[bottom]["req_per_s"] else 0
        clean = not any(sum(by[v]["errors"].values()) for v in (top, bottom))
        out.append(
            {
                "target": name,
                "value": round(value, 2),
                "goal": f">= {at}x",
                "met": clean and value >= at,
            }
        )
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    variants = [Variant(k, *VARIANTS[k]) for k in VARIANTS]
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        server = stack.enter_context(redis_server())
        namespace = f"bench-http-{uuid.uuid4().hex[:8]}"
        servers = {
            name: _start(name, server.url, namespace, stack) for name in ("bare", "settle", "peer")
        }
        for name in ("settle", "peer"):
            _check_replay(servers[name])
        script = Path(tmp) / "post.lua"
        script.write_text(
            WRK_SCRIPT.replace("__BODY__", json.dumps(BODY)).replace("__AUTH__", json.dumps(AUTH))
        )
        for _ in range(args.rounds):
            for variant in variants:
                _wrk(script, servers[variant.server], variant, args)
        about = machine(server)
    rows = [summarize(v) for v in variants]
    return {
        "machine": {**about, "wrk": _wrk_version(args.wrk)},
        "settings": {
            "rounds": args.rounds,
            "seconds_per_round": args.seconds,
            "wrk_threads": 1,
            "connections": args.connections,
            "uvicorn_workers": 1,
        },
        "variants": rows,
        "targets": ratios(rows),
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


def _wrk_version(wrk: str) -> str:
    done = subprocess.run([wrk, "-v"], capture_output=True, text=True, check=False)
    return (done.stdout + done.stderr).split("Copyright")[0].strip()


def print_report(result: dict[str, Any]) -> None:
    m, s = result["machine"], result["settings"]
    print(
        f"machine: nproc={m['nproc']} cpu={m['cpu_model']} python={m['python']} "
        f"redis-server={m['redis_server']} {m['wrk']} load(1m)={m['load_average_1m']}"
    )
    print(
        f"settings: wrk -t1 -c{s['connections']}, {s['rounds']} interleaved rounds x "
        f"{s['seconds_per_round']} s per variant, uvicorn 1 worker; "
        f"elapsed {result['elapsed_s']} s\n"
    )
    bare = next(r for r in result["variants"] if r["variant"] == "bare")["req_per_s"]
    print("HTTP (req/s: median round; p99: worst round; CPU: uvicorn's, pooled)\n")
    print(
        table(
            ["variant", "req/s", "x bare", "p50 ms", "p99 ms", "uvicorn CPU ms/req", "errors"],
            [
                [
                    r["label"],
                    f"{r['req_per_s']:,.0f}",
                    f"{r['req_per_s'] / bare:.2f}" if bare else "-",
                    r["p50_ms"],
                    r["p99_ms"],
                    r["server_cpu_ms_per_request"],
                    sum(r["errors"].values()),
                ]
                for r in result["variants"]
            ],
        )
    )
    print("\nTargets (this run)\n")
    print(targets_table(result["targets"]))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.http", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=10, help="per variant per round")
    parser.add_argument("--connections", type=int, default=32, help="wrk -c")
    parser.add_argument("--wrk", default=shutil.which("wrk") or "/usr/bin/wrk")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not Path(args.wrk).exists():
        print(f"wrk not found at {args.wrk}: apt-get install wrk (.ci/run does)", file=sys.stderr)
        return 2
    publish(run(args), args.json, print_report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
