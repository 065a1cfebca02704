"""The overview counts records by state with a bounded number of script calls (it made one
GET-like call per record, up to 10 000 per page view), and its counts and its limit mean
what they meant: the first ``record_limit`` records the SCAN finds, "more" when there are."""

from __future__ import annotations

import time
from collections import Counter

import pytest
import redis

from settle import AsyncSettler, Reserved, Settler
from settle._core.keys import Keys
from settle.cli.stats import SCAN_COUNT, operation_id_of, record_key_match
from settle.embedded import EmbeddedRedis
from settle.models import State
from settle.web import _query, create_app
from tests.web.conftest import client_for
from tests.web.evidence import conflicting

pytestmark = pytest.mark.asyncio

RECORDS = 300
SCRIPTS = ("evalsha", "evalsha_ro", "eval", "eval_ro", "fcall", "fcall_ro")


def _records_in_every_state(writer: Settler) -> list[str]:
    ops = [f"order-{i}" for i in range(RECORDS)]
    for i, op in enumerate(ops):
        r = writer.reserve(op, {"n": i}, principal="tenant:acme", lease=0.001 if i % 5 == 4 else 30)
        assert isinstance(r, Reserved)
        if i % 5 == 1:
            writer.complete(r.reservation, {"charge_id": f"ch_{i}"})
        elif i % 5 == 2:
            writer.fail(r.reservation, RuntimeError("declined"))
        elif i % 5 == 3:
            writer.mark_provisional(r.reservation, reason="timeout")
    time.sleep(0.02)  # the 1 ms leases pass: those records read as provisional
    return ops


def _script_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in SCRIPTS)


async def _one_get_each(settler: AsyncSettler) -> Counter[str]:
    """What the overview counted before: SCAN, then one ``get`` per record key."""
    keys = Keys(settler.config.namespace, settler.config.shards)
    states: Counter[str] = Counter({s.value: 0 for s in State})
    async for key in settler.client.scan_iter(
        match=record_key_match(settler.config.namespace), count=SCAN_COUNT
    ):
        op = operation_id_of(key, keys)
        if op is not None and (record := await settler.get(op)) is not None:
            states[record.state.value] += 1
    return states


async def _overview(reader: AsyncSettler, record_limit: int) -> _query.Overview:
    return await _query.overview(
        reader,
        window="1h",
        now=await _query.server_now(reader),
        record_limit=record_limit,
        entry_limit=100,
    )


async def test_the_overview_counts_every_state_in_a_few_script_calls(
    writer: Settler, reader: AsyncSettler, redis_client: redis.Redis
) -> None:
    _records_in_every_state(writer)
    await reader.check()  # the start-up check's calls are not the overview's
    before = _script_calls(redis_client)
    data = await _overview(reader, record_limit=10_000)
    calls = _script_calls(redis_client) - before
    # One get_many per shard (4 shards, under 100 records each) and the quarantine listing
    # (a read per shard); it was one call per record, 300 and more.
    assert calls <= 12, calls
    assert not data.records_capped
    assert data.records == dict(await _one_get_each(reader))
    assert data.records == {
        "pending": RECORDS // 5,
        "provisional": 2 * RECORDS // 5,  # marked, and leases that passed
        "completed": RECORDS // 5,
        "failed": RECORDS // 5,
    }


async def test_the_record_limit_still_counts_the_first_records_the_scan_finds(
    writer: Settler, reader: AsyncSettler, monkeypatch: pytest.MonkeyPatch
) -> None:
    _records_in_every_state(writer)
    truth = await _one_get_each(reader)
    monkeypatch.setattr(_query, "RECORD_BATCH", 7)  # many batches, and limits across them
    for limit in (1, 6, 7, 8, 14, 15, RECORDS - 1, RECORDS, RECORDS + 1, 10_000):
        data = await _overview(reader, record_limit=limit)
        assert data.records_capped == (limit < RECORDS), limit
        assert sum(data.records.values()) == min(limit, RECORDS), limit
        assert all(data.records[s] <= truth[s] for s in truth), limit
        if limit >= RECORDS:
            assert data.records == dict(truth)


@pytest.mark.asyncio
async def test_the_overview_of_a_large_keyspace_is_served_while_redis_answers() -> None:
    """Found in review: the request's deadline (``redis_timeout``, all its Redis calls in
    all) also ended the overview's SCAN of a large keyspace, every SCAN answered at once:
    on a Redis holding 8 million other keys the overview was a 503 "Redis did not answer
    within 5 s" on every load (it took 5 to 6 s and was served before). Each reply of that
    walk now restarts the bound; a Redis that stops answering still gets the 503."""
    with EmbeddedRedis() as server:
        with Settler.from_url(server.url, namespace="big", shards=2) as writer:
            writer.check()
            conflicting(writer, "order-1")
            writer.client.execute_command("DEBUG", "POPULATE", 2_000_000, "other")
        reader = AsyncSettler.from_url(server.url, namespace="big", shards=2)
        try:
            async with client_for(create_app(reader, redis_timeout=0.3)) as browser:
                started = time.monotonic()
                page = await browser.get("/", timeout=120)
                took = time.monotonic() - started
                assert page.status_code == 200, page.text[-400:]
                assert took > 0.3  # the walk took longer than the bound: it was extended
        finally:
            await reader.aclose()
