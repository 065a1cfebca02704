"""ProgressStore's calls refuse arguments of the wrong type with InvalidDelivery (an
InvalidInput) before anything is sent. ``apply`` with an effect that is no callable used to
claim the emission (``begin`` ran) and then let a TypeError out; ``observe`` and
``record_receipt`` let TypeError / AttributeError out."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from settle.embedded import EmbeddedRedis
from settle.errors import ConfigurationError, InvalidInput
from settle.progress import (
    AsyncProgressStore,
    AsyncStreamConsumer,
    DeliveryId,
    EffectContext,
    EmissionId,
    ProgressStore,
    ProviderScope,
    StreamConsumer,
)
from settle.progress._core import StreamVerdict
from settle.progress._keys import ProgressKeys
from settle.progress.errors import DeferDelivery, InvalidDelivery, check_reason, recorded_reason
from settle.progress.models import ApplyStatus, IntentKind, SettlementOutcome
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


_BAD_REASONS = ["line\nfeed", "\x1b[31mred", "para\u2029graph", "lone \ud800 surrogate"]
_BAD_REASON_IDS = ["line-feed", "escape", "paragraph-separator", "lone-surrogate"]


@pytest.mark.parametrize("reason", _BAD_REASONS, ids=_BAD_REASON_IDS)
def test_a_reason_with_a_control_character_is_refused_and_writes_nothing(
    store: ProgressStore, progress_client: redis.Redis, reason: str
) -> None:
    """A deferral's or a dead letter's reason is stored, logged and shown to operators as it
    is. Control characters and line separators were stored (the core refuses them in its
    reasons); a lone surrogate got past the check and failed the script call with a bare
    UnicodeEncodeError."""
    before = _keys(progress_client)
    with pytest.raises(InvalidDelivery, match="reason"):
        store.defer(SCOPE, DeliveryId("1-1"), EmissionId("e1"), reason=reason)
    with pytest.raises(InvalidDelivery, match="reason"):
        store.dead_letter(
            SCOPE, DeliveryId("1-2"), EmissionId("e2"), reason=reason, delivery_count=1
        )
    with pytest.raises(InvalidDelivery, match="reason"):
        DeferDelivery(reason)
    assert _keys(progress_client) == before


@pytest.mark.asyncio
@pytest.mark.parametrize("reason", _BAD_REASONS, ids=_BAD_REASON_IDS)
async def test_the_async_store_refuses_the_same_reasons(
    progress_server: EmbeddedRedis, progress_client: redis.Redis, names: Names, reason: str
) -> None:
    store = AsyncProgressStore(
        aioredis.Redis.from_url(progress_server.url),
        consumer=names.consumer,
        namespace=names.namespace,
    )
    try:
        before = _keys(progress_client)
        with pytest.raises(InvalidDelivery, match="reason"):
            await store.defer(SCOPE, DeliveryId("1-1"), EmissionId("e1"), reason=reason)
        with pytest.raises(InvalidDelivery, match="reason"):
            await store.dead_letter(
                SCOPE, DeliveryId("1-2"), EmissionId("e2"), reason=reason, delivery_count=1
            )
        assert _keys(progress_client) == before
    finally:
        await store.aclose()


def test_an_effect_deferring_with_a_surrogate_in_its_reason_does_not_stop_the_worker(
    stream_client: redis.Redis, store: ProgressStore, names: Names
) -> None:
    """A reason built from a message (text decoded with ``surrogateescape``, say) was
    accepted by ``DeferDelivery``; the defer script then raised UnicodeEncodeError out of
    ``poll()``, which ``run()`` does not survive. Now the effect's ``DeferDelivery(...)``
    itself is refused, so the effect failed: its delivery is released and comes again."""
    stream_client.xadd(names.stream, {"emission_id": "order-1", "note": b"\xff"})

    def effect(ctx: EffectContext) -> None:
        raise DeferDelivery("bad note " + ctx.fields["note"].decode("utf-8", "surrogateescape"))

    with StreamConsumer(stream_client, store, stream=names.stream, group=names.group) as c:
        report = c.poll(effect)
        progress = store.read(c.scope)  # type: ignore[arg-type]
    assert len(report.handled) == 1
    assert progress.deferred == ()
    assert stream_client.xpending(names.stream, names.group)["pending"] == 1  # released


def test_recover_carries_out_an_intent_whose_reason_was_recorded_before_the_check(
    stream_client: redis.Redis,
    progress_client: redis.Redis,
    store: ProgressStore,
    names: Names,
) -> None:
    """An open dead-letter intent recorded with a line feed in its reason (by a settle that
    did not check reasons yet) is read back with it escaped, and ``recover()`` carries it
    out: the refused reason does not stop recovery."""
    delivery = DeliveryId(stream_client.xadd(names.stream, {"emission_id": "order-1"}).decode())
    with StreamConsumer(stream_client, store, stream=names.stream, group=names.group) as c:
        scope = c.start()
        stream_client.xreadgroup(names.group, c.worker, {names.stream: ">"})
        store.dead_letter(scope, delivery, EmissionId("order-1"), reason="x", delivery_count=1)
        intents = ProgressKeys(names.namespace, names.consumer).scope(scope.scope_id)[4]
        item = json.loads(progress_client.hget(intents, delivery.value))  # type: ignore[arg-type]
        progress_client.hset(intents, delivery.value, json.dumps({**item, "reason": "a\nb"}))
        assert [i.reason for i in store.read(scope).intents] == ["a\\nb"]
        [receipt] = c.recover()
    assert receipt.outcome is SettlementOutcome.ACKED
    [(_, fields)] = stream_client.xrange(c.dead_letter_key)
    assert fields[b"reason"] == b"a\\nb"


def test_an_async_effect_given_to_the_sync_consumer_is_refused_and_its_delivery_kept(
    stream_client: redis.Redis, store: ProgressStore, names: Names
) -> None:
    """The sync shell called an ``async def`` effect and never awaited it: the effect did
    not run, yet progress recorded the delivery applied, the emission applied (a later
    publication of it a duplicate) and the provider acknowledged it: lost for good, with a
    RuntimeWarning. Now ``poll()`` raises InvalidInput, nothing is recorded or
    acknowledged, and a worker whose effect runs applies the delivery."""
    stream_client.xadd(names.stream, {"emission_id": "order-1", "amount": "5"})

    async def effect(ctx: EffectContext) -> None:
        raise AssertionError("never awaited")  # pragma: no cover

    with StreamConsumer(
        stream_client, store, stream=names.stream, group=names.group, claim_idle=0.001
    ) as consumer:
        with pytest.raises(InvalidInput, match="AsyncStreamConsumer"):
            consumer.poll(effect)  # type: ignore[arg-type]
        assert stream_client.xpending(names.stream, names.group)["pending"] == 1
        scope = consumer.scope
        assert scope is not None
        assert store.read(scope).applied_above_floor == ()

        ran: list[str] = []
        report = consumer.poll(lambda ctx: ran.append(ctx.idempotency_key))
    assert ran == [f"{names.consumer}:order-1"]
    assert [r.outcome for r in report.receipts] == [SettlementOutcome.ACKED]


def test_the_store_refuses_an_async_effect_and_applies_it_later(store: ProgressStore) -> None:
    async def effect(ctx: EffectContext) -> None:
        raise AssertionError("never awaited")  # pragma: no cover

    with pytest.raises(InvalidInput, match="never awaited"):
        store.apply(SCOPE, DeliveryId("1-1"), EmissionId("e1"), effect)  # type: ignore[arg-type]
    ran: list[str] = []
    applied = store.apply(SCOPE, DeliveryId("1-1"), EmissionId("e1"), lambda c: ran.append("x"))
    assert applied.status is ApplyStatus.APPLIED
    assert ran == ["x"]


@pytest.mark.asyncio
async def test_a_plain_effect_given_to_the_async_consumer_runs_once_and_is_recorded(
    stream_server: EmbeddedRedis,
    progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    names: Names,
) -> None:
    """A plain function given as the async consumer's effect has done its work when it
    returns. Awaiting its ``None`` raised TypeError after the work: the effect was taken as
    failed, the delivery released, and every redelivery ran the effect again until it was
    dead-lettered. Its value now stands: the effect runs once, the delivery is applied and
    acknowledged, and the store's ``apply`` takes one as well."""
    stream_client.xadd(names.stream, {"emission_id": "order-1", "amount": "5"})
    store = AsyncProgressStore(
        aioredis.Redis.from_url(progress_server.url),
        consumer=names.consumer,
        namespace=names.namespace,
    )
    client = aioredis.Redis.from_url(stream_server.url)
    ran: list[str] = []
    try:
        async with AsyncStreamConsumer(
            client, store, stream=names.stream, group=names.group, claim_idle=0.001
        ) as consumer:
            report = await consumer.poll(lambda ctx: ran.append(ctx.idempotency_key))  # type: ignore[arg-type,func-returns-value]
            assert [r.outcome for r in report.receipts] == [SettlementOutcome.ACKED]
            again = await consumer.poll(lambda ctx: ran.append("again"))  # type: ignore[arg-type,func-returns-value]
            assert again.receipts == []
        assert ran == [f"{names.consumer}:order-1"]
        assert stream_client.xpending(names.stream, names.group)["pending"] == 0
        applied = await store.apply(
            SCOPE,
            DeliveryId("1-1"),
            EmissionId("e1"),
            lambda c: ran.append("apply"),  # type: ignore[arg-type,func-returns-value]
        )
        assert applied.status is ApplyStatus.APPLIED
        assert ran[-1] == "apply"
    finally:
        await client.aclose()
        await store.aclose()


@pytest.mark.parametrize(
    ("recorded", "read"),
    [("für\nbar", "für\\nbar"), ("\u2028x", "\\u2028x"), ("\n" * 256, "\\n" * 128)],
    ids=["non-ascii-kept", "line-separator", "cut-to-the-limit"],
)
def test_a_reason_recorded_before_is_read_back_as_check_reason_takes_it(
    recorded: str, read: str
) -> None:
    """Only what ``check_reason`` refuses is escaped (a word in another script stays as it
    is), and the escaped reason is cut to its limit, so ``recover()`` can send it."""
    assert recorded_reason(recorded) == read
    assert check_reason(recorded_reason(recorded)) == read
