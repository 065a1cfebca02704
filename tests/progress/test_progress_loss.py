"""The progress server loses its data (a restart without persistence, FLUSHALL) while the
stream's server keeps the stream, the group and the acknowledgements: on real servers, sync
and async.

Before, every delivery applied and acknowledged before the loss became a gap reported as
lost (``settle.progress.lost``: "handed out and will never come again"), the floor never
moved again, and nothing said that progress itself was lost. Now the consumer refuses:
:class:`ProgressLost`, a ``settle.progress.state_lost`` event, nothing written; and the
documented way to go on (delete the incarnation marker and the group, start again) applies
every entry again under its idempotency key, and the floor moves again."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import redis
from structlog.testing import capture_logs

from settle import ConfigurationError
from settle.embedded import EmbeddedRedis
from settle.progress import (
    AsyncStreamConsumer,
    DeferDelivery,
    DeliveryId,
    EffectContext,
    EmissionId,
    IntentKind,
    ProgressStore,
    ProviderScope,
    StreamConsumer,
)
from settle.progress._core import ProgressCore, StreamVerdict
from settle.progress.errors import ProgressLost, ProviderReset, SettlementNotAuthorized
from settle.progress.identity import AttemptId, SettlementAuthority
from settle.progress.models import SettlementOutcome
from tests.progress.harness import Names, pending_ids, publish, settled_ids


@pytest.fixture
def own_progress_server(primary: EmbeddedRedis) -> EmbeddedRedis:
    """A progress server of this test alone, as it is restarted or flushed (the fresh
    server of tests/faults/servers.py)."""
    return primary


@pytest.fixture
def logs() -> Iterator[list[dict[str, Any]]]:
    """The structlog events of the whole test (a consumer binds its logger when it is
    made, so capturing must begin before)."""
    with capture_logs() as captured:
        yield captured


class Ledger:
    """The effect's own store: idempotent under the idempotency key, as the docs ask."""

    def __init__(self) -> None:
        self.invocations: Counter[str] = Counter()  # emission -> times the effect ran
        self.held: Counter[str] = Counter()  # emission -> times the effect took hold
        self.keys: dict[str, str] = {}  # idempotency key -> emission

    def __call__(self, ctx: EffectContext) -> None:
        self.invocations[ctx.emission.value] += 1
        if ctx.idempotency_key not in self.keys:
            self.keys[ctx.idempotency_key] = ctx.emission.value
            self.held[ctx.emission.value] += 1


def _tagged(server: EmbeddedRedis, names: Names) -> list[bytes]:
    """Every key of the consumer's progress on ``server``, read from the server itself."""
    with redis.Redis.from_url(server.url) as raw:
        return list(raw.scan_iter(match=f"settle:{{{names.namespace}:progress:{names.consumer}}}*"))


def _events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == name]


def _consumer(names: Names, stream_url: str, progress_url: str, kind: Any = StreamConsumer) -> Any:
    """A ``kind`` (StreamConsumer, AsyncStreamConsumer) of ``names``, worker ``w1``."""
    return kind.from_urls(
        stream_url,
        progress_url,
        consumer=names.consumer,
        namespace=names.namespace,
        stream=names.stream,
        group=names.group,
        worker="w1",
        block=0.01,
        claim_idle=0.05,
    )


@pytest.fixture
def effect() -> Ledger:
    return Ledger()


@pytest.fixture
def consumer(
    names: Names,
    stream_server: EmbeddedRedis,
    own_progress_server: EmbeddedRedis,
    logs: list[dict[str, Any]],
) -> Iterator[Any]:
    """The sync consumer under test (worker ``w1``), its progress on the server it loses;
    made once ``logs`` captures (it binds its logger when it is made)."""
    made = _consumer(names, stream_server.url, own_progress_server.url)
    yield made
    made.close()


@pytest_asyncio.fixture
async def async_consumer(
    names: Names,
    stream_server: EmbeddedRedis,
    own_progress_server: EmbeddedRedis,
    logs: list[dict[str, Any]],
) -> AsyncIterator[Any]:
    """The async consumer under test, as ``consumer``."""
    made = _consumer(names, stream_server.url, own_progress_server.url, AsyncStreamConsumer)
    yield made
    await made.aclose()


def _lose(server: EmbeddedRedis) -> None:
    """The loss: the progress server's FLUSHALL (the stream's server keeps everything)."""
    with redis.Redis.from_url(server.url) as raw:
        raw.flushall()


def _check_refusal(
    logs: list[dict[str, Any]], error: ProgressLost, scope: ProviderScope, names: Names
) -> None:
    assert error.scope == scope
    assert error.operation_id == names.consumer
    assert "XGROUP DESTROY" in str(error)  # it says what to do next
    [event] = _events(logs, "settle.progress.state_lost")
    assert event["log_level"] == "error"
    assert (event["scope"], event["stream"], event["group"]) == (
        str(scope),
        scope.stream,
        names.group,
    )
    assert event["consumer"] == names.consumer
    # Nothing reported as lost: the deliveries were applied and acknowledged.
    assert _events(logs, "settle.progress.lost") == []


def test_progress_lost_in_a_restart_is_refused_not_reported_as_lost_deliveries(
    names: Names,
    consumer: Any,
    effect: Ledger,
    own_progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    logs: list[dict[str, Any]],
) -> None:
    ids = publish(stream_client, names, [f"e{i}" for i in range(4)])
    consumer.poll(effect)
    scope = consumer.scope
    assert scope is not None
    assert consumer.store.read(scope).floor == DeliveryId(ids[-1])
    assert settled_ids(stream_client, names) == set(ids)

    own_progress_server.stop(kill=True)  # no AOF, no RDB: it comes back empty
    own_progress_server.start()
    [late] = publish(stream_client, names, ["e4"])
    with pytest.raises(ProgressLost) as caught:
        consumer.poll(effect)
    _check_refusal(logs, caught.value, scope, names)
    # Nothing written on the progress server: no gap, no applied set, no floor to guess.
    assert _tagged(own_progress_server, names) == []
    progress = consumer.store.read(scope)
    assert (progress.gaps, progress.floor, progress.applied_above_floor) == ((), None, ())
    # The effect of the new delivery did not run; it stays pending, unacknowledged.
    assert effect.invocations == Counter({f"e{i}": 1 for i in range(4)})
    assert late in pending_ids(stream_client, names)
    assert settled_ids(stream_client, names) == set(ids)
    # run() does not go on guessing either: the error ends it.
    with pytest.raises(ProgressLost):
        consumer.run(effect, polls=3)
    assert _tagged(own_progress_server, names) == []


def test_the_documented_way_on_applies_every_entry_again_under_its_idempotency_key(
    names: Names,
    consumer: Any,
    stream_server: EmbeddedRedis,
    own_progress_server: EmbeddedRedis,
    progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    logs: list[dict[str, Any]],
) -> None:
    """docs/delivery-progress.md, "Progress lost": stop the workers, destroy the group and
    delete the consumer's field of the acknowledged mark, start again. Another group of the
    same stream, whose progress (on another server) is whole, is left alone."""
    effect, audit = Ledger(), Ledger()
    other = Names(names.stream, "audit", f"{names.consumer}-audit", names.namespace)
    second = _consumer(other, stream_server.url, progress_server.url)
    try:
        ids = publish(stream_client, names, [f"e{i}" for i in range(4)])
        consumer.poll(effect)
        second.poll(audit)
        old, audit_scope = consumer.scope, second.scope
        keys_before = dict(effect.keys)
        _lose(own_progress_server)
        ids += publish(stream_client, names, ["e4"])
        with pytest.raises(ProgressLost) as caught:
            consumer.poll(effect)

        # The operator's two commands, as the error names them (the worker has stopped:
        # the error ended it).
        mark = f"settle:{{{names.stream}}}:acked:{names.stream}"
        field = json.dumps([names.namespace, names.consumer, names.group])
        assert f"XGROUP DESTROY {names.stream} {names.group}" in str(caught.value)
        assert f"HDEL {mark} '{field}'" in str(caught.value)
        stream_client.xgroup_destroy(names.stream, names.group)
        assert stream_client.hdel(mark, field) == 1

        scope = consumer.start()
        for _ in range(3):
            consumer.poll(effect)
        assert scope == old  # the same incarnation: its progress is made anew
        progress = consumer.store.read(scope)
        assert progress.floor == DeliveryId(ids[-1])  # the floor moves again
        assert (progress.gaps, progress.applied_above_floor, progress.intents) == ((), (), ())
        assert pending_ids(stream_client, names) == {}
        assert settled_ids(stream_client, names) == set(ids)
        # Every entry was handed out again and its effect ran again with the same
        # idempotency key, so each took hold once.
        assert effect.held == Counter({f"e{i}": 1 for i in range(5)})
        assert effect.invocations == Counter({**{f"e{i}": 2 for i in range(4)}, "e4": 1})
        assert {k: v for k, v in effect.keys.items() if v != "e4"} == keys_before
        assert _events(logs, "settle.progress.lost") == []
        assert len(_events(logs, "settle.progress.state_lost")) == 1  # the refusal only

        second.poll(audit)  # the other group: same scope, nothing applied twice
        assert second.scope == audit_scope
        assert audit_scope is not None
        audited = second.store.read(audit_scope)
        assert (audited.floor, audited.gaps) == (DeliveryId(ids[-1]), ())
        assert audit.invocations == Counter({f"e{i}": 1 for i in range(5)})
    finally:
        second.close()


@pytest.mark.asyncio
async def test_async_consumer_refuses_progress_lost_to_a_flushall(
    names: Names,
    async_consumer: Any,
    own_progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    logs: list[dict[str, Any]],
) -> None:
    store = async_consumer.store
    runs: list[str] = []

    async def effect(ctx: EffectContext) -> None:
        runs.append(ctx.emission.value)

    ids = publish(stream_client, names, ["a0", "a1"])
    await async_consumer.poll(effect)
    scope = async_consumer.scope
    assert scope is not None
    assert (await store.read(scope)).floor == DeliveryId(ids[-1])
    _lose(own_progress_server)
    publish(stream_client, names, ["a2"])
    with pytest.raises(ProgressLost) as caught:
        await async_consumer.poll(effect)
    _check_refusal(logs, caught.value, scope, names)
    assert _tagged(own_progress_server, names) == []
    assert runs == ["a0", "a1"]
    with pytest.raises(ProgressLost):
        await async_consumer.run(effect, polls=2)


@pytest.mark.parametrize("kind", [IntentKind.ACK, IntentKind.DEAD_LETTER, IntentKind.DEFER])
def test_a_hand_called_settlement_on_lost_progress_raises_progress_lost(
    kind: IntentKind,
    names: Names,
    consumer: Any,
    effect: Ledger,
    own_progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    logs: list[dict[str, Any]],
) -> None:
    """``consumer.settle(...)`` is authorized by durable progress: when that progress was
    lost (the scope's deliveries were acknowledged), it is refused as poll() refuses it,
    :class:`ProgressLost` with the way on and a ``settle.progress.state_lost`` event, not
    ``SettlementNotAuthorized`` (which said the delivery was not covered, and nothing of
    the loss). Nothing is settled, nothing written."""
    publish(stream_client, names, ["h0"])
    consumer.poll(effect)  # applied and acknowledged: the mark is on the stream's server
    scope = consumer.scope
    assert scope is not None
    authority = _held_then_lost(stream_client, names, own_progress_server)
    with pytest.raises(ProgressLost) as caught:
        consumer.settle(authority, kind, EmissionId("h1"), "by hand")
    _check_refusal(logs, caught.value, scope, names)
    _check_unsettled(authority, stream_client, names, own_progress_server)


def _held_then_lost(
    stream_client: redis.Redis, names: Names, server: EmbeddedRedis
) -> SettlementAuthority:
    """Worker ``w1`` holds a new delivery (h1, read, not settled), then the loss: the
    authority of a settlement of it by hand."""
    [held] = publish(stream_client, names, ["h1"])
    stream_client.xreadgroup(names.group, "w1", {names.stream: ">"})
    _lose(server)
    return SettlementAuthority("w1", DeliveryId(held), 1)


def _check_unsettled(
    authority: SettlementAuthority, stream_client: redis.Redis, names: Names, server: EmbeddedRedis
) -> None:
    """Nothing written to progress, and the delivery still pending for its worker."""
    assert _tagged(server, names) == []
    assert pending_ids(stream_client, names) == {authority.delivery.value: ("w1", 1)}


def test_a_hand_called_settlement_on_a_new_scope_claims_nothing_and_says_so(
    names: Names,
    consumer: Any,
    own_progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    logs: list[dict[str, Any]],
) -> None:
    """On a scope nothing was applied in (the stream shows it unused), a settlement by hand
    is not authorized (no durable progress covers the delivery) and creates nothing; the
    log said ``settle.progress.scope_claimed`` for it all the same, a claim an operator
    would look for in the progress server and not find."""
    consumer.start()
    [held] = publish(stream_client, names, ["h0"])
    stream_client.xreadgroup(names.group, "w1", {names.stream: ">"})
    authority = SettlementAuthority("w1", DeliveryId(held), 1)
    with pytest.raises(SettlementNotAuthorized):
        consumer.settle(authority, IntentKind.ACK, EmissionId("h0"), "by hand")
    assert _events(logs, "settle.progress.scope_claimed") == []
    _check_unsettled(authority, stream_client, names, own_progress_server)


@pytest.mark.asyncio
async def test_async_hand_called_settlement_on_lost_progress_raises_progress_lost(
    names: Names,
    async_consumer: Any,
    own_progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    logs: list[dict[str, Any]],
) -> None:
    async def effect(ctx: EffectContext) -> None:
        return None

    publish(stream_client, names, ["h0"])
    await async_consumer.poll(effect)
    scope = async_consumer.scope
    assert scope is not None
    authority = _held_then_lost(stream_client, names, own_progress_server)
    with pytest.raises(ProgressLost) as caught:
        await async_consumer.settle(authority, IntentKind.ACK, EmissionId("h1"))
    _check_refusal(logs, caught.value, scope, names)
    _check_unsettled(authority, stream_client, names, own_progress_server)


def test_a_scope_with_no_acknowledgement_is_claimed_whatever_other_groups_acknowledged(
    names: Names,
    consumer: Any,
    effect: Ledger,
    stream_server: EmbeddedRedis,
    own_progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    logs: list[dict[str, Any]],
) -> None:
    """No acknowledgement of this consumer's group in this incarnation: nothing was settled
    on the strength of missing progress, so its state is created: progress lost while the
    first effect ran (the delivery is recorded and acknowledged), or a new consumer of a
    stream another group has acknowledged from. A consumer whose own acknowledgement is on
    the stream's server is refused."""

    def losing(ctx: EffectContext) -> None:
        effect(ctx)
        if ctx.emission.value == "n0":
            _lose(own_progress_server)  # between begin and record of the scope's first delivery

    other = Names(names.stream, "audit", f"{names.consumer}-other", names.namespace)
    second = _consumer(other, stream_server.url, own_progress_server.url)
    try:
        scope = consumer.start()
        ids = publish(stream_client, names, ["n0"])
        consumer.poll(losing)
        claimed = [e["scope"] for e in _events(logs, "settle.progress.scope_claimed")]
        assert claimed == [str(scope), str(scope)]  # at begin, and again at record
        assert consumer.store.read(scope).floor == DeliveryId(ids[0])
        assert effect.invocations == Counter({"n0": 1})
        assert settled_ids(stream_client, names) == set(ids)

        _lose(own_progress_server)
        second.poll(effect)  # a new group and consumer: claimed, not refused
        assert second.store.read(second.scope).floor == DeliveryId(ids[0])  # type: ignore[arg-type]
        with pytest.raises(ProgressLost):
            consumer.poll(effect)
    finally:
        second.close()


def test_a_scope_is_made_again_only_after_the_progress_server_is_checked(
    names: Names,
    consumer: Any,
    effect: Ledger,
    own_progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    logs: list[dict[str, Any]],
) -> None:
    """'unclaimed' is evidence that the progress server may have lost data: before the call
    that creates the scope again, the runtime checks the server, so a scope is never made
    again on a server that now evicts (FLUSHALL, then CONFIG SET maxmemory-policy)."""
    consumer.poll(effect)  # nothing to deliver: the scope is made, nothing acknowledged
    scope = consumer.scope
    assert scope is not None
    assert consumer.store.read(scope).provider_floor is not None
    with redis.Redis.from_url(own_progress_server.url) as raw:
        raw.flushall()
        raw.config_set("maxmemory-policy", "allkeys-lru")
    publish(stream_client, names, ["c0"])
    with pytest.raises(ConfigurationError, match="allkeys-lru"):
        consumer.poll(effect)
    assert _tagged(own_progress_server, names) == []
    assert effect.invocations == Counter()  # the effect never ran on the evicting server


WRITERS = ["begin", "record", "dead_letter", "defer", "receipt", "observe", "lost"]


def _plan(core: ProgressCore, script: str, scope: ProviderScope) -> Any:
    d, e, a = DeliveryId("5-0"), EmissionId("e5"), AttemptId("a1")
    verdict = StreamVerdict(SettlementOutcome.ACKED, "w1", 1, 1)
    return {
        "begin": lambda: core.plan_begin(scope, d, e, a),
        "record": lambda: core.plan_record(scope, d, e, a),
        "dead_letter": lambda: core.plan_dead_letter(scope, d, e, "poison", 9),
        "defer": lambda: core.plan_defer(scope, d, e, "later"),
        "receipt": lambda: core.plan_receipt(scope, d, IntentKind.ACK, verdict, "w1"),
        "observe": lambda: core.plan_observe(
            scope, None, [d], last_delivered=d, oldest_pending=None, pending=0
        ),
        "lost": lambda: core.plan_lost(scope, [d]),
    }[script]()


@pytest.mark.parametrize("script", WRITERS)
def test_a_write_without_the_claim_flag_on_a_scope_with_no_state_writes_nothing(
    script: str, names: Names, own_progress_server: EmbeddedRedis
) -> None:
    """The scripts' contract (lua/_lib.lua, unclaimed()): no state and no claim flag ->
    'unclaimed', nothing written; with the flag the scope's state is created."""
    store = ProgressStore.from_url(
        own_progress_server.url, consumer=names.consumer, namespace=names.namespace
    )
    scope = ProviderScope(names.stream, names.group, "inc1")
    try:
        call = _plan(store.core, script, scope)
        reply = store.progress(call)
        assert reply.code == "unclaimed"
        assert _tagged(own_progress_server, names) == []
        reply = store.progress(store.core.claiming(call))
        assert reply.code not in ("unclaimed", "corrupt")
        meta = store.core.keys.scope(scope.scope_id)[0]
        with redis.Redis.from_url(own_progress_server.url) as raw:
            assert raw.hget(meta, "claimed") is not None
            # A scope with state needs no flag any more.
            assert store.progress(_plan(store.core, script, scope)).code != "unclaimed"
    finally:
        store.close()


def test_two_workers_of_a_new_group_starting_at_once_are_not_refused(
    names: Names,
    stream_server: EmbeddedRedis,
    own_progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    logs: list[dict[str, Any]],
) -> None:
    """Two workers of a group start together on a new scope. Worker b finds no state;
    before it asks the stream's server, worker a (which found no state too, asked, and
    created it) applies and acknowledges a delivery. Worker b must then find the scope a
    made, not take a's acknowledgement for progress that was lost: the scope's progress
    is whole, nothing was lost (found in review: b raised ProgressLost and its run()
    stopped)."""
    effect = Ledger()

    def worker(name: str) -> StreamConsumer:
        return StreamConsumer.from_urls(
            stream_server.url,
            own_progress_server.url,
            consumer=names.consumer,
            namespace=names.namespace,
            stream=names.stream,
            group=names.group,
            worker=name,
            block=0.01,
            batch=1,
        )

    a, b = worker("a"), worker("b")
    try:
        ids = publish(stream_client, names, ["r0", "r1"])
        a.start()
        b.start()
        # b is cut between its 'unclaimed' reply and its question to the stream's server:
        # the moment a does its whole delivery (the race of two workers starting at once).
        runner = b._runner
        ask = runner.run
        cut: list[str] = []

        def run(call: Any) -> Any:
            if call.script == "stream_evidence" and not cut:
                cut.append(call.script)
                a.poll(effect)  # reads r1 (b holds r0), claims the scope, acknowledges r1
                assert settled_ids(stream_client, names) == {ids[1]}
            return ask(call)

        runner.run = run  # type: ignore[method-assign]
        b.poll(effect)  # r0: begin finds no state, then asks
        assert cut == ["stream_evidence"]
        assert _events(logs, "settle.progress.state_lost") == []
        a.poll(effect)
        assert settled_ids(stream_client, names) == set(ids)
        assert effect.invocations == Counter({"r0": 1, "r1": 1})
        assert a.store.read(a.scope).floor == DeliveryId(ids[-1])  # type: ignore[arg-type]
    finally:
        b.close()
        a.close()


LATER_WRITES = ["dead_letter_malformed", "dead_letter_vanished", "defer", "receipt"]


@pytest.mark.parametrize("write", LATER_WRITES)
def test_every_write_of_the_consumer_after_the_loss_is_refused(
    write: str,
    names: Names,
    consumer: Any,
    effect: Ledger,
    own_progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
) -> None:
    """Not only the first write of an applied delivery: the consumer's dead-letter of a
    malformed delivery or of one whose entry was deleted while pending, its deferral, and
    its receipt after an acknowledgement each find the scope's progress gone and are
    refused with nothing written (with the claim flag they would make the scope anew from
    that one write, and the next observation would report every delivery acknowledged
    before as lost, as before the guard)."""
    publish(stream_client, names, ["w0"])
    consumer.poll(effect)  # applied and acknowledged: the mark is on the stream's server
    assert consumer.scope is not None
    if write == "dead_letter_malformed":
        _lose(own_progress_server)
        stream_client.xadd(names.stream, {"body": "no emission id"})
        poll = lambda: consumer.poll(effect)  # noqa: E731
    elif write == "dead_letter_vanished":
        [gone] = publish(stream_client, names, ["w1"])
        stream_client.xreadgroup(names.group, "dead", {names.stream: ">"})
        stream_client.xdel(names.stream, gone)  # deleted while pending for "dead"
        _lose(own_progress_server)
        time.sleep(0.1)  # past claim_idle: XAUTOCLAIM finds it deleted
        poll = lambda: consumer.poll(effect)  # noqa: E731
    elif write == "defer":
        publish(stream_client, names, ["w1"])

        def defer(ctx: EffectContext) -> None:
            _lose(own_progress_server)  # lost while the effect ran, after begin
            raise DeferDelivery("later")

        poll = lambda: consumer.poll(defer)  # noqa: E731
    else:
        publish(stream_client, names, ["w1"])

        def answered(step: str, _delivery: DeliveryId) -> None:
            if step == "provider_answered":
                _lose(own_progress_server)  # lost between the acknowledgement and its receipt

        consumer.store.observer = answered
        poll = lambda: consumer.poll(effect)  # noqa: E731
    with pytest.raises(ProgressLost):
        poll()
    assert _tagged(own_progress_server, names) == []


def test_a_stream_started_over_with_its_marker_is_not_taken_for_lost_progress(
    names: Names,
    consumer: Any,
    effect: Ledger,
    own_progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    logs: list[dict[str, Any]],
) -> None:
    """docs/delivery-progress.md: "when you delete a stream to start it over, delete its
    incarnation marker with it". The acknowledged mark still names the old incarnation; the
    new incarnation's scope had nothing acknowledged, so it is claimed, not refused."""
    publish(stream_client, names, ["s0", "s1"])
    consumer.poll(effect)
    old = consumer.scope
    stream_client.delete(names.stream, f"settle:{{{names.stream}}}:incarnation:{names.stream}")
    ids = publish(stream_client, names, ["s2"])
    consumer.run(effect, polls=3)  # NOGROUP: a new incarnation scope
    assert consumer.scope is not None
    assert consumer.scope != old
    assert consumer.store.read(consumer.scope).floor == DeliveryId(ids[0])
    assert effect.invocations == Counter({"s0": 1, "s1": 1, "s2": 1})
    assert _events(logs, "settle.progress.state_lost") == []


_TAG = uuid.uuid4().hex[:8]
#: A stream, a group and a consumer whose names hold spaces, quotes and non-ASCII letters.
_AWKWARD = Names(f"orders {_TAG}", "eu 'west'", f"o'neil café {_TAG}", "t")


@pytest.mark.parametrize("names", [_AWKWARD], ids=["awkward-names"])
def test_the_commands_the_refusal_names_work_as_written_for_any_names(
    names: Names,
    consumer: Any,
    effect: Ledger,
    stream_server: EmbeddedRedis,
    own_progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
) -> None:
    """The error's message is what the operator runs (redis-cli, as docs/delivery-progress.md
    shows them): with a stream, a group and a consumer whose names hold spaces, quotes and
    non-ASCII letters, the two commands, run as written, destroy the group and delete the
    mark's field, and the workers go on (found in review: the names were written bare or
    in single quotes that a quote in the name ends, so the commands failed or hit the
    wrong keys)."""
    ids = publish(stream_client, names, ["q0", "q1"])
    consumer.poll(effect)
    _lose(own_progress_server)
    with pytest.raises(ProgressLost) as caught:
        consumer.poll(effect)
    said = str(caught.value)
    destroy = said[said.index("XGROUP DESTROY ") : said.index(" and HDEL ")]
    delete = said[said.index("HDEL ") : said.index(", then start them again")]
    cli = shutil.which("redis-cli") or str(Path(sys.executable).with_name("redis-cli"))
    out = subprocess.run(
        [cli, "-p", str(stream_server.port)],
        input=f"{destroy}\n{delete}\n",
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split()
    assert out == ["1", "1"], (destroy, delete, out)  # the group destroyed, the field deleted
    consumer.start()
    consumer.poll(effect)
    assert consumer.store.read(consumer.scope).floor == DeliveryId(ids[-1])  # type: ignore[arg-type]


def test_a_scope_whose_marker_was_deleted_before_its_first_write_is_reset_not_claimed(
    names: Names,
    consumer: Any,
    effect: Ledger,
    own_progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    logs: list[dict[str, Any]],
) -> None:
    """The scope has no state yet and its incarnation marker is deleted before the first
    write: the stream's server answers that it is no longer that incarnation
    (``ProviderReset``, which ``run()`` goes on from with the new incarnation's scope); the
    old scope is never made on the progress server."""
    old = consumer.start()
    stream_client.delete(f"settle:{{{names.stream}}}:incarnation:{names.stream}")
    ids = publish(stream_client, names, ["z0"])
    with pytest.raises(ProviderReset):
        consumer.poll(effect)  # z0's first write: no state, and the marker is gone
    assert effect.invocations == Counter()
    consumer.run(effect, polls=3)
    assert consumer.scope is not None
    assert consumer.scope != old
    assert consumer.store.scopes() == [consumer.scope]  # the old scope never made
    assert consumer.store.read(consumer.scope).floor == DeliveryId(ids[0])
    assert effect.invocations == Counter({"z0": 1})
    assert [e["scope"] for e in _events(logs, "settle.progress.provider_reset")] == [str(old)]


def test_a_scope_that_only_dead_lettered_is_refused_after_the_loss(
    names: Names,
    consumer: Any,
    effect: Ledger,
    own_progress_server: EmbeddedRedis,
    stream_client: redis.Redis,
    logs: list[dict[str, Any]],
) -> None:
    """A dead-letter acknowledges too (its evidence was in progress before): a scope whose
    only settled delivery was dead-lettered is refused after the loss, not made anew (it
    would report the dead-lettered delivery as lost and hold the floor below it)."""
    bad = stream_client.xadd(names.stream, {"body": "no emission id"}).decode()
    consumer.poll(effect)
    assert settled_ids(stream_client, names) == {bad}
    assert stream_client.xlen(consumer.dead_letter_key) == 1
    _lose(own_progress_server)
    publish(stream_client, names, ["d1"])
    with pytest.raises(ProgressLost):
        consumer.poll(effect)
    assert _tagged(own_progress_server, names) == []
    assert effect.invocations == Counter()
    assert _events(logs, "settle.progress.lost") == []
