"""``get_many`` reads several records in one script call per shard and answers what ``get``
answers for each: every state (an expired lease reads as provisional), no record, the same
id twice, more records of one shard than one call reads, and a key that is no record."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from settle import Reserved, Settler
from settle._core.engine import GET_MANY
from settle._core.keys import Keys, shard_of
from settle.errors import CorruptRecord, InvalidInput


async def _reserved(api: Any, op: str, lease: float = 30) -> Reserved:
    r = await api.reserve(op, {"op": op}, principal="tenant:a", lease=lease)
    assert isinstance(r, Reserved)
    return r


@pytest.mark.asyncio
async def test_get_many_answers_what_get_answers_for_each_id(api: Any) -> None:
    ops = [f"op-{i}" for i in range(GET_MANY * 4 + 50)]  # more than one call's worth a shard
    for i, op in enumerate(ops):
        r = await _reserved(api, op, lease=0.001 if i % 5 == 4 else 30)
        if i % 5 == 1:
            await api.complete(r.reservation, {"n": i})
        elif i % 5 == 2:
            await api.fail(r.reservation, RuntimeError("declined"))
        elif i % 5 == 3:
            await api.mark_provisional(r.reservation, reason="timeout")
    await asyncio.sleep(0.02)  # the 1 ms leases pass: those records read as provisional
    by_shard = [shard_of(op, 4) for op in ops]
    assert max(by_shard.count(s) for s in range(4)) > GET_MANY
    asked = [*ops, "op-never", ops[7], "op-also-never"]

    many = await api.get_many(asked)
    one_by_one = [await api.get(op) for op in asked]
    assert many == one_by_one
    states = {r.state.value for r in many if r is not None}
    assert states == {"pending", "completed", "failed", "provisional"}
    assert many[-3] is None
    assert many[-2] == many[7]
    assert [r.reason for r in many[4:5] if r is not None] == ["lease_expired"]
    assert await api.get_many([]) == []


def test_a_key_that_is_no_record_is_a_corrupt_record_naming_it(
    settler: Settler, redis_client: redis.Redis
) -> None:
    r = settler.reserve("op-fine", {}, principal="tenant:a", lease=30)
    assert isinstance(r, Reserved)
    keys = Keys(settler.config.namespace, settler.config.shards)
    redis_client.set(keys.record("op-garbage"), b"not a settle record")
    with pytest.raises(CorruptRecord) as raised:
        settler.get_many(["op-fine", "op-garbage"])
    assert raised.value.operation_id == "op-garbage"


@pytest.mark.asyncio
async def test_get_many_refuses_what_is_not_a_list_of_ids(api: Any) -> None:
    """A str is not a list of ids (its characters would be read as ids), and an iterator
    would be used up before its records are put back in its order: both are refused,
    typed, before anything is read."""
    await _reserved(api, "a")
    for wrong in ("ab", iter(["a"]), {"a"}):
        with pytest.raises(InvalidInput, match="list of operation ids"):
            await api.get_many(wrong)
    assert [r.operation_id for r in await api.get_many(("a",)) if r is not None] == ["a"]
