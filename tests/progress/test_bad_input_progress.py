"""ProgressStore's calls refuse arguments of the wrong type with InvalidDelivery (an
InvalidInput) before anything is sent. ``apply`` with an effect that is no callable used to
claim the emission (``begin`` ran) and then let a TypeError out; ``observe`` and
``record_receipt`` let TypeError / AttributeError out."""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from settle.embedded import EmbeddedRedis
from settle.errors import ConfigurationError
from settle.progress import (
    AsyncProgressStore,
    AsyncStreamConsumer,
    DeliveryId,
    EmissionId,
    ProgressStore,
    ProviderScope,
    StreamConsumer,
)
from settle.progress._core import StreamVerdict
from settle.progress.errors import InvalidDelivery
from settle.progress.models import IntentKind, SettlementOutcome
from tests.progress.harness import Names

SCOPE = ProviderScope("orders", "billing", "inc1")


def _keys(client: redis.Redis) -> dict[bytes, bytes | None]:
    return {k: client.dump(k) for k in client.scan_iter()}


@pytest.fixture
def store(progress_client: redis.Redis, names: Names) -> ProgressStore:
    return ProgressStore(progress_client, consumer=names.consumer, namespace=names.namespace)


@pytest.mark.parametrize(
    ("effect", "fields"),
    [(None, None), ("not callable", None), (lambda ctx: None, [("amount", b"1")])],
    ids=["effect-none", "effect-str", "fields-list"],
)
def test_apply_with_a_bad_effect_or_fields_writes_nothing(
    store: ProgressStore, progress_client: redis.Redis, effect: Any, fields: Any
) -> None:
    before = _keys(progress_client)
    with pytest.raises(InvalidDelivery):
        store.apply(SCOPE, DeliveryId("1-1"), EmissionId("e1"), effect, fields=fields)
    assert _keys(progress_client) == before


@pytest.mark.parametrize(
    "options",
    [
        {"listing": None},
        {"listing": "1-1"},
        {"after": "1-0"},
        {"last_delivered": "1-0"},
    ],
    ids=["listing-none", "listing-str", "after-str", "last-delivered-str"],
)
def test_observe_with_ids_of_the_wrong_type_is_invalid_delivery(
    store: ProgressStore, progress_client: redis.Redis, options: dict[str, Any]
) -> None:
    call: dict[str, Any] = {
        "after": None,
        "listing": [],
        "last_delivered": None,
        "oldest_pending": None,
        "pending": 0,
        **options,
    }
    after, listing = call.pop("after"), call.pop("listing")
    before = _keys(progress_client)
    with pytest.raises(InvalidDelivery):
        store.observe(SCOPE, after, listing, **call)
    assert _keys(progress_client) == before


def test_record_receipt_with_a_kind_of_the_wrong_type_is_invalid_delivery(
    store: ProgressStore, progress_client: redis.Redis
) -> None:
    before = _keys(progress_client)
    with pytest.raises(InvalidDelivery):
        store.record_receipt(SCOPE, DeliveryId("1-1"), "ack", None, "w1")  # type: ignore[arg-type]
    with pytest.raises(InvalidDelivery):
        store.record_receipt(SCOPE, DeliveryId("1-1"), IntentKind.ACK, None, "w1")  # type: ignore[arg-type]
    assert _keys(progress_client) == before


def test_a_stream_consumer_refuses_a_store_of_the_other_flavour(
    stream_client: redis.Redis, progress_server: EmbeddedRedis, names: Names
) -> None:
    """A StreamConsumer given an AsyncProgressStore opened the scope on the stream's server
    (its group and incarnation written) and then failed with AttributeError on an unawaited
    coroutine, on every poll."""
    store = AsyncProgressStore(aioredis.Redis.from_url(progress_server.url), consumer="c")
    before = _keys(stream_client)
    with pytest.raises(InvalidDelivery, match="ProgressStore"):
        StreamConsumer(stream_client, store, stream=names.stream, group=names.group)  # type: ignore[arg-type]
    with pytest.raises(InvalidDelivery, match="ProgressStore"):
        StreamConsumer(stream_client, None, stream=names.stream, group=names.group)  # type: ignore[arg-type]
    assert _keys(stream_client) == before


@pytest.mark.asyncio
async def test_an_async_stream_consumer_refuses_a_sync_store(
    stream_server: EmbeddedRedis, progress_server: EmbeddedRedis, names: Names
) -> None:
    """The asyncio twin of the check above: an AsyncStreamConsumer given a ProgressStore
    would await its plain replies."""
    store = ProgressStore(redis.Redis.from_url(progress_server.url), consumer="c")
    client = aioredis.Redis.from_url(stream_server.url)
    try:
        with pytest.raises(InvalidDelivery, match="AsyncProgressStore"):
            AsyncStreamConsumer(client, store, stream=names.stream, group=names.group)  # type: ignore[arg-type]
    finally:
        await client.aclose()
        store.close()


@pytest.mark.parametrize(
    ("kind", "worker"),
    [("ack", "w1"), (IntentKind.ACK, ""), (IntentKind.ACK, "w\n1"), (IntentKind.ACK, 7)],
    ids=["kind-str", "worker-empty", "worker-line-break", "worker-int"],
)
def test_record_receipt_checks_kind_and_worker_with_a_good_verdict(
    store: ProgressStore, progress_client: redis.Redis, kind: Any, worker: Any
) -> None:
    """Each argument on its own (the test above gives a bad verdict too, which is refused
    whatever the kind): a worker no receipt can name is refused, not stored."""
    verdict = StreamVerdict(SettlementOutcome.ACKED, None, 1, 1)
    before = _keys(progress_client)
    with pytest.raises(InvalidDelivery):
        store.record_receipt(SCOPE, DeliveryId("1-1"), kind, verdict, worker)
    assert _keys(progress_client) == before


@pytest.mark.parametrize("block", [1.0, 2.5])
def test_a_block_the_socket_timeout_would_cut_is_refused_up_front(
    stream_server: EmbeddedRedis, store: ProgressStore, names: Names, block: float
) -> None:
    """``block`` at or over the stream client's socket timeout: every poll that found
    nothing new waited on XREADGROUP past the timeout, so an idle consumer raised
    BackendError on every poll. Refused when the consumer is made, nothing written; a
    shorter block is taken."""
    client = redis.Redis.from_url(stream_server.url, socket_timeout=1.0)
    before = _keys(client)
    try:
        with pytest.raises(ConfigurationError, match=r"block \(.*socket timeout \(1\.0 s\)"):
            StreamConsumer(client, store, stream=names.stream, group=names.group, block=block)
        assert _keys(client) == before
        StreamConsumer(client, store, stream=names.stream, group=names.group, block=0.5).close()
    finally:
        client.close()


@pytest.mark.asyncio
async def test_an_async_consumer_refuses_a_block_the_socket_timeout_would_cut(
    stream_server: EmbeddedRedis, progress_server: EmbeddedRedis, names: Names
) -> None:
    store = AsyncProgressStore(aioredis.Redis.from_url(progress_server.url), consumer="c")
    client = aioredis.Redis.from_url(stream_server.url, socket_timeout=0.5)
    try:
        with pytest.raises(ConfigurationError, match="block"):
            AsyncStreamConsumer(client, store, stream=names.stream, group=names.group, block=1.0)
    finally:
        await client.aclose()
        await store.aclose()


@pytest.mark.parametrize("bad", ["ns\n", "ns\r", "n s", ""])
def test_a_store_refuses_a_namespace_with_a_line_break(
    progress_client: redis.Redis, bad: str
) -> None:
    """``'ns\\n'`` passed the namespace pattern (its ``$`` matches before a final newline):
    every key of the store then held a line feed."""
    with pytest.raises(InvalidDelivery, match="namespace"):
        ProgressStore(progress_client, consumer="w1", namespace=bad)


@pytest.mark.parametrize("name", ["settle:{orders}:wait", "settle:{orders}:waiting"])
def test_a_stream_named_as_the_durability_probe_is_refused_before_anything_is_written(
    stream_client: redis.Redis, store: ProgressStore, names: Names, name: str
) -> None:
    """With ``min_replicas`` every writing script is followed by a probe that sets its
    slot's ``settle:{<tag>}:wait`` key to expire in a week (docs/operations.md): a stream of
    that very name would be set to expire, entries and groups with it. Refused as a name,
    before the scope is opened; a stream whose name only starts as the probe's is another
    key, and is taken."""
    stream_client.xgroup_create(name, names.group, id="0", mkstream=True)
    before = _keys(stream_client)
    consumer = StreamConsumer(stream_client, store, stream=name, group=names.group)
    if name == "settle:{orders}:wait":
        with pytest.raises(InvalidDelivery, match="probe"):
            consumer.start()
        assert _keys(stream_client) == before
        assert stream_client.pttl(name) == -1
    else:
        assert consumer.start().stream == name
