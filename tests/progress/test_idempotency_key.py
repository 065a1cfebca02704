"""The effect's idempotency key names one (consumer, emission) and no other, whatever ``:``
the names hold: real stream consumers on a real stream server and a real progress server.

``EffectContext.idempotency_key`` was ``<consumer>:<emission id>``: consumer ``billing:eu``
with emission ``order-1`` and consumer ``billing`` with emission ``eu:order-1`` got the same
key, and an effect store deduplicating by it (as the docs tell it to) skipped the second
one's effect while progress recorded it applied and the delivery was acknowledged: an effect
lost for good."""

from __future__ import annotations

import uuid

import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import given
from hypothesis import strategies as st

from settle._input import key_part
from settle.cursor._core import event_key
from settle.embedded import EmbeddedRedis
from settle.progress import (
    AsyncProgressStore,
    AsyncStreamConsumer,
    DeliveryId,
    EffectContext,
    EmissionId,
    ProgressStore,
    StreamConsumer,
)
from settle.progress.identity import AttemptId

#: Two progress consumers (each with a consumer group of its own) on one stream.
CONSUMERS = ("billing", "billing:eu")
#: Emissions whose keys collided across them: billing + eu:order-1 / billing:eu + order-1.
EMISSIONS = ("eu:order-1", "order-1")


def publish(url: str, stream: str) -> None:
    client = redis.Redis.from_url(url)
    for emission in EMISSIONS:
        client.xadd(stream, {"emission_id": emission})
    client.close()


def test_two_consumers_never_share_an_effect_through_a_colon_in_a_name(
    stream_server: EmbeddedRedis, progress_server: EmbeddedRedis
) -> None:
    stream, namespace = f"orders-{uuid.uuid4().hex[:8]}", f"k{uuid.uuid4().hex[:8]}"
    publish(stream_server.url, stream)
    done: dict[str, tuple[str, str]] = {}  # one effect store shared by both consumers
    ran: list[tuple[str, str]] = []

    for name in CONSUMERS:

        def effect(ctx: EffectContext) -> None:
            if ctx.idempotency_key in done:
                return  # deduplicated, as the docs say an effect must be
            done[ctx.idempotency_key] = (ctx.consumer, ctx.emission.value)
            ran.append((ctx.consumer, ctx.emission.value))

        store = ProgressStore.from_url(progress_server.url, consumer=name, namespace=namespace)
        with StreamConsumer(
            redis.Redis.from_url(stream_server.url),
            store,
            stream=stream,
            group=name.replace(":", "-"),
            block=0.01,
        ) as consumer:
            consumer.poll(effect)

    assert sorted(ran) == sorted((c, e) for c in CONSUMERS for e in EMISSIONS)
    assert len(done) == 4


@pytest.mark.parametrize(
    ("consumer", "emission", "key"),
    [
        ("billing", "order-1", "billing:order-1"),  # a name without ':' or '%' is unchanged
        ("billing", "eu:order-1", "billing:eu:order-1"),  # the emission is never escaped
        ("billing:eu", "order-1", "billing%3Aeu:order-1"),
        ("50%:a", "b", "50%25%3Aa:b"),
    ],
)
@pytest.mark.asyncio
async def test_the_key_escapes_a_colon_or_percent_in_the_consumer_name(
    stream_server: EmbeddedRedis,
    progress_server: EmbeddedRedis,
    consumer: str,
    emission: str,
    key: str,
) -> None:
    stream = f"orders-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(stream_server.url)
    client.xadd(stream, {"emission_id": emission})
    client.close()
    keys: list[str] = []

    async def effect(ctx: EffectContext) -> None:
        keys.append(ctx.idempotency_key)

    store = AsyncProgressStore.from_url(progress_server.url, consumer=consumer, namespace="k")
    async with AsyncStreamConsumer(
        aioredis.Redis.from_url(stream_server.url), store, stream=stream, group="g", block=0.01
    ) as worker:
        await worker.poll(effect)
    assert keys == [key]


@given(
    first=st.tuples(st.text(min_size=1), st.text(min_size=1)),
    second=st.tuples(st.text(min_size=1), st.text(min_size=1)),
)
def test_one_escaping_rule_makes_both_keys_and_no_two_names_share_one(
    first: tuple[str, str], second: tuple[str, str]
) -> None:
    """The cursor's ``EventContext.key`` and progress's ``idempotency_key`` write a name by
    the one rule (``settle._input.key_part``), and two (name, id) pairs give one key only
    when they are the same pair."""

    def progress_key(name: str, emission: str) -> str:
        return f"{key_part(name)}:{emission}"

    assert event_key("ns", first[0], first[1]) == f"ns:{progress_key(*first)}"
    if first != second:
        assert progress_key(*first) != progress_key(*second)
    ctx = EffectContext("billing:eu%", EmissionId("a:b"), DeliveryId("1-1"), AttemptId.new())
    assert ctx.idempotency_key == f"{key_part('billing:eu%')}:a:b" == "billing%3Aeu%25:a:b"
