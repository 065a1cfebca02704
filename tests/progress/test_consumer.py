"""The Redis Streams adapter in one process (sync and async): apply -> progress -> fenced ack,
settlement planning against durable progress, defer, dead-letter and release."""

from __future__ import annotations

import json
import socket

import pytest
import redis
import redis.asyncio as aioredis
from structlog.testing import capture_logs

from settle._log import emission_digest
from settle.embedded import EmbeddedRedis
from settle.progress import (
    ApplyStatus,
    AsyncProgressStore,
    AsyncStreamConsumer,
    DeferDelivery,
    DeliveryId,
    EffectContext,
    EmissionId,
    IntentKind,
    ProgressStore,
    StreamConsumer,
)
from settle.progress._keys import ProgressKeys
from settle.progress.errors import SettlementNotAuthorized
from settle.progress.identity import SettlementAuthority
from settle.progress.models import SettlementOutcome
from tests.progress.harness import (
    Names,
    assert_nothing_acked_uncovered,
    dead_letters_on_stream,
    pending_ids,
    publish,
)


def make(names: Names, stream_server: EmbeddedRedis, progress_server: EmbeddedRedis, **kw):
    store = ProgressStore.from_url(
        progress_server.url, consumer=names.consumer, namespace=names.namespace
    )
    consumer = StreamConsumer(
        redis.Redis.from_url(stream_server.url),
        store,
        stream=names.stream,
        group=names.group,
        block=0.01,
        **kw,
    )
    consumer.start()
    return consumer


def test_poll_applies_records_then_acks(
    names, stream_server, progress_server, stream_client, progress_client
):
    consumer = make(names, stream_server, progress_server, worker="w1")
    ids = publish(stream_client, names, ["e1", "e2", "e3"])
    seen: list[str] = []

    def effect(ctx: EffectContext) -> None:
        # The progress of this delivery is not recorded yet while its effect runs.
        assert not consumer.store.read(consumer.scope).covers(ctx.delivery)
        assert ctx.idempotency_key == f"{names.consumer}:{ctx.emission.value}"
        seen.append(ctx.emission.value)

    report = consumer.poll(effect)
    assert seen == ["e1", "e2", "e3"]
    assert [r.outcome for r in report.receipts] == [SettlementOutcome.ACKED] * 3
    assert pending_ids(stream_client, names) == {}
    progress = consumer.store.read(consumer.scope)
    assert progress.floor == DeliveryId(ids[-1])
    assert progress.applied_above_floor == ()
    assert progress.gaps == ()
    assert progress.intents == ()
    assert progress.provider_floor is not None
    assert progress.provider_floor.last_delivered == DeliveryId(ids[-1])
    assert progress.provider_floor.pending == 0
    assert progress.replay_from.after == DeliveryId(ids[-1])
    assert_nothing_acked_uncovered(stream_client, progress_client, names)

    # A re-publication of the same emissions is recognised: no effect runs again.
    publish(stream_client, names, ["e1", "e2"])
    report = consumer.poll(effect)
    assert seen == ["e1", "e2", "e3"]
    assert len(report.receipts) == 2
    consumer.store.close()


def test_fenced_ack_refuses_a_delivery_owned_by_another_worker(
    names, stream_server, progress_server, stream_client, progress_client
):
    a = make(names, stream_server, progress_server, worker="a")
    b = make(names, stream_server, progress_server, worker="b", claim_idle=0.001)
    [first] = publish(stream_client, names, ["e1"])
    [(_, batch)] = stream_client.xreadgroup(names.group, "a", {names.stream: ">"})
    assert batch[0][0].decode() == first
    applied = a.store.apply(a.scope, DeliveryId(first), EmissionId("e1"), lambda ctx: None)
    assert applied.status is ApplyStatus.APPLIED
    # b reclaims it while a is slow; a's acknowledgement is then refused, not applied.
    stream_client.xclaim(names.stream, names.group, "b", 0, [first])
    receipt = a.settle(SettlementAuthority("a", DeliveryId(first), 1), IntentKind.ACK)
    assert receipt.outcome is SettlementOutcome.NOT_OWNER
    assert receipt.owner == "b"
    assert first in pending_ids(stream_client, names)
    # ... and a stale delivery count is refused even for the right name.
    stale = b.settle(SettlementAuthority("b", DeliveryId(first), 1), IntentKind.ACK)
    assert stale.outcome is SettlementOutcome.RECLAIMED
    assert b.store.read(b.scope).intents[0].delivery == DeliveryId(first)  # still open
    done = b.settle(SettlementAuthority("b", DeliveryId(first), 2), IntentKind.ACK)
    assert done.outcome is SettlementOutcome.ACKED
    assert b.store.read(b.scope).intents == ()
    assert pending_ids(stream_client, names) == {}
    # The receipts keep what the provider said to each attempt, newest first.
    said = [(r.worker, r.outcome, r.owner, r.acknowledged) for r in b.store.receipts(b.scope)]
    assert said == [
        ("b", SettlementOutcome.ACKED, "b", 1),
        ("b", SettlementOutcome.RECLAIMED, "b", 0),
        ("a", SettlementOutcome.NOT_OWNER, "b", 0),
    ]


@pytest.mark.parametrize("kind", [IntentKind.ACK, IntentKind.DEAD_LETTER, IntentKind.DEFER])
def test_a_settlement_progress_does_not_authorize_is_refused_and_settles_nothing(
    names, stream_server, progress_server, stream_client, progress_client, kind
):
    """The public settle() tells the provider nothing that durable progress does not back
    (SPEC 10): an ack or a dead-letter of a delivery progress does not cover, or a deferral
    of one it does not hold as deferred, would drop it from the pending list unrecorded:
    its effect would never run. Refused, nothing settled, nothing written; a release (hand
    it back) needs no progress."""
    c = make(names, stream_server, progress_server, worker="a")
    [first] = publish(stream_client, names, ["e1"])
    stream_client.xreadgroup(names.group, "a", {names.stream: ">"})
    before = c.store.read(c.scope)
    with capture_logs() as logs, pytest.raises(SettlementNotAuthorized) as refused:
        c.settle(SettlementAuthority("a", DeliveryId(first), 1), kind, EmissionId("e1"))
    assert refused.value.uncovered == [DeliveryId(first)]
    # the refusal is said, with the delivery and the kind (docs/observability.md)
    [said] = [e for e in logs if e["event"] == "settle.progress.settle_unauthorized"]
    assert (said["log_level"], said["delivery"], said["kind"]) == ("warning", first, kind.value)
    assert first in pending_ids(stream_client, names)  # still the worker's to apply
    assert c.store.read(c.scope) == before  # no receipt, no intent, no version
    assert c.store.receipts(c.scope) == []
    assert dead_letters_on_stream(stream_client, names) == []
    released = c.settle(SettlementAuthority("a", DeliveryId(first), 1), IntentKind.RELEASE)
    assert released.outcome is SettlementOutcome.RELEASED
    # Once progress backs it, the same settlement goes through.
    if kind is IntentKind.DEFER:
        c.store.defer(c.scope, DeliveryId(first), EmissionId("e1"), reason="later")
    elif kind is IntentKind.DEAD_LETTER:
        c.store.dead_letter(
            c.scope, DeliveryId(first), EmissionId("e1"), reason="poison", delivery_count=1
        )
    else:
        c.store.apply(c.scope, DeliveryId(first), EmissionId("e1"), lambda ctx: None)
    done = c.settle(SettlementAuthority("a", DeliveryId(first), 1), kind, EmissionId("e1"))
    assert done.outcome is SettlementOutcome.ACKED
    assert first not in pending_ids(stream_client, names)
    c.store.close()


def test_a_deferral_with_a_reason_progress_refuses_never_stops_the_consumer(
    names, stream_server, progress_server, stream_client, progress_client
):
    """An effect that raises ``DeferDelivery("")`` (a reason progress would refuse) is an
    effect that failed: its delivery is released for redelivery and run() carries on. The
    reason used to be checked only after the effect, which stopped run() with the delivery
    still pending under its worker."""

    def effect(ctx: EffectContext) -> None:
        raise DeferDelivery("")

    with capture_logs() as logs:  # (the consumer's logger is bound when it is made)
        c = make(names, stream_server, progress_server, worker="w1")
        [first] = publish(stream_client, names, ["e1"])
        c.run(effect, polls=1)  # returns: nothing escaped
    failed = [e for e in logs if e["event"] == "settle.progress.effect_failed"]
    assert [e["error_type"] for e in failed] == ["InvalidDelivery"]
    assert first in pending_ids(stream_client, names)  # released, to be redelivered
    assert c.store.read(c.scope).deferred == ()
    c.store.close()


def test_effect_failure_releases_then_poison_is_dead_lettered(
    names, stream_server, progress_server, stream_client, progress_client
):
    consumer = make(names, stream_server, progress_server, claim_idle=0.001, max_deliveries=2)
    ids = publish(stream_client, names, ["ok1", "bad", "ok2"])
    calls: dict[str, int] = {}

    def effect(ctx: EffectContext) -> None:
        calls[ctx.emission.value] = calls.get(ctx.emission.value, 0) + 1
        if ctx.emission.value == "bad":
            raise RuntimeError("cannot apply")

    outcomes = [r.outcome for r in consumer.poll(effect).receipts]
    assert SettlementOutcome.RELEASED in outcomes
    for _ in range(5):
        consumer.poll(effect)
    assert calls == {"ok1": 1, "bad": 2, "ok2": 1}
    progress = consumer.store.read(consumer.scope)
    assert progress.floor == DeliveryId(ids[-1])  # a dead letter is resolved for the floor
    [dead] = dead_letters_on_stream(stream_client, names)
    assert dead["delivery"] == ids[1]
    assert dead["reason"] == "delivery_limit"
    assert dead["deliveries"] == "3"
    assert pending_ids(stream_client, names) == {}
    assert_nothing_acked_uncovered(stream_client, progress_client, names)


def test_defer_is_durable_found_again_and_blocks_the_floor(
    names, stream_server, progress_server, stream_client
):
    consumer = make(names, stream_server, progress_server)
    ids = publish(stream_client, names, ["e1", "later", "e3"])

    def effect(ctx: EffectContext) -> None:
        if ctx.emission.value == "later":
            raise DeferDelivery("waiting for the account")

    consumer.poll(effect)
    progress = consumer.store.read(consumer.scope)
    [deferred] = progress.deferred
    assert deferred.delivery == DeliveryId(ids[1])
    assert deferred.reason == "waiting for the account"
    # The provider stopped redelivering it, but the application floor did not pass it.
    assert pending_ids(stream_client, names) == {}
    assert progress.floor == DeliveryId(ids[0])
    assert progress.gaps == (DeliveryId(ids[1]),)
    assert progress.applied_above_floor == (DeliveryId(ids[2]),)
    # Applying it later (found again from the deferred record) closes the gap.
    consumer.store.apply(consumer.scope, deferred.delivery, deferred.emission, lambda ctx: None)
    progress = consumer.observe()
    assert progress.deferred == ()
    assert progress.gaps == ()
    assert progress.floor == DeliveryId(ids[2])


def test_malformed_delivery_is_dead_lettered_before_the_provider_is_told(
    names, stream_server, progress_server, stream_client
):
    consumer = make(names, stream_server, progress_server)
    [bad] = [stream_client.xadd(names.stream, {"body": "no emission id"}).decode()]
    receipts = consumer.poll(lambda ctx: None).receipts
    assert [(r.kind, r.outcome) for r in receipts] == [
        (IntentKind.DEAD_LETTER, SettlementOutcome.ACKED)
    ]
    assert consumer.store.read(consumer.scope).floor == DeliveryId(bad)
    assert dead_letters_on_stream(stream_client, names)[0]["reason"] == "malformed"


@pytest.mark.parametrize("written", ["now", "before intents kept a reason"])
def test_recover_tells_the_provider_why_a_delivery_was_dead_lettered(
    written, names, stream_server, progress_server, stream_client, progress_client
):
    """The worker died after the dead letter was durable in progress and before the
    provider was told; restarted under its name, recover() writes the stream-side
    dead-letter entry with the reason progress recorded ('unknown' for an intent an
    earlier settle wrote without one)."""
    consumer = make(names, stream_server, progress_server, worker="w1")
    [entry] = publish(stream_client, names, ["poison"])
    stream_client.xreadgroup(names.group, "w1", {names.stream: ">"}, count=1)
    delivery = DeliveryId(entry)
    consumer.store.dead_letter(
        consumer.scope, delivery, EmissionId("poison"), reason="delivery_limit", delivery_count=6
    )
    [intent] = consumer.store.read(consumer.scope).intents
    assert (intent.kind, intent.reason) == (IntentKind.DEAD_LETTER, "delivery_limit")
    if written != "now":
        key = ProgressKeys(names.namespace, names.consumer).scope(consumer.scope.scope_id)[4]
        old = json.loads(progress_client.hget(key, entry))
        del old["reason"]
        progress_client.hset(key, entry, json.dumps(old))
    [receipt] = consumer.recover()
    assert receipt.outcome is SettlementOutcome.ACKED
    [dead] = dead_letters_on_stream(stream_client, names)
    assert dead["reason"] == ("delivery_limit" if written == "now" else "unknown")
    assert pending_ids(stream_client, names) == {}
    consumer.close()


def test_an_ack_intent_has_no_reason(names, stream_server, progress_server, stream_client):
    consumer = make(names, stream_server, progress_server)
    [entry] = publish(stream_client, names, ["e1"])
    consumer.store.apply(consumer.scope, DeliveryId(entry), EmissionId("e1"), lambda ctx: None)
    [intent] = consumer.store.read(consumer.scope).intents
    assert (intent.kind, intent.reason) == (IntentKind.ACK, "")
    consumer.close()


def test_scripts_survive_a_flushed_script_cache(
    names, stream_server, progress_server, stream_client, progress_client
):
    consumer = make(names, stream_server, progress_server)
    publish(stream_client, names, ["e1"])
    stream_client.script_flush()
    progress_client.script_flush()
    assert [r.outcome for r in consumer.poll(lambda ctx: None).receipts] == [
        SettlementOutcome.ACKED
    ]


@pytest.mark.asyncio
async def test_async_consumer_applies_and_acks(names, stream_server, progress_server):
    store = AsyncProgressStore.from_url(
        progress_server.url, consumer=names.consumer, namespace=names.namespace
    )
    consumer = AsyncStreamConsumer(
        aioredis.Redis.from_url(stream_server.url),
        store,
        stream=names.stream,
        group=names.group,
        block=0.01,
    )
    scope = await consumer.start()
    producer = aioredis.Redis.from_url(stream_server.url)
    ids = [(await producer.xadd(names.stream, {"emission_id": e})).decode() for e in ("a1", "a2")]
    seen = []

    async def effect(ctx: EffectContext) -> None:
        seen.append(ctx.emission.value)

    report = await consumer.poll(effect)
    assert seen == ["a1", "a2"]
    assert [r.outcome for r in report.receipts] == [SettlementOutcome.ACKED] * 2
    [progress] = await store.show()
    assert progress.scope == scope
    assert progress.floor == DeliveryId(ids[-1])
    await producer.aclose()
    await consumer.aclose()


def test_transitions_are_logged_with_stable_names_and_no_payloads(
    names, stream_server, progress_server, stream_client
):
    with capture_logs() as logs:
        consumer = make(names, stream_server, progress_server, worker="w1")
        [first] = publish(stream_client, names, ["e1"])
        consumer.poll(lambda ctx: None)
    events = [e["event"] for e in logs]
    assert events[0] == "settle.progress.scope_opened"
    assert {"settle.progress.applied", "settle.progress.settled"} <= set(events)
    assert "settle.progress.floor_advanced" in events
    settled = next(e for e in logs if e["event"] == "settle.progress.settled")
    assert (settled["delivery"], settled["outcome"], settled["worker"]) == (first, "acked", "w1")
    assert all(e["event"].startswith("settle.progress.") for e in logs)
    assert not any("payload-e1" in repr(e) for e in logs)  # the message body is never logged


def test_emission_ids_reach_the_logs_only_as_keyed_digests(
    names, stream_server, progress_server, stream_client
):
    """An emission id is what the consumer's idempotency key is made of: every event, at
    every level (capture_logs takes DEBUG too), names it only as ``emission_digest`` (SPEC
    12), whether applied, a duplicate, covered, deferred, failed or dead-lettered."""
    ok, bad, later = "EMISSIONSECRET-ok", "EMISSIONSECRET-bad", "EMISSIONSECRET-later"

    def effect(ctx: EffectContext) -> None:
        if ctx.emission.value == bad:
            raise RuntimeError("cannot apply")
        if ctx.emission.value == later:
            raise DeferDelivery("waiting for the account")

    with capture_logs() as logs:
        consumer = make(names, stream_server, progress_server, claim_idle=0.001, max_deliveries=1)
        [first, *_] = publish(stream_client, names, [ok, bad, later])
        for _ in range(3):  # bad: released, then dead-lettered past max_deliveries
            consumer.poll(effect)
        publish(stream_client, names, [ok])  # a re-publication: a duplicate
        consumer.poll(effect)
        consumer.store.apply(consumer.scope, DeliveryId(first), EmissionId(ok), effect)  # covered
    for entry in logs:
        for field, value in entry.items():
            assert "EMISSIONSECRET" not in str(value), (entry["event"], field)
    by_event: dict[str, set[str]] = {}
    for entry in logs:
        if "emission_digest" in entry:
            by_event.setdefault(entry["event"], set()).add(entry["emission_digest"])
    assert by_event == {
        "settle.progress.applied": {emission_digest(ok)},
        "settle.progress.duplicate": {emission_digest(ok)},
        "settle.progress.covered": {emission_digest(ok)},
        "settle.progress.effect_failed": {emission_digest(bad)},
        "settle.progress.dead_lettered": {emission_digest(bad)},
        "settle.progress.deferred": {emission_digest(later)},
    }


def test_a_backend_error_of_the_run_loop_is_logged_by_its_type(
    names, stream_server, progress_server
):
    """``run`` logs a Redis failure it outlives as ``settle.progress.backend_error`` with the
    error's type, as every other event names an error: never its text (hosts, ports)."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        gone = f"redis://127.0.0.1:{free.getsockname()[1]}/0"  # nothing listens there
    with capture_logs() as logs:
        store = ProgressStore.from_url(gone, consumer=names.consumer, namespace=names.namespace)
        consumer = StreamConsumer(
            redis.Redis.from_url(stream_server.url),
            store,
            stream=names.stream,
            group=names.group,
            block=0.01,
            retry_pause=0.0,
        )
        consumer.run(lambda ctx: None, polls=1)
    [logged] = [e for e in logs if e["event"] == "settle.progress.backend_error"]
    assert logged["error"] == "BackendError"
    assert "127.0.0.1" not in repr(logged)
