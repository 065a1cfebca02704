"""``python -m benchmarks.telemetry``: what OpenTelemetry costs on reserve + complete.

Starts its own redis-server, then runs the same loop (``reserve`` then ``complete`` of a
fresh operation, sync, one connection) in a fresh process per mode, in ``--rounds``
interleaved rounds so that load from other processes hits every mode alike:

- ``off``: ``opentelemetry`` cannot be imported (settle's hooks are the shared no-op);
- ``sdk``: the OpenTelemetry SDK as the global tracer and meter providers, every span
  recorded and handed to a batch processor whose exporter drops it, every measurement
  aggregated by a metric reader (what an application pays before its exporter's own cost);
- ``sampled``: the same with 1% of traces sampled (``ParentBased(TraceIdRatioBased(0.01))``),
  as a busy service would run it: the metrics are all kept;
- ``floor`` and ``floor-sampled``: the **SDK floor** of those two, in place. settle runs with
  its hooks idle (no global provider is set), and the loop itself makes, through an SDK
  configured the same way, the signals a pair must report: around each call a span made
  current, a client span inside it when that span is recorded, one histogram record. It is
  what the SDK alone costs for the signals, in the same process, with the same code and data
  competing for the CPU's caches as when settle makes them (in a tight loop of its own the
  SDK costs less than half as much).

Prints them side by side: pairs/s (the median round) and this process's CPU time per pair
(``time.process_time``) in its least disturbed round (on a shared machine, load from other
processes only ever adds to it), the overhead of each against ``off``, and, for ``sdk`` and
``sampled``, **settle's own** part of it: its CPU above its floor, the only part settle
controls (goal: at most 5% of the pair).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks._server import quiet_logs, redis_server

MODES = ("off", "floor", "sdk", "floor-sampled", "sampled")
#: The floor of each mode that settle reports in.
FLOORS = {"sdk": "floor", "sampled": "floor-sampled"}
GOAL = 0.05

_REFUSE = """
import sys
class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(name, name=name)
        return None
sys.meta_path.insert(0, _Refuse())
"""


def _providers(ratio: float) -> tuple[Any, Any]:
    """A tracer provider and a meter provider as an application would configure them: the
    sampler at ``ratio``, a batch processor whose exporter drops every span, a metric reader
    aggregating every measurement. Imported here: the "off" mode's process must never import
    opentelemetry."""
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

    tracing = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    tracing.add_span_processor(BatchSpanProcessor(Drop()))
    return tracing, MeterProvider(metric_readers=[InMemoryMetricReader()])


def _install_sdk(ratio: float = 1.0) -> None:
    """The SDK as the global providers (what settle reports through)."""
    from opentelemetry import metrics, trace  # noqa: PLC0415

    tracing, metering = _providers(ratio)
    trace.set_tracer_provider(tracing)
    metrics.set_meter_provider(metering)


def _floor_signals(ratio: float) -> Callable[[str, Callable[[], Any]], Any]:
    """``around(name, call)``: runs ``call`` inside the signals one settle call must report,
    made directly through an SDK configured as :func:`_providers` does but never set as the
    global providers (settle's hooks stay idle)."""
    from opentelemetry import context, trace  # noqa: PLC0415  # only in the floor modes

    from settle._telemetry import CALL_BUCKETS  # noqa: PLC0415  # settle's own buckets

    tracing, metering = _providers(ratio)
    tracer = tracing.get_tracer("floor")
    histogram = metering.get_meter("floor").create_histogram(
        "floor.duration", "s", explicit_bucket_boundaries_advisory=CALL_BUCKETS
    )
    client = trace.SpanKind.CLIENT
    redis = {
        "db.system.name": "redis",
        "db.operation.name": "EVALSHA",
        "server.address": "127.0.0.1",
        "server.port": 6379,
        "db.namespace": "0",
    }

    # The least the API allows: no context manager, attributes set once at the end.
    def around(name: str, call: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        span = tracer.start_span(f"settle.{name}", attributes={"settle.namespace": "bench"})
        token = context.attach(trace.set_span_in_context(span))
        if span.is_recording():
            tracer.start_span(
                f"EVALSHA {name}",
                kind=client,
                attributes={**redis, "db.stored_procedure.name": name},
            ).end()
        result = call()
        histogram.record(
            time.perf_counter() - start,
            {"settle.namespace": "bench", "settle.call.name": name, "settle.outcome": "x"},
        )
        context.detach(token)
        span.set_attributes({"settle.outcome": "reserved", "settle.generation": 1})
        span.end()
        return result

    return around


def measure(url: str, mode: str, seconds: float) -> tuple[float, float]:
    """reserve + complete pairs per second and CPU microseconds per pair, in this process,
    after a warm-up."""
    ratio = 0.01 if mode.endswith("sampled") else 1.0
    around: Callable[[str, Callable[[], Any]], Any] | None = None
    if mode in FLOORS:
        _install_sdk(ratio)
    elif mode != "off":
        around = _floor_signals(ratio)
    # After the providers are set, as an application would import and use settle.
    from settle import Settler  # noqa: PLC0415
    from settle._telemetry import telemetry  # noqa: PLC0415

    hooks = telemetry()
    assert hooks.enabled == (mode != "off")
    assert (mode in FLOORS) == (hooks.enabled and not hooks.idle())  # type: ignore[union-attr]
    quiet_logs()
    settler = Settler.from_url(url, namespace=f"bench-{mode}-{time.monotonic_ns()}")
    n = 0

    def plain() -> None:
        nonlocal n
        n += 1
        r = settler.reserve(f"op-{n}", {"amount": n}, principal="tenant:bench")
        settler.complete(r.reservation, {"ok": n})

    def signalled() -> None:
        nonlocal n
        n += 1
        assert around is not None
        r = around(
            "reserve",
            lambda: settler.reserve(f"op-{n}", {"amount": n}, principal="tenant:bench"),
        )
        around("complete", lambda: settler.complete(r.reservation, {"ok": n}))

    pair = plain if around is None else signalled
    for _ in range(300):
        pair()
    done, start, cpu = 0, time.perf_counter(), time.process_time()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(50):
            pair()
        done += 50
    used = time.process_time() - cpu
    settler.close()
    return done / elapsed, used / done * 1e6


def _child(url: str, mode: str, seconds: float) -> tuple[float, float]:
    code = (_REFUSE if mode == "off" else "") + (
        "from benchmarks.telemetry import measure\n"
        f"print(measure({url!r}, {mode!r}, {seconds!r}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600
    )
    rate, cpu = out.stdout.strip().splitlines()[-1].strip("()").split(",")
    return float(rate), float(cpu)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpus: dict[str, list[float]] = {mode: [] for mode in MODES}
    with redis_server() as server:
        for _ in range(args.rounds):
            for mode in MODES:
                rate, cpu = _child(server.url, mode, args.seconds)
                rates[mode].append(rate)
                cpus[mode].append(cpu)
    median = {mode: statistics.median(values) for mode, values in rates.items()}
    cpu_us = {mode: min(values) for mode, values in cpus.items()}
    print(f"reserve + complete, sync, one connection, median of {args.rounds} rounds")
    print(
        f"{'mode':<14} {'pairs/s':>9} {'overhead':>9} {'CPU us/pair':>12} {'overhead':>9}"
        f" {'settle own':>11} {'of the pair':>12}"
    )
    print(f"{'':<14} {'(median)':>9} {'':>9} {'(best)':>12} {'':>9} {'us/pair':>11} {'':>12}")
    overhead: dict[str, dict[str, float]] = {}
    for mode in MODES:
        wall = 1 - median[mode] / median["off"]
        cpu = cpu_us[mode] / cpu_us["off"] - 1
        overhead[mode] = {"pairs_per_s": wall, "cpu": cpu}
        line = f"{mode:<14} {median[mode]:>9,.0f} {wall:>9.1%} {cpu_us[mode]:>12.1f} {cpu:>9.1%}"
        if mode in FLOORS:
            own = cpu_us[mode] - cpu_us[FLOORS[mode]]
            overhead[mode]["settle_own_us"] = own
            overhead[mode]["settle_own"] = own / cpu_us["off"]
            line += f" {own:>11.1f} {own / cpu_us['off']:>12.1%}"
        print(line)
    print(
        f"goal: settle's own at most {GOAL:.0%} of the pair; the floor modes are what the"
        " OpenTelemetry SDK alone costs for the same signals"
    )
    result = {"rates": rates, "cpu_us": cpus, "median": median, "overhead": overhead}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
