"""``python -m benchmarks.telemetry``: what OpenTelemetry costs on reserve + complete.

Starts its own redis-server, then runs the same loop (``reserve`` then ``complete`` of a
fresh operation, sync, one connection) in a fresh process per mode, in ``--rounds``
interleaved rounds so that load from other processes hits every mode alike:

- ``off``: ``opentelemetry`` cannot be imported (settle's hooks are the shared no-op);
- ``sdk``: the OpenTelemetry SDK as the global tracer and meter providers, every span
  recorded and handed to a batch processor whose exporter drops it, every measurement
  aggregated by a metric reader (what an application pays before its exporter's own cost);
- ``sampled``: the same with 1% of traces sampled (``ParentBased(TraceIdRatioBased(0.01))``),
  as a busy service would run it: the metrics are all kept.

Prints them side by side: pairs/s (the median round) and this process's CPU time per pair
(``time.process_time``) in its least disturbed round (on a shared machine, load from other
processes only ever adds to it), and the overhead of each against ``off`` (goal: at most
5%). Beside it, the **SDK floor**: the same child process then makes, directly through the
OpenTelemetry API and without settle, the signals a pair must report (per call a span made
current, a client span inside it when the call's span is recorded, one histogram record)
and times them the same way; what is left of the overhead above the floor is settle's own.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks._server import quiet_logs, redis_server

MODES = ("off", "sdk", "sampled")

_REFUSE = """
import sys
class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(name, name=name)
        return None
sys.meta_path.insert(0, _Refuse())
"""


def _install_sdk(ratio: float = 1.0) -> None:
    # Imported here: the "off" mode's process must never import opentelemetry.
    from opentelemetry import metrics, trace  # noqa: PLC0415
    from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: PLC0415
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import (  # noqa: PLC0415
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased  # noqa: PLC0415

    class Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:  # noqa: ARG002
            return SpanExportResult.SUCCESS

    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))


def floor(seconds: float) -> float:
    """CPU microseconds per pair of what the pair's signals cost the SDK alone: for each
    of the two calls a span made current, a client span inside it (when the call's span
    is recorded), one histogram record. Counters are not here: settle counts in-process
    and the SDK reads the counts once per collection."""
    from opentelemetry import metrics, trace  # noqa: PLC0415  # only in the sdk modes

    tracer = trace.get_tracer("floor")
    histogram = metrics.get_meter("floor").create_histogram("floor.duration", "s")
    client = trace.SpanKind.CLIENT
    redis = {
        "db.system.name": "redis",
        "db.operation.name": "EVALSHA",
        "db.stored_procedure.name": "reserve",
        "server.address": "127.0.0.1",
        "server.port": 6379,
        "db.namespace": "0",
    }

    def pair() -> None:
        for name in ("reserve", "complete"):
            with tracer.start_as_current_span(
                f"settle.{name}", attributes={"settle.namespace": "bench"}
            ) as span:
                if span.is_recording():
                    tracer.start_span(f"EVALSHA {name}", kind=client, attributes=redis).end()
                span.set_attributes({"settle.outcome": "reserved", "settle.generation": 1})
            histogram.record(
                0.001,
                {"settle.namespace": "bench", "settle.call.name": name, "settle.outcome": "x"},
            )

    for _ in range(300):
        pair()
    done, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        for _ in range(50):
            pair()
        done += 50
    return (time.process_time() - cpu) / done * 1e6


def measure(url: str, mode: str, seconds: float) -> tuple[float, float, float]:
    """reserve + complete pairs per second, CPU microseconds per pair, in this process,
    after a warm-up; and the SDK floor's CPU microseconds per pair (0 when off)."""
    if mode != "off":
        _install_sdk(1.0 if mode == "sdk" else 0.01)
    # After the providers are set, as an application would import and use settle.
    from settle import Settler  # noqa: PLC0415
    from settle._telemetry import telemetry  # noqa: PLC0415

    assert telemetry().enabled == (mode != "off")
    quiet_logs()
    settler = Settler.from_url(url, namespace=f"bench-{mode}-{time.monotonic_ns()}")
    n = 0

    def pair() -> None:
        nonlocal n
        n += 1
        r = settler.reserve(f"op-{n}", {"amount": n}, principal="tenant:bench")
        settler.complete(r.reservation, {"ok": n})

    for _ in range(300):
        pair()
    done, start, cpu = 0, time.perf_counter(), time.process_time()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(50):
            pair()
        done += 50
    used = time.process_time() - cpu
    settler.close()
    sdk = 0.0 if mode == "off" else floor(seconds)
    return done / elapsed, used / done * 1e6, sdk


def _child(url: str, mode: str, seconds: float) -> tuple[float, float, float]:
    code = (_REFUSE if mode == "off" else "") + (
        "from benchmarks.telemetry import measure\n"
        f"print(measure({url!r}, {mode!r}, {seconds!r}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600
    )
    rate, cpu, sdk = out.stdout.strip().splitlines()[-1].strip("()").split(",")
    return float(rate), float(cpu), float(sdk)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpus: dict[str, list[float]] = {mode: [] for mode in MODES}
    floors: dict[str, list[float]] = {mode: [] for mode in MODES}
    with redis_server() as server:
        for _ in range(args.rounds):
            for mode in MODES:
                rate, cpu, sdk = _child(server.url, mode, args.seconds)
                rates[mode].append(rate)
                cpus[mode].append(cpu)
                floors[mode].append(sdk)
    median = {mode: statistics.median(values) for mode, values in rates.items()}
    cpu_us = {mode: min(values) for mode, values in cpus.items()}
    floor_us = {mode: min(values) for mode, values in floors.items()}
    print(f"reserve + complete, sync, one connection, median of {args.rounds} rounds")
    print(
        f"{'mode':<8} {'pairs/s':>9} {'overhead':>9} {'CPU us/pair':>12} {'overhead':>9}"
        f" {'SDK floor':>10} {'settle own':>11}"
    )
    print(f"{'':<8} {'(median)':>9} {'':>9} {'(best)':>12} {'':>9} {'us/pair':>10} {'us/pair':>11}")
    overhead: dict[str, dict[str, float]] = {}
    for mode in MODES:
        wall = 1 - median[mode] / median["off"]
        cpu = cpu_us[mode] / cpu_us["off"] - 1
        own = cpu_us[mode] - cpu_us["off"] - floor_us[mode]
        overhead[mode] = {"pairs_per_s": wall, "cpu": cpu, "sdk_floor_us": floor_us[mode]}
        overhead[mode]["settle_own_us"] = own
        print(
            f"{mode:<8} {median[mode]:>9,.0f} {wall:>9.1%} {cpu_us[mode]:>12.1f} {cpu:>9.1%}"
            f" {floor_us[mode]:>10.1f} {own:>11.1f}"
        )
    print("goal: at most 5% on reserve + complete")
    result = {
        "rates": rates,
        "cpu_us": cpus,
        "floor_us": floors,
        "median": median,
        "overhead": overhead,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
