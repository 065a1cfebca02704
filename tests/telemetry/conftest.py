"""The real OpenTelemetry SDK as the global tracer and meter providers of the test process:
an in-memory span exporter and an in-memory metric reader (set once: OpenTelemetry allows
one global provider per process). Each test reads its own spans (the exporter is cleared)
and its own measurements (filtered by its fresh namespace)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from settle._runtime.topology import has_functions

# The progress tests' two servers (stream, progress) and names.
from tests.progress.conftest import names, progress_server, stream_client, stream_server

__all__ = [
    "Telemetry",
    "names",
    "progress_server",
    "script_operation",
    "stream_client",
    "stream_server",
]

_EXPORTER = InMemorySpanExporter()
_READER = InMemoryMetricReader()


#: Every test of the whole suite uses its own namespace, and the provider is global for the
#: process: past the SDK's default of 2000 attribute sets per instrument, measurements would
#: go to the overflow set and a test's own counts would read 0 (a production service has a
#: few namespaces, not thousands).
_EVERY_NAMESPACE = View(instrument_name="*", aggregation_cardinality_limit=1_000_000)


def _install() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[_READER], views=[_EVERY_NAMESPACE]))


_install()


def script_operation(port: int) -> str:
    """The command settle runs its scripts with on the server at ``port``: FCALL of its
    FUNCTION library on Redis 7+ and Valkey, EVALSHA on Redis 6.2."""
    with redis.Redis(port=port) as client:
        return "FCALL" if has_functions(client.info("server")) else "EVALSHA"


@dataclass
class Telemetry:
    """What settle reported during one test."""

    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        found = list(self.exporter.get_finished_spans())
        return [s for s in found if name is None or s.name == name]

    def span(self, name: str) -> ReadableSpan:
        found = self.spans(name)
        assert len(found) == 1, (
            f"{len(found)} spans named {name!r}: {[s.name for s in self.spans()]}"
        )
        return found[0]

    def children(self, parent: ReadableSpan) -> list[ReadableSpan]:
        assert parent.context is not None
        return [
            s
            for s in self.spans()
            if s.parent is not None and s.parent.span_id == parent.context.span_id
        ]

    def points(self, metric: str, **attributes: Any) -> list[Any]:
        """Every data point of ``metric`` whose attributes include ``attributes``."""
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                if scope.scope.name != "settle":
                    continue
                for m in scope.metrics:
                    if m.name != metric:
                        continue
                    for point in m.data.data_points:
                        given = dict(point.attributes or {})
                        if all(given.get(k) == v for k, v in attributes.items()):
                            found.append(point)
        return found

    def count(self, metric: str, **attributes: Any) -> int:
        """The sum of a counter (or the number of measurements of a histogram)."""
        total = 0
        for point in self.points(metric, **attributes):
            total += point.count if hasattr(point, "bucket_counts") else point.value
        return total


@pytest.fixture
def otel() -> Iterator[Telemetry]:
    _EXPORTER.clear()
    yield Telemetry(_EXPORTER, _READER)
    _EXPORTER.clear()
