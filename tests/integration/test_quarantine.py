"""SPEC 3: quarantine entries are evidence; list, filter, get, resolve and follow them."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from structlog.testing import capture_logs

from settle import AsyncSettler, QuarantineKind, Reservation, Settler
from settle._core.keys import Keys, shard_of
from settle.errors import CorruptRecord, InvalidInput, QuarantineNotFound
from settle.testing import AsyncMemorySettler, ManualClock

WHO = "tenant:acme"


async def _stale(api: Any, op: str, payload: Any) -> Any:
    """A late response from a worker whose generation was superseded."""
    old = (await api.reserve(op, {"op": op}, principal=WHO)).reservation
    await api.mark_provisional(old, reason="timeout")
    await api.reserve(op, {"op": op}, principal=WHO)
    return await api.complete(old, payload)


def _ghost(op: str) -> Reservation:
    return Reservation(
        operation_id=op,
        fingerprint="0" * 64,
        fingerprint_version=1,
        binding=WHO,
        generation=1,
        attempt_id="ghost",
    )


@pytest.mark.asyncio
async def test_list_filters_by_kind_operation_and_resolution(api: Any) -> None:
    s1 = await _stale(api, "op-a", {"n": 1})
    s2 = await _stale(api, "op-b", {"n": 2})
    s3 = await api.complete(_ghost("op-c"), {"n": 3})
    everything = await api.quarantine.list()
    assert [e.ref for e in everything] == [s3.quarantine_id, s2.quarantine_id, s1.quarantine_id]
    oldest_first = await api.quarantine.list(newest_first=False)
    assert [e.ref for e in oldest_first] == [s1.quarantine_id, s2.quarantine_id, s3.quarantine_id]
    stale = await api.quarantine.list(kind=QuarantineKind.STALE_GENERATION)
    assert {e.operation_id for e in stale} == {"op-a", "op-b"}
    assert [e.operation_id for e in await api.quarantine.list(operation_id="op-b")] == ["op-b"]
    assert len(await api.quarantine.list(limit=2)) == 2
    await api.quarantine.resolve(s1.quarantine_id, note="refunded by hand")
    open_ = await api.quarantine.list(unresolved=True)
    assert {e.operation_id for e in open_} == {"op-b", "op-c"}


@pytest.mark.asyncio
async def test_a_walk_of_headers_is_the_scan_without_the_rest(
    settler: Settler, async_settler: AsyncSettler
) -> None:
    # What `settle stats` counts from: the walk of scan(), each entry as its header.
    refs = [settler.complete(_ghost(f"op-{n}"), {"n": n}).quarantine_id for n in range(9)]
    assert len({shard_of(f"op-{n}", 4) for n in range(9)}) > 1
    for ref in refs[::3]:
        assert ref is not None
        settler.quarantine.resolve(ref, note="seen")
    await _stale(async_settler, "op-late", {"n": 9})
    for filters in (
        {},
        {"unresolved": True},
        {"kind": QuarantineKind.STALE_GENERATION},
        {"operation_id": "op-4"},
    ):
        want = [
            (e.ref, e.kind, e.at, e.resolution is not None)
            for e in settler.quarantine.scan(**filters)  # type: ignore[arg-type]
        ]
        assert want
        walk = settler._core.quarantine_scan(**filters).headers()  # type: ignore[arg-type]
        got = [(h.ref, h.kind, h.at, h.resolved) for h in settler.quarantine._scanned(walk)]
        assert got == want, filters
        walk = async_settler._core.quarantine_scan(**filters).headers()  # type: ignore[arg-type]
        got = [
            (h.ref, h.kind, h.at, h.resolved) async for h in async_settler.quarantine._scanned(walk)
        ]
        assert got == want, filters


@pytest.mark.asyncio
async def test_list_filters_by_time(api: Any) -> None:
    await _stale(api, "op-a", {"n": 1})
    await asyncio.sleep(0.02)
    cut = datetime.now(UTC)
    await asyncio.sleep(0.02)
    await _stale(api, "op-b", {"n": 2})
    assert [e.operation_id for e in await api.quarantine.list(since=cut)] == ["op-b"]
    assert [e.operation_id for e in await api.quarantine.list(until=cut)] == ["op-a"]
    future = cut + timedelta(days=1)
    assert await api.quarantine.list(since=future) == []


@pytest.mark.asyncio
async def test_resolve_keeps_the_evidence_and_the_first_note(api: Any) -> None:
    s = await _stale(api, "op-a", {"card": "tok", "amount": 5})
    entry = await api.quarantine.get(s.quarantine_id)
    res = await api.quarantine.resolve(s.quarantine_id, note="customer refunded")
    assert res.note == "customer refunded"
    again = await api.quarantine.resolve(entry.id, note="second opinion")  # bare id works too
    assert again.note == "customer refunded"
    after = await api.quarantine.get(s.quarantine_id)
    assert after.resolution is not None
    assert after.model_dump(exclude={"resolution"}) == entry.model_dump(exclude={"resolution"})


@pytest.mark.asyncio
async def test_get_and_resolve_unknown_ids_raise_typed_errors(api: Any) -> None:
    with pytest.raises(QuarantineNotFound):
        await api.quarantine.get("0/1-0")
    with pytest.raises(QuarantineNotFound):
        await api.quarantine.resolve("1-0", note="x")
    with pytest.raises(InvalidInput):
        await api.quarantine.get("not-an-id")
    with pytest.raises(InvalidInput):
        await api.quarantine.list(kind="nonsense")


async def _followed(settler: Any, count: int, poll_interval: float) -> list[str]:
    """The operation ids of the first ``count`` entries a follow of ``settler`` yields."""
    seen: list[str] = []
    async for entry in settler.quarantine.follow(poll_interval=poll_interval):
        seen.append(entry.operation_id)
        if len(seen) == count:
            break
    return seen


@pytest.mark.asyncio
async def test_follow_yields_entries_written_after_it_started(
    async_settler: AsyncSettler,
) -> None:
    await _stale(async_settler, "before", {"n": 0})
    task = asyncio.create_task(_followed(async_settler, 2, 0.02))
    await asyncio.sleep(0.3)  # let the follower find where "now" is
    await _stale(async_settler, "after-1", {"n": 1})
    await async_settler.complete(_ghost("after-2"), {"n": 2})
    seen = await asyncio.wait_for(task, timeout=5)
    assert seen == ["after-1", "after-2"]


@pytest.mark.asyncio
async def test_follow_does_not_hold_back_a_shard_whose_ids_ran_ahead_of_its_clock(
    async_settler: AsyncSettler, redis_client: Any
) -> None:
    # After the server's clock stepped back, a stream appends after its last id: that
    # shard's ids run ahead of the time (XSETID leaves a stream so). A follow that waited
    # for the clock to pass the ids would show nothing of that shard until it did.
    seed = await async_settler.complete(_ghost("ahead-0"), {"n": 0})
    shard = int(seed.quarantine_id.split("/")[0])
    stream = async_settler._core.keys.quarantine(shard)
    last_ms = int(seed.quarantine_id.split("/")[1].split("-")[0])
    redis_client.execute_command("XSETID", stream, f"{last_ms + 3_600_000}-0")
    others = [op for op in (f"other-{i}" for i in range(40)) if shard_of(op, 4) != shard]
    ahead = [op for op in (f"ahead-{i}" for i in range(1, 40)) if shard_of(op, 4) == shard]
    task = asyncio.create_task(_followed(async_settler, 3, 0.02))
    await asyncio.sleep(0.3)  # let the follower find where "now" is
    written = [
        await async_settler.complete(_ghost(op), {"n": 1}) for op in (ahead[0], others[0], ahead[1])
    ]
    assert written[0].quarantine_id.split("/")[1].startswith(str(last_ms + 3_600_000))
    seen = await asyncio.wait_for(task, timeout=5)
    assert sorted(seen) == sorted([ahead[0], others[0], ahead[1]])
    assert seen.index(ahead[0]) < seen.index(ahead[1])  # one shard's entries in its order


@pytest.mark.asyncio
async def test_follow_hands_out_what_it_read_before_the_clock_stepped_back() -> None:
    # An entry read just before the server's clock stepped back an hour carries a time the
    # clock will not pass again for an hour; a follow that waited for it showed nothing of it
    # (nor of anything written after it) for that long. One more read later it goes out.
    clock = ManualClock()
    settler = AsyncMemorySettler(namespace="follow-step", shards=4, clock=clock)
    task = asyncio.create_task(_followed(settler, 2, 0.01))
    await asyncio.sleep(0.05)  # let the follower find where "now" is
    await settler.complete(_ghost("before-the-step"), {"n": 1})
    await asyncio.sleep(0.05)  # read, and held: the clock has not passed its time
    clock.now_ms -= 3_600_000
    await settler.complete(_ghost("after-the-step"), {"n": 2})
    seen = await asyncio.wait_for(task, timeout=5)
    assert sorted(seen) == ["after-the-step", "before-the-step"]


def test_follow_sync_in_a_thread(redis_url: str, namespace: str) -> None:
    reader = Settler.from_url(redis_url, namespace=namespace, shards=4)
    writer = Settler.from_url(redis_url, namespace=namespace, shards=4)
    seen: list[str] = []
    started = threading.Event()

    since = datetime.now(UTC)

    def follow() -> None:
        stream = reader.quarantine.follow(poll_interval=0.02, kind="unknown_operation", since=since)
        started.set()
        for entry in stream:
            seen.append(entry.operation_id)
            return

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    started.wait(5)
    old = writer.reserve("x", {}, principal=WHO).reservation
    writer.complete(old, {"n": 1})
    writer.complete(old, {"n": 2})  # conflicting: filtered out by kind
    writer.complete(_ghost("ghost-op"), {"n": 3})
    t.join(5)
    assert seen == ["ghost-op"]
    reader.close()
    writer.close()


@pytest.mark.asyncio
async def test_payload_is_capped_with_full_size_and_digest(redis_url: str, namespace: str) -> None:
    s = AsyncSettler(
        aioredis.Redis.from_url(redis_url), namespace=namespace, quarantine_payload_bytes=16
    )
    big = {"blob": "x" * 1000}
    settlement = await s.complete(_ghost("big"), big)
    entry = await s.quarantine.get(settlement.quarantine_id)
    assert len(entry.payload.data) == 16
    assert entry.payload.truncated
    assert entry.payload.size > 1000
    await s.aclose()


_FOREIGN = {
    "fields missing": {"garbage": "1"},
    "a newer kind": {
        "op": "op-n",
        "kind": "kind_of_a_newer_version",
        "action": "complete",
        "fp": "0" * 64,
        "fpv": "1",
        "bind": WHO,
        "gen": "1",
        "psize": "0",
        "pdig": "0" * 64,
        "aid": "a",
        "at": "1",
    },
}


@pytest.mark.asyncio
@pytest.mark.parametrize("fields", list(_FOREIGN.values()), ids=list(_FOREIGN))
async def test_an_entry_settle_cannot_decode_is_a_corrupt_record_naming_it(
    settler: Settler, async_settler: AsyncSettler, redis_url: str, fields: dict[str, str]
) -> None:
    # Used to raise a bare KeyError / ValueError from every listing.
    real = settler.complete(_ghost("op-a"), {"n": 1})
    assert real.quarantine_id is not None
    shard = int(real.quarantine_id.split("/")[0])
    stream = Keys(settler.config.namespace, settler.config.shards).quarantine(shard)
    client = redis.Redis.from_url(redis_url)
    try:
        foreign = f"{shard}/{client.xadd(stream, fields).decode()}"  # type: ignore[arg-type]
    finally:
        client.close()
    with pytest.raises(CorruptRecord, match=f"quarantine entry {foreign} cannot be decoded") as e:
        settler.quarantine.list()
    assert repr(stream) in str(e.value)
    assert "run one settle version" in str(e.value).lower()
    with pytest.raises(CorruptRecord, match=foreign):
        list(settler.quarantine.scan())
    with pytest.raises(CorruptRecord, match=foreign):
        settler.quarantine.get(foreign)
    with pytest.raises(CorruptRecord, match=foreign):
        await async_settler.quarantine.list()
    assert settler.quarantine.get(real.quarantine_id).operation_id == "op-a"


@pytest.mark.parametrize(
    "resolution",
    # Nested deeper than the interpreter's stack: a bare RecursionError from json.
    ["not json", "[" * 100_000],
    ids=["not json", "nested 100000 deep"],
)
def test_a_resolution_settle_cannot_decode_is_a_corrupt_record_naming_it(
    settler: Settler, redis_url: str, resolution: str
) -> None:
    """Written by another program: resolving the entry again is refused with the entry
    named (its read, before the resolve, decodes the resolution too)."""
    real = settler.complete(_ghost("op-r"), {"n": 1})
    assert real.quarantine_id is not None
    shard, entry_id = real.quarantine_id.split("/")
    resolutions = Keys(settler.config.namespace, settler.config.shards).resolutions(int(shard))
    client = redis.Redis.from_url(redis_url)
    try:
        client.hset(resolutions, entry_id, resolution)
    finally:
        client.close()
    with pytest.raises(CorruptRecord, match=f"quarantine entry {real.quarantine_id}"):
        settler.quarantine.resolve(real.quarantine_id, note="checked")
    with pytest.raises(CorruptRecord, match=f"quarantine entry {real.quarantine_id}"):
        settler.quarantine.get(real.quarantine_id)


def _good_entry(settler: Settler, op: str) -> None:
    settler.complete(_ghost(op), {"n": 1})


@pytest.mark.asyncio
async def test_follow_goes_on_past_an_entry_it_cannot_decode(
    async_settler: AsyncSettler, redis_url: str, namespace: str
) -> None:
    """``quarantine.follow`` raised CorruptRecord at an entry this version cannot decode,
    and every entry after it was lost to the loop (a follow made again stopped at it again).
    It skips that one, logs ``settle.quarantine.undecodable`` naming it, and yields on."""
    with Settler.from_url(redis_url, namespace=namespace, shards=4) as writer:
        since = datetime.now(UTC) - timedelta(seconds=5)
        _good_entry(writer, "before")
        foreign = writer.client.xadd(writer._core.keys.quarantine(0), {"op": "x", "kind": "future"})
        _good_entry(writer, "after")
    seen: list[str] = []
    with capture_logs() as logs:
        async for entry in async_settler.quarantine.follow(since=since, poll_interval=0.02):
            seen.append(entry.operation_id)
            if len(seen) == 2:
                break
    assert seen == ["before", "after"]
    [event] = [e for e in logs if e["event"] == "settle.quarantine.undecodable"]
    assert event["quarantine_id"] == f"0/{foreign.decode()}"
    assert event["log_level"] == "error"
    assert "future" in event["reason"]


def test_follow_sync_goes_on_past_an_entry_it_cannot_decode(redis_url: str, namespace: str) -> None:
    with Settler.from_url(redis_url, namespace=namespace, shards=4) as settler:
        since = datetime.now(UTC) - timedelta(seconds=5)
        _good_entry(settler, "before")
        settler.client.xadd(settler._core.keys.quarantine(1), {"op": "order-x"})
        _good_entry(settler, "after")
        seen = []
        for entry in settler.quarantine.follow(since=since, poll_interval=0.02):
            seen.append(entry.operation_id)
            if len(seen) == 2:
                break
    assert seen == ["before", "after"]
