"""Distinct identity types, bad input rejected with typed errors before anything is written,
keys that share one hash slot per script, and the generated sync shell kept in step."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from settle.errors import InvalidInput, SettleError
from settle.progress import DeliveryId, EmissionId, ProgressStore, ProviderScope
from settle.progress._core import ProgressCore
from settle.progress._keys import ProgressKeys, StreamKeys
from settle.progress.errors import InvalidDelivery, UnprovenListing
from settle.progress.identity import AttemptId, SettlementAuthority
from settle.progress.models import IntentKind

SCOPE = ProviderScope("orders", "billing", "inc1")


def test_identities_are_distinct_types():
    assert EmissionId("1-0") != DeliveryId("1-0")
    assert DeliveryId("0001-02") == DeliveryId("1-2")  # normalised
    assert DeliveryId("9-0") < DeliveryId("10-0")  # ordered numerically, not as text
    with pytest.raises(InvalidDelivery):
        DeliveryId("not-an-id")
    for bad in ("", "x" * 257, "a\nb"):
        with pytest.raises(InvalidDelivery) as err:
            EmissionId(bad)
        assert isinstance(err.value, InvalidInput)
        assert isinstance(err.value, SettleError)
    # The settlement authority is a separate value; progress calls never take it as identity.
    authority = SettlementAuthority("w1", DeliveryId("1-0"), 1)
    call = ProgressCore("t", "billing").plan_begin(
        SCOPE, DeliveryId("1-0"), EmissionId("e"), AttemptId("a1")
    )
    assert authority.worker not in call.args


def test_bad_input_raises_before_anything_is_written(progress_server, progress_client, names):
    store = ProgressStore.from_url(
        progress_server.url, consumer=names.consumer, namespace=names.namespace
    )
    called = []
    before = progress_client.dbsize()
    with pytest.raises(InvalidDelivery):
        store.apply(SCOPE, "1-0", "e1", called.append)  # type: ignore[arg-type]
    with pytest.raises(InvalidDelivery):
        store.defer(SCOPE, DeliveryId("1-0"), EmissionId("e1"), reason="")
    with pytest.raises(UnprovenListing):
        store.observe(
            SCOPE,
            None,
            [DeliveryId("2-0"), DeliveryId("1-0")],
            last_delivered=None,
            oldest_pending=None,
            pending=0,
        )
    with pytest.raises(InvalidDelivery):
        ProgressStore.from_url(progress_server.url, consumer="a{b}", namespace="t")
    with pytest.raises(InvalidDelivery):
        StreamKeys("orders}x")
    assert called == []
    assert progress_client.dbsize() == before
    store.close()


def test_a_listing_that_starts_above_the_floor_proves_nothing(progress_server, names):
    store = ProgressStore.from_url(
        progress_server.url, consumer=names.consumer, namespace=names.namespace
    )
    store.apply(SCOPE, DeliveryId("5-0"), EmissionId("e5"), lambda ctx: None)
    p = store.observe(
        SCOPE,
        DeliveryId("4-0"),
        [DeliveryId("5-0")],
        last_delivered=None,
        oldest_pending=None,
        pending=0,
    )
    assert p.floor is None
    assert p.applied_above_floor == (DeliveryId("5-0"),)
    p = store.observe(
        SCOPE,
        None,
        [DeliveryId("4-0"), DeliveryId("5-0")],
        last_delivered=None,
        oldest_pending=None,
        pending=0,
    )
    assert p.floor is None
    assert p.gaps == (DeliveryId("4-0"),)
    store.close()


@pytest.mark.parametrize("stream", ["orders", "{app}:orders", "app:{tenant-7}:orders"])
def test_every_script_call_touches_one_slot(stream):
    core = ProgressCore("t", "billing")
    scope = ProviderScope(stream, "g", "inc")
    d, e, a = DeliveryId("1-0"), EmissionId("weird{}key"), AttemptId("a")
    calls = [
        core.plan_begin(scope, d, e, a),
        core.plan_record(scope, d, e, a),
        core.plan_dead_letter(scope, d, e, "poison", 3),
        core.plan_defer(scope, d, e, "later"),
        core.plan_read(scope),
        core.plan_scopes(),
        core.plan_stream_scope(stream, "g"),
        core.plan_stream_settle(scope, SettlementAuthority("w", d, 1), IntentKind.ACK),
    ]
    for call in calls:
        assert len({key_slot(k.encode()) for k in call.keys}) == 1, call.script
    assert key_slot(StreamKeys(stream).dead_letters.encode()) == key_slot(stream.encode())
    assert ProgressKeys("t", "billing").tag in core.plan_read(scope).keys[0]
