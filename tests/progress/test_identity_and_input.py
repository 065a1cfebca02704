"""Distinct identity types, bad input rejected with typed errors before anything is written,
keys that share one hash slot per script, and the generated sync shell kept in step."""

from __future__ import annotations

import math

import pytest
import redis
import redis.asyncio as aioredis
from redis.crc import key_slot

from settle.errors import CorruptRecord, InvalidInput, SettleError
from settle.progress import (
    ApplyStatus,
    AsyncProgressStore,
    AsyncStreamConsumer,
    DeliveryId,
    EmissionId,
    ProgressStore,
    ProviderScope,
    StreamConsumer,
)
from settle.progress._core import MAX_BATCH, MAX_LISTING, ProgressCore
from settle.progress._keys import ProgressKeys, StreamKeys
from settle.progress.errors import DeferDelivery, InvalidDelivery, UnprovenListing
from settle.progress.identity import AttemptId, SettlementAuthority
from settle.progress.models import IntentKind
from tests.progress.harness import publish

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


def test_delivery_ids_and_authorities_redis_would_refuse_are_refused_here():
    """Each part of an entry id is an unsigned 64-bit integer and no entry is 0-0: such ids
    were taken for covered (0-0, below every floor) or sent to the provider, whose refusal
    read as a lost group. An authority names a worker and a delivery count."""
    top = 2**64 - 1
    assert DeliveryId(f"{top}-{top}").ms == top
    for bad in ("0-0", f"{top + 1}-0", f"1-{top + 1}", "\u0661-1", "1-1\n", "00-000"):
        with pytest.raises(InvalidDelivery):
            DeliveryId(bad)
    d = DeliveryId("1-1")
    for worker, delivery, count in (
        ("", d, 1),
        ("w\n", d, 1),
        ("w", "1-1", 1),
        ("w", d, True),
        ("w", d, -1),
        ("w", d, 2**53),
        ("w", d, 1.0),
    ):
        with pytest.raises(InvalidDelivery):
            SettlementAuthority(worker, delivery, count)  # type: ignore[arg-type]
    for reason in ("", "x" * 257, None):
        with pytest.raises(InvalidDelivery):
            DeferDelivery(reason)  # type: ignore[arg-type]


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u202e", "\x85", "\ud800"])
def test_names_with_a_line_separator_or_a_bidi_override_are_refused(separator):
    """U+2028 / U+2029 break a line in a log viewer or a terminal as LF does (and NEL,
    U+0085, a control character beyond ASCII), and a bidi override reorders what an operator
    reads; a lone surrogate cannot be encoded to be stored: refused in every progress name,
    as in an operation id (one rule for every part)."""
    d = DeliveryId("1-1")
    for make in (
        lambda: EmissionId(f"e{separator}1"),
        lambda: AttemptId(f"a{separator}1"),
        lambda: SettlementAuthority(f"w{separator}", d, 1),
    ):
        with pytest.raises(InvalidDelivery, match="control characters"):
            make()


def test_a_worker_name_the_authority_refuses_is_refused_when_the_consumer_is_made(
    progress_server, names
):
    """Checked at handling time only, a bad worker name let XREADGROUP hand the worker a
    delivery first, then stopped run() with the delivery pending."""
    store = ProgressStore.from_url(
        progress_server.url, consumer=names.consumer, namespace=names.namespace
    )
    for worker in ("w" * 300, "a\tb"):
        with pytest.raises(InvalidDelivery):
            StreamConsumer(
                redis.Redis.from_url(progress_server.url),
                store,
                stream="s",
                group="g",
                worker=worker,
            )
    long_consumer = ProgressStore.from_url(progress_server.url, consumer="c" * 256)
    made = StreamConsumer(
        redis.Redis.from_url(progress_server.url), long_consumer, stream="s", group="g"
    )
    assert len(made.worker) <= 256  # the default name fits too
    store.close()
    long_consumer.close()


BAD_OPTIONS = [
    *({"max_deliveries": v} for v in (0, -1, "5", True, 5.0, None)),
    *({"batch": v} for v in (0, -1, True, 1.5, "32", MAX_BATCH + 1)),
    *({"listing": v} for v in (0, True, "512", MAX_LISTING + 1)),
    *({"claim_idle": v} for v in (0, -1.0, math.nan, math.inf, "30", True, None, 1e300)),
    *({"block": v} for v in (-0.5, math.nan, math.inf, "1")),
    *({"retry_pause": v} for v in (-1, math.nan, math.inf)),
    # an int no float holds: math.isfinite raised OverflowError on it
    *({name: 10**400} for name in ("claim_idle", "block", "retry_pause")),
    # a lone surrogate names no stream field: every delivery would be dead-lettered
    *({"emission_field": v} for v in (b"emission_id", "", None, 5, "emission_\udc80")),
]


@pytest.mark.asyncio
@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("option", BAD_OPTIONS, ids=repr)
async def test_a_bad_consumer_option_is_refused_when_the_consumer_is_made(
    flavour, option, stream_server, progress_server, stream_client, progress_client, names
):
    """Accepted, these dead-lettered every delivery (max_deliveries below 1, a bytes
    emission_field), failed every poll (batch or listing 0), raised a TypeError with the
    delivery already pending (a str max_deliveries), or became 1 ms (claim_idle -1)."""
    publish(stream_client, names, ["e1"])
    store_type, consumer_type, client_type = {
        "sync": (ProgressStore, StreamConsumer, redis.Redis),
        "async": (AsyncProgressStore, AsyncStreamConsumer, aioredis.Redis),
    }[flavour]
    store = store_type.from_url(
        progress_server.url, consumer=names.consumer, namespace=names.namespace
    )
    client = client_type.from_url(stream_server.url)
    [what] = option
    with pytest.raises(InvalidInput, match=what):
        consumer_type(client, store, stream=names.stream, group=names.group, **option)
    if flavour == "async":
        await store.aclose()
        await client.aclose()
    else:
        store.close()
        client.close()
    # Nothing was sent: no group, no incarnation marker, no progress.
    assert stream_client.xinfo_groups(names.stream) == []
    assert not stream_client.exists(StreamKeys(names.stream).incarnation)
    tag = ProgressKeys(names.namespace, names.consumer).tag
    assert list(progress_client.scan_iter(match=f"{tag}*")) == []


def test_the_least_consumer_options_are_accepted(progress_server, names):
    store = ProgressStore.from_url(progress_server.url, consumer=names.consumer)
    with StreamConsumer(
        redis.Redis.from_url(progress_server.url),
        store,
        stream="s",
        group="g",
        emission_field="e",
        max_deliveries=1,
        claim_idle=0.0001,
        batch=1,
        block=0,
        listing=1,
        retry_pause=0,
    ) as made:
        assert (made.options.claim_idle_ms, made.options.block_ms) == (1, 1)
        assert made.options.retry_pause == 0.0


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
    for count in (-7, True, 2**53, 10**5000):  # a count beyond what is stored exactly
        with pytest.raises(InvalidDelivery):
            store.dead_letter(
                SCOPE, DeliveryId("1-0"), EmissionId("e1"), reason="poison", delivery_count=count
            )
        with pytest.raises(InvalidDelivery):
            store.observe(SCOPE, None, [], last_delivered=None, oldest_pending=None, pending=count)
    for cap in (0, -1, "abc", True, 10**5000):  # XADD MAXLEN ~ cap: refused, never sent
        with pytest.raises(InvalidInput):
            ProgressStore.from_url(
                progress_server.url, consumer=names.consumer, namespace="t", receipts_cap=cap
            )
    assert called == []
    assert progress_client.dbsize() == before
    store.close()


def _scan(client: redis.Redis) -> dict[bytes, object]:
    """Every key of the progress server with its value (hashes as dicts)."""
    out: dict[bytes, object] = {}
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        out[key] = client.hgetall(key) if kind == b"hash" else client.dump(key)
    return out


@pytest.mark.parametrize(
    ("where", "field", "value"),
    [
        ("meta", b"floor", b"garbage"),  # a floor that is not a delivery id
        ("meta", b"floor", b"009-0"),  # leading zeros: compared by length, 10-0 was covered
        ("meta", b"ver", b"x"),  # HINCRBY failed after the applied mark was written
        ("applied", b"bogus", b"e?"),  # an applied id the floor cannot be compared with
        ("emission", b"state", b"done"),  # a state settle never writes: the effect ran again
        ("emission", b"attempts", b"junk"),  # HINCRBY failed after the state was written
    ],
)
def test_progress_settle_never_writes_is_corrupt_and_nothing_is_written(
    progress_server, progress_client, names, where, field, value
):
    """A (consumer, scope) or an emission holding what settle never writes (another writer,
    an older layout) is refused with CorruptRecord by every script that reads it, before
    it writes anything, and the effect never runs: scripts once failed with a raw Lua error after
    their first writes, overwrote an unknown emission state and ran the effect again, or
    covered a delivery by a floor with leading zeros."""
    store = ProgressStore.from_url(
        progress_server.url, consumer=names.consumer, namespace=names.namespace
    )
    store.apply(SCOPE, DeliveryId("1-0"), EmissionId("e1"), lambda ctx: None)
    meta, applied = ProgressKeys(names.namespace, names.consumer).scope(SCOPE.scope_id)[:2]
    emission = ProgressKeys(names.namespace, names.consumer).emission(EmissionId("e10"))
    key = {"meta": meta, "applied": applied, "emission": emission}[where]
    progress_client.hset(key, field, value)
    before = _scan(progress_client)
    ran: list[object] = []
    if where != "applied":  # an applied id is read (compared) by observe's advance only
        with pytest.raises(CorruptRecord):
            store.apply(SCOPE, DeliveryId("10-0"), EmissionId("e10"), ran.append)
    if where != "emission":
        with pytest.raises(CorruptRecord):
            store.observe(
                SCOPE,
                None,
                [DeliveryId("1-0"), DeliveryId("10-0")],
                last_delivered=DeliveryId("10-0"),
                oldest_pending=None,
                pending=1,
            )
    assert ran == []
    assert _scan(progress_client) == before
    store.close()


def test_a_listing_that_starts_above_the_floor_proves_nothing(progress_server, names):
    store = ProgressStore.from_url(
        progress_server.url, consumer=names.consumer, namespace=names.namespace
    )
    store.apply(SCOPE, DeliveryId("5-0"), EmissionId("e5"), lambda ctx: None)
    before = store.read(SCOPE)
    with pytest.raises(UnprovenListing, match="above the progress floor"):
        store.observe(
            SCOPE,
            DeliveryId("4-0"),
            [DeliveryId("5-0")],
            last_delivered=DeliveryId("9-0"),
            oldest_pending=DeliveryId("5-0"),
            pending=3,
        )
    assert store.read(SCOPE) == before  # nothing written: no provider floor, no version
    assert before.provider_floor is None
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
        core.plan_evidence(scope),
    ]
    for call in calls:
        assert len({key_slot(k.encode()) for k in call.keys}) == 1, call.script
    assert key_slot(StreamKeys(stream).dead_letters.encode()) == key_slot(stream.encode())
    assert ProgressKeys("t", "billing").tag in core.plan_read(scope).keys[0]


def test_a_delivery_id_handed_out_again_for_another_emission_is_not_covered(progress_server, names):
    """The provider hands out one id twice (explicit ids, a stream deleted and made again,
    a failover that lost the tail): progress holds 5-1 applied as emission A, and 5-1 now
    carries emission B. Covered by delivery id alone, B was acknowledged and its effect
    never ran. Above the floor the emission is compared: B is applied, A never twice."""
    store = ProgressStore.from_url(
        progress_server.url, consumer=names.consumer, namespace=names.namespace
    )
    ran: list[str] = []
    d = DeliveryId("5-1")
    first = store.apply(SCOPE, d, EmissionId("A"), lambda ctx: ran.append(ctx.emission.value))
    assert first.status is ApplyStatus.APPLIED
    again = store.apply(SCOPE, d, EmissionId("A"), lambda ctx: ran.append(ctx.emission.value))
    assert again.status is ApplyStatus.COVERED  # the same delivery again: settled, not run
    other = store.apply(SCOPE, d, EmissionId("B"), lambda ctx: ran.append(ctx.emission.value))
    assert other.status is ApplyStatus.APPLIED
    assert ran == ["A", "B"]
    old = store.apply(SCOPE, d, EmissionId("A"), lambda ctx: ran.append(ctx.emission.value))
    assert old.status is not ApplyStatus.APPLIED  # A is applied already: never twice
    assert ran == ["A", "B"]
    assert other.progress.covers(d)
    # Deferring or dead-lettering the id as yet another emission is not "covered" either.
    assert store.defer(SCOPE, d, EmissionId("C"), reason="later").code == "deferred"
    # ... and the floor never passes that deferral, though the id is recorded as applied.
    held = store.observe(SCOPE, None, [d], last_delivered=d, oldest_pending=None, pending=0)
    assert held.floor is None
    assert (
        store.dead_letter(SCOPE, d, EmissionId("D"), reason="poison", delivery_count=9).code
        == "dead_lettered"
    )
    # A delivery dead-lettered with no known emission (malformed, deleted) covers no
    # emission that arrives at its id later.
    e = DeliveryId("6-1")
    assert store.dead_letter(SCOPE, e, None, reason="malformed", delivery_count=1).code == (
        "dead_lettered"
    )
    late = store.apply(SCOPE, e, EmissionId("E"), lambda ctx: ran.append(ctx.emission.value))
    assert late.status is ApplyStatus.APPLIED
    assert ran == ["A", "B", "E"]
    store.close()


def test_names_in_any_script_with_emoji_and_spaces_are_accepted():
    """The rule refuses control and format characters only: letters of any script, emoji,
    a no-break space are names as any other."""
    d = DeliveryId("1-1")
    for name in ("注文 東京", "café\u00a0crème", "🎉 order", "Ω-7"):
        assert EmissionId(name).value == name
        assert AttemptId(name).value == name
        assert SettlementAuthority(name, d, 1).worker == name
