"""Delivery progress: each settlement of a delivery is a span with the messaging semantic
conventions (operation type ``settle``, the stream, the consumer group), its Redis calls
inside it; ``messaging.client.operation.duration`` and ``settle.progress.settlements``
measure them; the stream commands (XREADGROUP, ...) are Redis client spans. Sync and async,
on two real Redis servers, with the real SDK."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
import redis
import redis.asyncio as aioredis

from settle.embedded import EmbeddedRedis
from settle.progress import (
    AsyncProgressStore,
    AsyncStreamConsumer,
    EffectContext,
    ProgressStore,
    StreamConsumer,
)
from tests.progress.harness import Names, publish
from tests.telemetry.conftest import Telemetry, script_operation


def _check(otel: Telemetry, names: Names, stream: EmbeddedRedis) -> None:
    stream_port = stream.port
    host = urlsplit(stream.url).hostname
    settles = [s for s in otel.spans() if (s.attributes or {}).get("messaging.operation.type")]
    assert sorted(s.attributes["messaging.operation.name"] for s in settles) == ["ack", "release"]
    for span in settles:
        a = span.attributes
        assert span.kind.name == "CLIENT"
        assert span.name == f"{a['messaging.operation.name']} {names.stream}"
        assert a["messaging.system"] == "redis"
        assert a["messaging.operation.type"] == "settle"
        assert a["messaging.destination.name"] == names.stream
        assert a["messaging.consumer.group.name"] == names.group
        assert a["settle.outcome"] in ("acked", "released")
        # The broker, which the messaging conventions require when known: the stream's
        # server (its Redis spans inside said it, the messaging span did not).
        assert a["server.address"] == host
        assert a["server.port"] == stream_port
        assert "db.namespace" not in a  # a Redis span's attribute, not a messaging one's
        inside = otel.children(span)
        scripts = [c.attributes.get("db.stored_procedure.name") for c in inside]
        assert scripts[0] == "stream_settle"  # on the stream's server, then the receipt
        assert inside[0].attributes["server.port"] == stream_port
        assert len(scripts) == 2
    group = {
        "messaging.consumer.group.name": names.group,
        "messaging.destination.name": names.stream,
    }
    assert otel.count("messaging.client.operation.duration", **group) == 2
    server = {"server.address": host, "server.port": stream_port}
    assert otel.count("messaging.client.operation.duration", **group, **server) == 2
    # The boundaries (seconds) the messaging semantic conventions give this histogram: the
    # SDK's default ones, made for milliseconds, put every settlement in (0, 5 s].
    for point in otel.points("messaging.client.operation.duration", **group):
        assert list(point.explicit_bounds) == [
            0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10,
        ]  # fmt: skip
    for kind, outcome in (("ack", "acked"), ("release", "released")):
        attrs = {"messaging.operation.name": kind, "settle.outcome": outcome}
        assert otel.count("settle.progress.settlements", **group, **attrs) == 1
    commands = {s.attributes.get("db.operation.name") for s in otel.spans()}
    assert {"XREADGROUP", "XAUTOCLAIM", "XRANGE", script_operation(stream_port)} <= commands
    for span in otel.spans():
        assert "payload-" not in repr(dict(span.attributes or {}))


def _effect(ctx: EffectContext) -> None:
    if ctx.emission.value == "bad":
        raise RuntimeError("the effect failed")


def test_sync_settlements_are_messaging_spans(
    names: Names,
    stream_server: EmbeddedRedis,
    progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    otel: Telemetry,
) -> None:
    store = ProgressStore.from_url(progress_server.url, consumer=names.consumer)
    consumer = StreamConsumer(
        redis.Redis.from_url(stream_server.url), store, stream=names.stream, group=names.group,
        block=0.01,
    )  # fmt: skip
    consumer.start()
    publish(stream_client, names, ["good", "bad"])
    consumer.poll(_effect)
    consumer.close()
    _check(otel, names, stream_server)


@pytest.mark.asyncio
async def test_async_settlements_are_messaging_spans(
    names: Names,
    stream_server: EmbeddedRedis,
    progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    otel: Telemetry,
) -> None:
    store = AsyncProgressStore.from_url(progress_server.url, consumer=names.consumer)
    consumer = AsyncStreamConsumer(
        aioredis.Redis.from_url(stream_server.url), store, stream=names.stream,
        group=names.group, block=0.01,
    )  # fmt: skip
    await consumer.start()
    publish(stream_client, names, ["good", "bad"])

    async def effect(ctx: EffectContext) -> None:
        _effect(ctx)

    await consumer.poll(effect)
    await consumer.aclose()
    _check(otel, names, stream_server)
