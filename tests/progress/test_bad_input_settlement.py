"""Bad input to settlement planning and to a hand-called settlement is a typed error
(``InvalidDelivery``, an ``InvalidInput``) and settles nothing: real stream and progress
servers for the settlement, the pure planning functions as exported.

Before, a delivery id given as a plain string, a ``batch_size`` of 2.5 or a ``pending``
of None escaped planning as Python's ``TypeError``, and a kind given as the string
``"ack"`` escaped ``settle()`` as ``AttributeError`` or, for a covered delivery, was
acknowledged on the stream's server before its receipt was refused: the provider was told,
progress kept no receipt, and the caller got an error."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from settle.embedded import EmbeddedRedis
from settle.errors import InvalidInput, SettleError
from settle.progress import (
    AsyncProgressStore,
    AsyncStreamConsumer,
    DeliveryId,
    EffectContext,
    EmissionId,
    IntentKind,
    ProgressStore,
    StreamConsumer,
    plan_settlements,
)
from settle.progress.errors import InvalidDelivery
from settle.progress.identity import SettlementAuthority
from settle.progress.planning import (
    authorize_batch,
    authorize_cumulative,
    authorize_individual,
    authorize_settlement,
)
from tests.progress.harness import Names, pending_ids, publish
from tests.progress.test_planning import d, progress

PROGRESS = progress(3, applied=(5,), gaps=(4,))

BAD: list[tuple[str, Callable[[], Any]]] = [
    ("plan: a str id", lambda: plan_settlements(PROGRESS, ["1000-1"])),  # type: ignore[list-item]
    ("plan: pending None", lambda: plan_settlements(PROGRESS, None)),  # type: ignore[arg-type]
    ("plan: pending a str", lambda: plan_settlements(PROGRESS, "1000-1")),  # type: ignore[arg-type]
    ("plan: batch 2.5", lambda: plan_settlements(PROGRESS, [d(1)], batch_size=2.5)),  # type: ignore[arg-type]
    ("plan: batch True", lambda: plan_settlements(PROGRESS, [d(1)], batch_size=True)),
    ("plan: cumulative 'no'", lambda: plan_settlements(PROGRESS, [d(1)], cumulative="no")),  # type: ignore[arg-type]
    ("plan: not a Progress", lambda: plan_settlements({}, [d(1)])),  # type: ignore[arg-type]
    ("individual: a str id", lambda: authorize_individual(PROGRESS, "1000-1")),  # type: ignore[arg-type]
    ("cumulative: a str id", lambda: authorize_cumulative(PROGRESS, "1000-1")),  # type: ignore[arg-type]
    ("batch: str ids", lambda: authorize_batch(PROGRESS, ["1000-1"])),  # type: ignore[list-item]
    ("batch: one str", lambda: authorize_batch(PROGRESS, "1000-1")),  # type: ignore[arg-type]
    ("settlement: kind 'ack'", lambda: authorize_settlement(PROGRESS, d(1), "ack")),  # type: ignore[arg-type]
    ("settlement: kind 'defer'", lambda: authorize_settlement(PROGRESS, d(4), "defer")),  # type: ignore[arg-type]
    ("settlement: a str id", lambda: authorize_settlement(PROGRESS, "1-1", IntentKind.ACK)),  # type: ignore[arg-type]
    ("covers: a str id", lambda: PROGRESS.covers("1000-1")),  # type: ignore[arg-type]
    # A release needs no progress, but its delivery is still a DeliveryId.
    ("release: a str id", lambda: authorize_settlement(PROGRESS, "1-1", IntentKind.RELEASE)),  # type: ignore[arg-type]
    # An empty str is no list of ids either (iterated, it held none: an empty plan).
    ("plan: pending ''", lambda: plan_settlements(PROGRESS, "")),  # type: ignore[arg-type]
    ("batch: members ''", lambda: authorize_batch(PROGRESS, "")),  # type: ignore[arg-type]
    ("batch: members None", lambda: authorize_batch(PROGRESS, None)),  # type: ignore[arg-type]
    ("individual: not a Progress", lambda: authorize_individual({}, d(1))),  # type: ignore[arg-type]
    ("batch: not a Progress", lambda: authorize_batch({}, [d(1)])),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("what", "call"), BAD, ids=[what for what, _ in BAD])
def test_bad_input_to_planning_is_a_typed_error(what: str, call: Callable[[], Any]) -> None:
    with pytest.raises(InvalidInput) as caught:
        call()
    assert isinstance(caught.value, SettleError)


def test_good_input_still_plans_as_before() -> None:
    plan = plan_settlements(PROGRESS, (d(1), d(5), d(4)), cumulative=True, batch_size=0)
    assert [type(s).__name__ for s in plan.settlements] == ["Cumulative", "Individual"]
    assert plan.withheld == (d(4),)
    assert authorize_batch(PROGRESS, iter([d(5), d(2)])).members == (d(2), d(5))


Covered = tuple[ProgressStore, StreamConsumer, SettlementAuthority]


@pytest.fixture
def covered(
    names: Names,
    stream_server: EmbeddedRedis,
    progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
) -> Iterator[Covered]:
    """A started consumer with one delivery applied and recorded (covered) whose ack never
    went out (the worker died before it): pending for this worker, so any settlement of it
    would be authorized."""
    store = ProgressStore.from_url(
        progress_server.url, consumer=names.consumer, namespace=names.namespace
    )
    with StreamConsumer(
        redis.Redis.from_url(stream_server.url),
        store,
        stream=names.stream,
        group=names.group,
        block=0.01,
    ) as consumer:
        consumer.start()
        (delivery,) = publish(stream_client, names, ["e1"])
        stream_client.xreadgroup(names.group, consumer.worker, {names.stream: ">"})

        def effect(ctx: EffectContext) -> None:
            pass

        store.apply(consumer.scope, DeliveryId(delivery), EmissionId("e1"), effect)  # type: ignore[arg-type]
        yield store, consumer, SettlementAuthority(consumer.worker, DeliveryId(delivery), 1)


@pytest.mark.parametrize("kind", ["ack", "release", None])
def test_a_settlement_by_hand_with_a_kind_of_the_wrong_type_settles_nothing(
    names: Names, stream_client: redis.Redis, covered: Covered, kind: Any
) -> None:
    store, consumer, authority = covered
    delivery = authority.delivery.value
    receipts = store.receipts(consumer.scope)  # type: ignore[arg-type]
    with pytest.raises(InvalidDelivery, match="IntentKind"):
        consumer.settle(authority, kind)
    assert delivery in pending_ids(stream_client, names)  # the provider was told nothing
    assert store.receipts(consumer.scope) == receipts  # type: ignore[arg-type]
    with pytest.raises(InvalidDelivery, match="SettlementAuthority"):
        consumer.settle((consumer.worker, delivery, 1), IntentKind.ACK)  # type: ignore[arg-type]
    assert delivery in pending_ids(stream_client, names)


#: The other arguments of a hand-called settlement, each of the wrong type or out of range.
#: Before, an emission given as a plain string escaped as ``AttributeError``; a ``reason``
#: of None reached the client and came back as a ``BackendError`` saying the settlement
#: might have run; a ``fenced_count`` of 0 or "no" was taken by its truth value (0 settled
#: the delivery unfenced, "no" fenced it); a reason of 5 or of 100 000 characters was
#: written to the dead-letter record as given.
BAD_ARGUMENTS: dict[str, dict[str, Any]] = {
    "emission a str": {"emission": "e1"},
    "reason None": {"reason": None},
    "reason 5": {"reason": 5},
    "reason too long": {"reason": "x" * 100_000},
    "fenced_count 0": {"fenced_count": 0},
    "fenced_count 'no'": {"fenced_count": "no"},
}


@pytest.mark.parametrize("arguments", BAD_ARGUMENTS.values(), ids=list(BAD_ARGUMENTS))
def test_a_settlement_by_hand_with_a_bad_argument_settles_nothing(
    names: Names, stream_client: redis.Redis, covered: Covered, arguments: dict[str, Any]
) -> None:
    store, consumer, authority = covered
    receipts = store.receipts(consumer.scope)  # type: ignore[arg-type]
    with pytest.raises(InvalidDelivery):
        consumer.settle(authority, IntentKind.DEAD_LETTER, **arguments)
    assert authority.delivery.value in pending_ids(stream_client, names)
    assert stream_client.xlen(consumer.dead_letter_key) == 0
    assert store.receipts(consumer.scope) == receipts  # type: ignore[arg-type]
    # The same settlement with good arguments goes through.
    receipt = consumer.settle(authority, IntentKind.ACK, EmissionId("e1"), fenced_count=False)
    assert receipt.outcome.value == "acked"


@pytest.mark.asyncio
async def test_an_async_settlement_by_hand_with_a_bad_argument_settles_nothing(
    names: Names,
    stream_server: EmbeddedRedis,
    progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
) -> None:
    store = AsyncProgressStore.from_url(
        progress_server.url, consumer=names.consumer, namespace=names.namespace
    )
    async with AsyncStreamConsumer(
        aioredis.Redis.from_url(stream_server.url),
        store,
        stream=names.stream,
        group=names.group,
        block=0.01,
    ) as consumer:
        await consumer.start()
        (delivery,) = publish(stream_client, names, ["e1"])
        stream_client.xreadgroup(names.group, consumer.worker, {names.stream: ">"})

        async def effect(ctx: EffectContext) -> None:
            pass

        await store.apply(consumer.scope, DeliveryId(delivery), EmissionId("e1"), effect)
        authority = SettlementAuthority(consumer.worker, DeliveryId(delivery), 1)
        for arguments in BAD_ARGUMENTS.values():
            with pytest.raises(InvalidDelivery):
                await consumer.settle(authority, IntentKind.DEAD_LETTER, **arguments)
        assert delivery in pending_ids(stream_client, names)
        assert stream_client.xlen(consumer.dead_letter_key) == 0
