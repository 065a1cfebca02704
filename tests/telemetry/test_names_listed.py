"""Every name settle reports is listed in docs/observability.md: the span names, span
attributes, instruments and their attributes a real run emits, and every plain Redis
command the runner makes a client span of.

The runner's ``EXISTS`` (the namespace's first use) and ``TIME`` (the console's clock)
spans were emitted and listed nowhere: a dashboard or alert built from the doc did not
know of them."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import tenacity
from opentelemetry.instrumentation.wsgi import OpenTelemetryMiddleware as WsgiTelemetry

from settle import Attempt, OperationFailed, Settler
from settle.cursor import CursorStore
from settle.embedded import EmbeddedRedis
from settle.progress import EffectContext, ProgressStore, StreamConsumer
from settle.wsgi import IdempotencyMiddleware
from tests.http.apps import serve_wsgi
from tests.progress.harness import Names, publish
from tests.telemetry.conftest import Telemetry

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "observability.md"

#: A plain command the runner sends: ``.command("EXISTS", ...)``, ``._command("TIME", ...)``
#: (also with the name on the next line).
_COMMAND = re.compile(r"\._?command\(\s*\"([A-Z]+)\"")


def _listed(name: str) -> bool:
    doc = DOC.read_text(encoding="utf-8")
    return f"`{name}`" in doc


def test_every_plain_command_span_is_listed() -> None:
    commands = set()
    for path in (ROOT / "settle").rglob("*.py"):
        commands.update(_COMMAND.findall(path.read_text(encoding="utf-8")))
    assert {"EXISTS", "XREADGROUP"} <= commands, commands  # the scan still finds them
    assert sorted(c for c in commands if not _listed(c)) == []


def _script_span(name: str) -> str:
    """``EVALSHA reserve`` / ``FCALL reserve`` as the doc lists it: ``EVALSHA <script>``."""
    operation, _, script = name.partition(" ")
    return f"{operation} <script>" if operation in ("EVALSHA", "FCALL") and script else name


def test_every_name_a_real_run_emits_is_listed(
    settler: Settler, namespace: str, otel: Telemetry
) -> None:
    once = tenacity.Retrying(stop=tenacity.stop_after_attempt(2), wait=tenacity.wait_none())

    @settler.operation(key="charge:{order}", principal="tenant:a", retry=once, terminal=KeyError)
    def charge(order: str, attempt: Attempt = Attempt.INJECTED) -> int:
        if order == "declined":
            raise KeyError(order)
        if attempt.number == 1:
            raise ConnectionError("reset")
        return attempt.generation

    assert charge("o-1") == charge("o-1")
    with pytest.raises(OperationFailed):
        charge("declined")
    first = settler.reserve("op-1", {"n": 1}, principal="tenant:a", lease=0.05)
    time.sleep(0.1)
    settler.renew(first.reservation)
    settler.reserve("op-1", {"n": 1}, principal="tenant:a")
    settler.complete(first.reservation, 1)  # quarantined: stale_generation
    settler.quarantine.list()
    settler.get_many(["op-1"])
    settler.attempts("op-1")

    ours = _emitted(otel, lambda point: point.get("settle.namespace") == namespace)
    assert {"EXISTS", "settle.operation", "settle.attempt", "settle.takeovers"} <= ours
    emitted = _emitted(otel)
    assert sorted(name for name in emitted if not _listed(name)) == []


def _emitted(otel: Telemetry, ours: Callable[[dict[str, Any]], bool] = lambda _: True) -> set[str]:
    """The names settle reported: its spans' names and attributes (the settle attributes it
    adds to a server span of OpenTelemetry's instrumentation), its instruments and theirs.

    The spans are this test's (the exporter is cleared for each), the metrics the
    process's since it started: ``ours`` keeps the data points of this test's run (its
    namespace, its stream), so that a check that a part still emits a metric is
    not passed by another test that ran before it in the same worker."""
    emitted: set[str] = set()
    for span in otel.spans():
        attributes = dict(span.attributes or {})
        scope = span.instrumentation_scope.name if span.instrumentation_scope else ""
        if scope != "settle":  # the HTTP instrumentation's server span: settle's additions
            emitted.update(k for k in attributes if k.startswith("settle."))
            continue
        if attributes.get("messaging.operation.type") == "settle":
            emitted.add("<kind> <stream>")
        else:
            emitted.add(_script_span(span.name))
        emitted.update(attributes)
    data = otel.reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope_metrics in resource.scope_metrics:
            if scope_metrics.scope.name != "settle":
                continue
            for metric in scope_metrics.metrics:
                for point in metric.data.data_points:
                    attributes = dict(point.attributes or {})
                    if ours(attributes):
                        emitted.add(metric.name)
                        emitted.update(attributes)
    return emitted


def test_every_name_the_other_parts_emit_is_listed(
    redis_url: str,
    namespace: str,
    names: Names,
    stream_server: EmbeddedRedis,
    progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    otel: Telemetry,
) -> None:
    """The real run above is the core's and the decorator's: delivery progress (messaging
    spans and metrics), a guarded WSGI request (the server span's settle attributes,
    ``settle.http.requests``), the cursor store and the quarantine's other calls emit
    names of their own."""
    store = ProgressStore.from_url(progress_server.url, consumer=names.consumer)
    consumer = StreamConsumer(
        redis.Redis.from_url(stream_server.url), store, stream=names.stream, group=names.group,
        block=0.01,
    )  # fmt: skip
    consumer.start()
    publish(stream_client, names, ["good", "bad"])

    def effect(ctx: EffectContext) -> None:
        if ctx.emission.value == "bad":
            raise RuntimeError("the effect failed")

    consumer.poll(effect)
    consumer.close()

    cursors = CursorStore.from_url(redis_url, namespace=namespace)
    cursors.start("orders", b"cursor-1")
    cursors.close()

    settler = Settler.from_url(redis_url, namespace=namespace, shards=4)

    def handler(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("201 Created", [("Content-Type", "application/json")])
        return [b"{}"]

    app = IdempotencyMiddleware(handler, settler=settler, principal=lambda _e: "tenant:a")
    with serve_wsgi(WsgiTelemetry(app)) as base:
        for key in ("k-1", "k-1", None):
            headers = {"Idempotency-Key": key} if key else {}
            httpx.post(f"{base}/pay", json={"n": 1}, headers=headers, timeout=30)
    r = settler.reserve("op-1", {"n": 1}, principal="tenant:a")
    settler.complete(r.reservation, 1)
    quarantined = settler.complete(r.reservation, 2)
    assert quarantined.quarantine_id is not None
    settler.quarantine.resolve(quarantined.quarantine_id, note="checked")
    settler.quarantine.trim()
    settler.close()

    ours = _emitted(
        otel,
        lambda point: (
            point.get("settle.namespace") == namespace
            or point.get("messaging.destination.name") == names.stream
        ),
    )
    assert {
        "<kind> <stream>",
        "messaging.client.operation.duration",
        "settle.progress.settlements",
        "settle.http.outcome",
        "settle.http.requests",
        "settle.quarantine.resolve",
        "settle.quarantine.trim",
        "XREADGROUP",
    } <= ours, sorted(ours)
    emitted = _emitted(otel)
    assert sorted(name for name in emitted if not _listed(name)) == []
