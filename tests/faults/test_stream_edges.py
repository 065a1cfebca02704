"""Operator actions on a consumer group against settle.progress, on real redis-servers (the
stream on one, progress on another), on Redis 6.2 and 7: entries deleted while pending (XDEL,
MAXLEN trimming), consumers deleted with pending entries (XGROUP DELCONSUMER), group ids
moved (XGROUP SETID). Each delivery ends in a recorded outcome: applied and settled,
dead-lettered with a reason, or a reported gap that holds the floor. Workers are real
processes killed (SIGKILL) at an exact step where a step can be interrupted.

The module runs on the default redis-server and, when Debian's Redis 7 is unpacked under
``.ci/redis7`` (``.ci/run`` does it), on that one too; ``SETTLE_REDIS_SERVER`` pins one.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio
from structlog.testing import capture_logs

from settle.embedded import EmbeddedRedis
from settle.progress import (
    AsyncProgressStore,
    AsyncStreamConsumer,
    DeliveryId,
    EffectContext,
    EmissionId,
    IntentKind,
    Progress,
    ProgressStore,
    StreamConsumer,
)
from settle.progress._keys import ProgressKeys
from settle.progress.models import SettlementOutcome
from tests.progress.harness import (
    Names,
    Worker,
    assert_nothing_acked_uncovered,
    counts,
    pending_ids,
    publish,
    redis_binaries,
)

pytestmark = pytest.mark.faults

BINARIES = [pytest.param(b, id="redis7" if b else "default") for b in redis_binaries()]


@pytest.fixture(scope="module", params=BINARIES)
def servers(request: pytest.FixtureRequest) -> Iterator[tuple[EmbeddedRedis, EmbeddedRedis]]:
    stream = EmbeddedRedis(binary=request.param).start()
    progress = EmbeddedRedis(binary=request.param).start()
    yield stream, progress
    stream.close()
    progress.close()


@pytest.fixture
def names() -> Names:
    tag = uuid.uuid4().hex[:10]
    return Names(stream=f"edges-{tag}", group="billing", consumer=f"billing-{tag}", namespace="t")


@pytest.fixture
def stream_client(servers) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(servers[0].url)
    yield client
    client.close()


@pytest.fixture
def progress_client(servers) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(servers[1].url)
    yield client
    client.close()


def redis7(client: redis.Redis) -> bool:
    return int(str(client.info("server")["redis_version"]).split(".")[0]) >= 7


class Ledger:
    """The effect, idempotent under its key; counts every run."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.held: dict[str, str] = {}

    def __call__(self, ctx: EffectContext) -> None:
        self.runs[ctx.emission.value] += 1
        self.held.setdefault(ctx.idempotency_key, ctx.emission.value)


def consumer(servers, names: Names, worker: str = "b", **options) -> StreamConsumer:
    store = ProgressStore.from_url(servers[1].url, consumer=names.consumer, namespace="t")
    defaults = {"claim_idle": 0.05, "block": 0.05, "batch": 2}
    return StreamConsumer(
        redis.Redis.from_url(servers[0].url),
        store,
        stream=names.stream,
        group=names.group,
        worker=worker,
        **{**defaults, **options},
    )


def poll_until(c: StreamConsumer, effect, done, polls: int = 40) -> int:
    """Poll until ``done()``; return how many polls it took."""
    for n in range(1, polls + 1):
        time.sleep(0.06)  # past claim_idle
        c.poll(effect)
        if done():
            return n
    raise AssertionError("the consumer did not finish")


def dead_evidence(progress_client: redis.Redis, names: Names) -> dict[str, str]:
    """delivery -> reason of the dead-letter evidence in progress."""
    keys = ProgressKeys(names.namespace, names.consumer)
    out = {}
    for scope_id in progress_client.hkeys(keys.scopes):
        for _, f in progress_client.xrange(keys.scope(scope_id.decode())[6]):
            out[f[b"delivery"].decode()] = f[b"reason"].decode()
    return out


def killed_worker(servers, names: Names, step: str, delivery: str, **kw) -> None:
    w = Worker(names, servers[0].url, servers[1].url, worker="w", kill_at=(step, delivery), **kw)
    w.wait_killed()


@pytest.mark.parametrize("operator", ["xdel", "maxlen"])
def test_entries_deleted_while_pending_never_starve_a_live_stuck_one(
    servers, names, stream_client, progress_client, operator
) -> None:
    ids = publish(stream_client, names, [f"e{i}" for i in range(6)])
    # A worker reads the whole batch and dies before handling any of it: all six pending.
    killed_worker(servers, names, "received", ids[0])
    assert set(pending_ids(stream_client, names)) == set(ids)
    # The operator deletes four of them (more than one XAUTOCLAIM batch of two).
    if operator == "xdel":
        stream_client.xdel(names.stream, *ids[:4])
    else:
        stream_client.xtrim(names.stream, maxlen=2, approximate=False)
    effect = Ledger()
    c = consumer(servers, names)

    polls = poll_until(c, effect, lambda: not pending_ids(stream_client, names))

    assert polls <= 4  # the scan moves on past deleted entries instead of restarting
    assert effect.runs == {"e4": 1, "e5": 1}  # the live ones, once; the deleted never
    assert dead_evidence(progress_client, names) == dict.fromkeys(ids[:4], "deleted")
    progress = c.store.read(c.scope)
    assert progress.floor == DeliveryId(ids[5])
    assert progress.intents == ()
    got = {r.delivery.value: r for r in c.store.receipts(c.scope)}
    expected = SettlementOutcome.NOT_PENDING if redis7(stream_client) else SettlementOutcome.ACKED
    assert {got[d].outcome for d in ids[:4]} == {expected}
    assert {got[d].kind for d in ids[:4]} == {IntentKind.DEAD_LETTER}
    side = [f[b"delivery"].decode() for _, f in stream_client.xrange(c.dead_letter_key)]
    # Redis 6.2 still held them pending: the fenced script dead-letters them stream-side too.
    assert side == ([] if redis7(stream_client) else ids[:4])
    assert_nothing_acked_uncovered(stream_client, progress_client, names)
    c.close()


def test_a_delivery_deleted_while_pending_holds_the_floor_until_it_is_dead_lettered(
    servers, names, stream_client, progress_client
) -> None:
    """A worker takes e0 and dies; the operator deletes e0's entry while it is pending. The
    next worker applies e1 and e2 before e0 is idle long enough to claim: the listing no
    longer shows e0, but the provider's pending list does, so the floor must stop below it
    (progress would otherwise claim e0 applied or dead-lettered, and e0 would later be
    acknowledged as covered, with no dead-letter evidence). Once claimed, e0 is
    dead-lettered with reason ``deleted`` and the floor moves on."""
    effect = Ledger()
    c = consumer(servers, names, claim_idle=1.0)
    c.start()
    ids = publish(stream_client, names, ["e0", "e1", "e2"])
    stream_client.xreadgroup(names.group, "gone", {names.stream: ">"}, count=1)
    stream_client.xdel(names.stream, ids[0])
    c.poll(effect)  # applies e1 and e2; e0 is not idle long enough to claim yet
    assert effect.runs == {"e1": 1, "e2": 1}
    progress = c.store.read(c.scope)
    if redis7(stream_client):
        # Redis 7's XAUTOCLAIM drops a deleted entry from the pending list whatever its
        # idle time, and reports it: dead-lettered in the same poll, before the floor moved.
        assert dead_evidence(progress_client, names) == {ids[0]: "deleted"}
    else:
        assert progress.floor is None or progress.floor < DeliveryId(ids[0])
        assert DeliveryId(ids[0]) in progress.gaps  # below applied ones, not resolved
    poll_until(c, effect, lambda: not pending_ids(stream_client, names))
    assert effect.runs == {"e1": 1, "e2": 1}
    assert dead_evidence(progress_client, names) == {ids[0]: "deleted"}
    progress = c.store.read(c.scope)
    assert progress.floor == DeliveryId(ids[2])
    assert progress.gaps == ()
    kinds = {r.delivery.value: r.kind for r in c.store.receipts(c.scope)}
    assert kinds[ids[0]] is IntentKind.DEAD_LETTER
    assert_nothing_acked_uncovered(stream_client, progress_client, names)
    c.close()


def test_a_deleted_pending_delivery_behind_an_applied_unacked_one_holds_the_floor(
    servers, names, stream_client, progress_client
) -> None:
    """The oldest pending delivery is applied and recorded but not yet acknowledged (its
    worker died between the two), and the next pending one's entry was deleted: the
    summary's oldest pending id is resolved, so it proves nothing about the ones after it.
    The group's pending rows hold the floor below the deleted one until it is
    dead-lettered."""
    effect = Ledger()
    c = consumer(servers, names, claim_idle=5.0, batch=10)
    c.start()
    ids = publish(stream_client, names, ["e0", "e1", "e2", "e3"])
    stream_client.xreadgroup(names.group, "crash", {names.stream: ">"}, count=1)
    c.store.apply(c.scope, DeliveryId(ids[0]), EmissionId("e0"), effect)  # no ack: it died
    stream_client.xreadgroup(names.group, "gone", {names.stream: ">"}, count=1)
    stream_client.xdel(names.stream, ids[1])
    c.poll(effect)  # applies e2 and e3; e0 and e1 are not idle long enough to claim
    assert effect.runs == {"e0": 1, "e2": 1, "e3": 1}
    progress = c.store.read(c.scope)
    if redis7(stream_client):
        # Redis 7's XAUTOCLAIM drops and reports a deleted entry whatever its idle time.
        assert dead_evidence(progress_client, names) == {ids[1]: "deleted"}
    else:
        assert progress.floor is None or progress.floor < DeliveryId(ids[1])
        assert DeliveryId(ids[1]) in progress.gaps
    assert_nothing_acked_uncovered(stream_client, progress_client, names)
    c.close()


def test_applied_and_recorded_then_deleted_before_its_ack_is_settled_from_progress(
    servers, names, stream_client, progress_client
) -> None:
    ids = publish(stream_client, names, ["e0", "e1", "e2"])
    killed_worker(servers, names, "progress_recorded", ids[1])  # applied, recorded, no ack
    stream_client.xdel(names.stream, ids[1])
    c = consumer(servers, names)

    poll_until(c, Ledger(), lambda: not pending_ids(stream_client, names) and not read(c).intents)

    assert counts(progress_client, names.ledger[0]) == {"e0": 1, "e1": 1}  # the worker's
    assert ids[1] not in dead_evidence(progress_client, names)  # applied, not dead-lettered
    [receipt] = [r for r in c.store.receipts(c.scope) if r.delivery.value == ids[1]]
    assert receipt.kind is IntentKind.ACK
    assert receipt.outcome in (SettlementOutcome.ACKED, SettlementOutcome.NOT_PENDING)
    assert read(c).floor == DeliveryId(ids[2])
    c.close()


def read(c: StreamConsumer) -> Progress:
    assert c.scope is not None
    return c.store.read(c.scope)


def test_a_consumer_deleted_with_pending_entries_leaves_settled_intents_and_reported_gaps(
    servers, names, stream_client, progress_client
) -> None:
    ids = publish(stream_client, names, ["e0", "e1", "e2", "e3"])
    killed_worker(servers, names, "progress_recorded", ids[1])
    stream_client.xgroup_delconsumer(names.stream, names.group, "w")  # drops 1, 2, 3 pending
    assert not pending_ids(stream_client, names)
    effect = Ledger()
    with capture_logs() as logs:
        c = consumer(servers, names)
        poll_until(c, effect, lambda: not read(c).intents and len(read(c).gaps) == 2)

    progress = read(c)
    # e1 was applied and recorded: its intent is closed by the provider's "not pending".
    assert progress.floor == DeliveryId(ids[1])
    assert progress.gaps == (DeliveryId(ids[2]), DeliveryId(ids[3]))  # lost, reported
    lost = [e for e in logs if e["event"] == "settle.progress.lost"]
    assert [e["delivery"] for e in lost] == ids[2:]  # once each, however many polls
    [closed] = [r for r in c.store.receipts(c.scope) if r.delivery.value == ids[1]]
    assert closed.outcome is SettlementOutcome.NOT_PENDING
    # The gap holds the floor until the operator resolves it; applying closes it.
    for d, e in ((ids[2], "e2"), (ids[3], "e3")):
        c.store.apply(c.scope, DeliveryId(d), EmissionId(e), effect)
    c.poll(effect)
    assert read(c).floor == DeliveryId(ids[3])
    assert read(c).gaps == ()
    assert effect.runs == {"e2": 1, "e3": 1}
    assert counts(progress_client, names.ledger[0]) == {"e0": 1, "e1": 1}
    c.close()


def test_setid_past_unread_entries_reports_them_and_setid_back_applies_them_once(
    servers, names, stream_client, progress_client
) -> None:
    ids = publish(stream_client, names, ["e0", "e1", "e2"])
    effect = Ledger()
    with capture_logs() as logs:
        c = consumer(servers, names, batch=8)
        c.start()
        stream_client.xgroup_setid(names.stream, names.group, ids[1])  # e0, e1 never read
        c.poll(effect)
    assert effect.runs == {"e2": 1}
    assert read(c).gaps == (DeliveryId(ids[0]), DeliveryId(ids[1]))
    assert read(c).floor is None  # the gaps hold it
    assert [e["delivery"] for e in logs if e["event"] == "settle.progress.lost"] == ids[:2]

    stream_client.xgroup_setid(names.stream, names.group, "0")  # redeliver everything
    c.poll(effect)

    assert effect.runs == {"e0": 1, "e1": 1, "e2": 1}  # e2 covered: acknowledged, not re-run
    assert read(c).floor == DeliveryId(ids[2])
    assert read(c).gaps == ()
    assert not pending_ids(stream_client, names)
    c.close()


def test_a_poll_starts_the_consumer_itself_and_both_close_spellings_work(
    servers, names, stream_client
) -> None:
    publish(stream_client, names, ["e0"])
    effect = Ledger()
    with consumer(servers, names) as c:
        assert c.scope is None
        report = c.poll(effect)  # no start() first
        assert c.scope is not None
        assert [r.outcome for r in report.receipts] == [SettlementOutcome.ACKED]
    assert effect.runs == {"e0": 1}
    assert c.dead_letter_key == f"settle:{{{names.stream}}}:dead:{names.stream}"


@pytest.mark.asyncio
async def test_async_stores_and_consumers_offer_close_aclose_and_async_with(
    servers, names, stream_client
) -> None:
    publish(stream_client, names, ["e0"])
    runs: list[str] = []

    async def effect(ctx: EffectContext) -> None:
        runs.append(ctx.emission.value)

    store = AsyncProgressStore.from_url(servers[1].url, consumer=names.consumer, namespace="t")
    async with AsyncStreamConsumer(
        redis.asyncio.Redis.from_url(servers[0].url),
        store,
        stream=names.stream,
        group=names.group,
        claim_idle=0.05,
        block=0.05,
    ) as c:
        await c.poll(effect)
    assert runs == ["e0"]
    other = AsyncProgressStore.from_url(servers[1].url, consumer=names.consumer, namespace="t")
    assert await other.scopes()
    await other.close()  # the same as aclose()
    async with AsyncProgressStore.from_url(servers[1].url, consumer=names.consumer) as third:
        await third.scopes()
    await AsyncStreamConsumer.from_urls(
        servers[0].url, servers[1].url, consumer=names.consumer, stream=names.stream,
        group=names.group,
    ).close()  # fmt: skip


def test_a_worker_killed_after_recording_a_deleted_delivery_leaves_it_settled_once(
    servers, names, stream_client, progress_client
) -> None:
    ids = publish(stream_client, names, ["e0", "e1", "e2"])
    killed_worker(servers, names, "received", ids[0])  # all three pending, worker gone
    stream_client.xdel(names.stream, ids[0])
    # The next worker claims them, records e0's dead letter (reason deleted) and is killed
    # before the provider is told.
    w = Worker(
        names,
        servers[0].url,
        servers[1].url,
        worker="w2",
        kill_at=("dead_letter_recorded", ids[0]),
        claim_idle=0.05,
    )
    w.wait_killed()
    effect = Ledger()
    c = consumer(servers, names)

    poll_until(c, effect, lambda: not pending_ids(stream_client, names) and not read(c).intents)

    assert dead_evidence(progress_client, names) == {ids[0]: "deleted"}  # recorded once
    assert effect.runs == {"e1": 1, "e2": 1}
    assert read(c).floor == DeliveryId(ids[2])
    [told] = [r for r in c.store.receipts(c.scope) if r.delivery.value == ids[0]]
    assert told.kind is IntentKind.DEAD_LETTER
    assert told.outcome is (
        SettlementOutcome.NOT_PENDING if redis7(stream_client) else SettlementOutcome.ACKED
    )
    c.close()
