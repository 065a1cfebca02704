"""``suppress_instrumentation()`` is how an application (and the SDK's own exporters) says
"report nothing of this work": OpenTelemetry's instrumentations (redis, ASGI, WSGI...) then
make no span and record no measurement. settle's own telemetry honours it too: its spans of
work done under it were new root traces, with no parent, as the application's own spans
around them were suppressed. Sync and async, the decorator too, on a real Redis with the
real SDK."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis
from opentelemetry import context
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY
from opentelemetry.instrumentation.utils import suppress_instrumentation

from settle import AsyncSettler, Attempt, Settler
from settle.embedded import EmbeddedRedis
from settle.progress import ProgressStore, StreamConsumer
from settle.wsgi import IdempotencyMiddleware
from tests.http.apps import serve_wsgi
from tests.progress.harness import Names, publish
from tests.telemetry.conftest import Telemetry


def _nothing_reported(otel: Telemetry, namespace: str) -> None:
    assert [s.name for s in otel.spans()] == []
    n = {"settle.namespace": namespace}
    assert otel.count("settle.reservations", **n) == 0
    assert otel.count("settle.call.duration", **n) == 0


def test_no_span_or_measurement_under_suppress_instrumentation(
    settler: Settler, namespace: str, otel: Telemetry
) -> None:
    @settler.operation(key="charge:{order}", principal="tenant:a")
    def charge(order: str, attempt: Attempt = Attempt.INJECTED) -> int:
        return attempt.number

    with suppress_instrumentation():
        r = settler.reserve("op-1", {"n": 1}, principal="tenant:a")
        settler.complete(r.reservation, {"ok": True})
        settler.reserve("op-1", {"n": 1}, principal="tenant:a")
        assert charge("o-1") == 1
        settler.quarantine.list()
    _nothing_reported(otel, namespace)
    # Outside it, reported as ever.
    settler.reserve("op-2", {"n": 1}, principal="tenant:a")
    assert [s.name for s in otel.spans() if s.name.startswith("settle.")] == ["settle.reserve"]


def test_a_set_up_at_start_under_suppress_instrumentation_reports_nothing(
    redis_url: str, namespace: str, otel: Telemetry
) -> None:
    """``with Settler.from_url(...)`` under ``suppress_instrumentation()``: its set-up's
    span (``settle.check``) is suppressed with the Redis calls inside it."""
    with suppress_instrumentation(), Settler.from_url(redis_url, namespace=namespace, shards=4):
        pass
    _nothing_reported(otel, namespace)


@pytest.mark.asyncio
async def test_no_async_span_or_measurement_under_suppress_instrumentation(
    async_settler: AsyncSettler, namespace: str, otel: Telemetry
) -> None:
    s = async_settler

    @s.operation(key="charge:{order}", principal="tenant:a")
    async def charge(order: str, attempt: Attempt = Attempt.INJECTED) -> int:
        return attempt.number

    with suppress_instrumentation():
        r = await s.reserve("op-1", {"n": 1}, principal="tenant:a")
        await s.complete(r.reservation, {"ok": True})
        assert await charge("o-1") == 1
    _nothing_reported(otel, namespace)
    await s.reserve("op-2", {"n": 1}, principal="tenant:a")
    assert [x.name for x in otel.spans() if x.name.startswith("settle.")] == ["settle.reserve"]


def test_a_heartbeat_thread_reports_nothing_of_a_suppressed_call(
    redis_url: str, namespace: str, otel: Telemetry
) -> None:
    """The sync heartbeat renews from a thread of its own: the caller's suppression goes
    with its renewals, which were reported as spans with no parent."""
    settler = Settler.from_url(redis_url, namespace=namespace, lease=0.6)

    @settler.operation(key="slow:{order}", principal="tenant:a")
    def slow(order: str) -> int:
        time.sleep(0.7)  # two renewals (every 0.2 s)
        return 1

    try:
        with suppress_instrumentation():
            assert slow("o-1") == 1
        assert otel.spans("settle.renew") == []
        assert slow("o-2") == 1  # the same heartbeat, reported as ever
        assert len(otel.spans("settle.renew")) >= 2
    finally:
        settler.close()


def _suppressing(app: Any) -> Any:
    """A WSGI app whose requests run under ``suppress_instrumentation()``."""

    def suppressed(environ: dict[str, Any], start_response: Any) -> Any:
        with suppress_instrumentation():
            return app(environ, start_response)

    return suppressed


def test_a_suppressed_wsgi_request_is_reported_nowhere(
    redis_url: str, namespace: str, otel: Telemetry
) -> None:
    """The WSGI guard renews a request's lease from the heartbeat thread too."""

    def handler(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        time.sleep(0.7)
        start_response("201 Created", [("Content-Type", "application/json")])
        return [b"{}"]

    settler = Settler.from_url(redis_url, namespace=namespace, lease=0.6)
    app = IdempotencyMiddleware(handler, settler=settler, principal=lambda _e: "tenant:a")
    try:
        with serve_wsgi(_suppressing(app)) as base:
            posted = httpx.post(
                f"{base}/pay", json={"n": 1}, headers={"Idempotency-Key": "k-1"}, timeout=30
            )
            assert posted.status_code == 201
    finally:
        settler.close()
    _nothing_reported(otel, namespace)
    assert otel.count("settle.http.requests", **{"settle.namespace": namespace}) == 0


@pytest.mark.parametrize(
    "key",
    [
        # The API's key alone: what the SDK's exporters and processors set around their
        # own work (``context.set_value(_SUPPRESS_INSTRUMENTATION_KEY, True)``).
        _SUPPRESS_INSTRUMENTATION_KEY,
        # The plain key alone: what an older ``opentelemetry-instrumentation`` sets.
        "suppress_instrumentation",
    ],
    ids=["api_key", "plain_key"],
)
def test_either_suppression_key_alone_reports_nothing(
    settler: Settler, namespace: str, otel: Telemetry, key: str
) -> None:
    token = context.attach(context.set_value(key, True))
    try:
        settler.reserve("op-1", {"n": 1}, principal="tenant:a")
    finally:
        context.detach(token)
    _nothing_reported(otel, namespace)


def test_a_suppressed_delivery_settlement_is_reported_nowhere(
    names: Names,
    stream_server: EmbeddedRedis,
    progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    otel: Telemetry,
) -> None:
    """``settle.progress``: no messaging span, no messaging measurement."""
    store = ProgressStore.from_url(progress_server.url, consumer=names.consumer)
    consumer = StreamConsumer(
        redis.Redis.from_url(stream_server.url), store, stream=names.stream, group=names.group,
        block=0.01,
    )  # fmt: skip
    # The group's name is every progress test's ("billing") and the meter's sums are
    # cumulative for the process: what counts is that this run added nothing to them.
    group = {"messaging.consumer.group.name": names.group}
    metrics = ("messaging.client.operation.duration", "settle.progress.settlements")
    before = [otel.count(metric, **group) for metric in metrics]
    try:
        with suppress_instrumentation():
            consumer.start()
            publish(stream_client, names, ["good"])
            consumer.poll(lambda _ctx: None)
    finally:
        consumer.close()
    assert [s.name for s in otel.spans()] == []
    assert [otel.count(metric, **group) for metric in metrics] == before


@pytest.mark.asyncio
async def test_a_suppressed_task_mutes_no_other_task(
    redis_url: str, namespace: str, otel: Telemetry
) -> None:
    """The suppression is the suppressed task's alone: a task running beside it, and the
    decorated calls' heartbeat tasks, report as ever."""
    s = AsyncSettler.from_url(redis_url, namespace=namespace, lease=0.6)
    await s.reserve("op-0", {"n": 1}, principal="tenant:a")  # set up before the tasks
    otel.exporter.clear()

    @s.operation(key="charge:{order}", principal="tenant:a")
    async def charge(order: str) -> str:
        await asyncio.sleep(0.7)  # renewed by its heartbeat task meanwhile
        return order

    async def suppressed() -> str:
        with suppress_instrumentation():
            return await charge("muted")

    try:
        assert await asyncio.gather(suppressed(), charge("heard")) == ["muted", "heard"]
    finally:
        await s.aclose()
    [operation] = otel.spans("settle.operation")
    attempt = otel.span("settle.attempt")
    assert len(otel.spans("settle.renew")) >= 2
    for renew in otel.spans("settle.renew"):
        assert renew.parent is not None
        assert renew.parent.span_id == attempt.context.span_id
    assert all(x.context.trace_id == operation.context.trace_id for x in otel.spans())


def test_a_suppressed_thread_mutes_no_other_thread(
    redis_url: str, namespace: str, otel: Telemetry
) -> None:
    """Two decorated calls at once in a thread pool, one suppressed: the other's spans and
    its renewals (from the heartbeat thread both share) are reported, in its trace."""
    settler = Settler.from_url(redis_url, namespace=namespace, lease=0.6)

    @settler.operation(key="slow:{order}", principal="tenant:a")
    def slow(order: str) -> str:
        time.sleep(0.7)
        return order

    def suppressed() -> str:
        with suppress_instrumentation():
            return slow("muted")

    try:
        settler.reserve("op-0", {"n": 1}, principal="tenant:a")  # set up first
        otel.exporter.clear()
        with ThreadPoolExecutor(2) as pool:
            muted, heard = pool.submit(suppressed), pool.submit(slow, "heard")
            assert (muted.result(), heard.result()) == ("muted", "heard")
        [operation] = otel.spans("settle.operation")
        attempt = otel.span("settle.attempt")
        assert len(otel.spans("settle.renew")) >= 2
        for renew in otel.spans("settle.renew"):
            assert renew.parent is not None
            assert renew.parent.span_id == attempt.context.span_id
        assert all(s.context.trace_id == operation.context.trace_id for s in otel.spans())
    finally:
        settler.close()
