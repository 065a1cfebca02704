"""The namespace's own keys lost or damaged (review of durability, items 2 and 3): a client
with another shard count, started after the metadata was lost, is refused by the surviving
shard states without re-creating the metadata with its count (which locked out every correct
client); a shard state or metadata key of another type is a typed error that names it, and
nothing is written."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
import redis

from settle import AsyncSettler, ConfigurationError, Replay, Reserved, Settler
from settle._core.keys import Keys
from settle.errors import CorruptRecord
from tests.integration.conftest import Awaitable

pytestmark = [pytest.mark.faults, pytest.mark.asyncio]


@pytest_asyncio.fixture(params=["sync", "async"])
async def make(
    request: pytest.FixtureRequest, redis_url: str, namespace: str
) -> AsyncIterator[Callable[[int], Any]]:
    """``make(shards)``: a settler of the test's namespace in the test's flavour, awaitable
    either way; every one is closed at the end."""
    made: list[Settler | AsyncSettler] = []

    def build(shards: int) -> Any:
        if request.param == "sync":
            s = Settler.from_url(redis_url, namespace=namespace, shards=shards)
            made.append(s)
            return Awaitable(s)
        a = AsyncSettler.from_url(redis_url, namespace=namespace, shards=shards)
        made.append(a)
        return a

    yield build
    for s in made:
        if isinstance(s, Settler):
            s.close()
        else:
            await s.aclose()


def _state(client: redis.Redis, namespace: str) -> dict[bytes, Any]:
    """Every key of the namespace with its type and value (what 'nothing written' compares)."""
    found: dict[bytes, Any] = {}
    for key in client.scan_iter(match=f"settle:{{{namespace}*"):
        kind = client.type(key)
        found[key] = (kind, client.dump(key))
    return found


async def test_a_refused_client_leaves_lost_metadata_unwritten(
    make: Any, redis_client: redis.Redis, namespace: str
) -> None:
    good = make(4)
    for i in range(20):
        r = await good.reserve(f"op-{i}", {"i": i}, principal="p")
        await good.complete(r.reservation, {"ok": i})
    meta = Keys(namespace, 4).meta
    assert redis_client.hget(meta, "shards") == b"4"
    redis_client.delete(meta)  # the metadata is lost, the shard states survive
    before = _state(redis_client, namespace)

    bad = make(2)
    with pytest.raises(ConfigurationError, match="created for 4 shards"):
        await bad.reserve("new-op", {"i": 1}, principal="p")
    assert not redis_client.exists(meta)  # not re-created with the refused client's count
    assert _state(redis_client, namespace) == before

    # A correctly configured client, started afterwards, works and re-creates the metadata.
    again = make(4)
    assert isinstance(await again.reserve("op-3", {"i": 3}, principal="p"), Replay)
    assert isinstance(await again.reserve("op-new", {"i": 0}, principal="p"), Reserved)
    assert redis_client.hget(meta, "shards") == b"4"
    with pytest.raises(ConfigurationError, match="namespace was created for 4 shards"):
        await make(2).reserve("new-op", {"i": 1}, principal="p")


async def test_metadata_made_again_with_another_count_is_named_as_such(
    make: Any, redis_client: redis.Redis, namespace: str
) -> None:
    """Issue 16 (clear messages): the metadata says 4 shards, the shard states were made for
    16 (the metadata lost and made again by a 4-shard client). A 4-shard client was told to
    "use the stored count", which it did, and the CLI's --shards 16 was refused by the
    metadata: the message says the metadata was made again, and where both counts show."""
    first = make(16)
    await first.reserve("op-1", {"i": 1}, principal="p")
    meta = Keys(namespace, 16).meta
    redis_client.hset(meta, "shards", 4)
    before = _state(redis_client, namespace)
    with pytest.raises(ConfigurationError, match="created for 16 shards") as info:
        await make(4).reserve("op-2", {"i": 2}, principal="p")
    assert "metadata holds this client's count" in str(info.value)
    assert "settle doctor" in str(info.value)
    assert _state(redis_client, namespace) == before


async def test_a_shard_state_of_another_type_is_a_typed_error_naming_it(
    make: Any, redis_client: redis.Redis, namespace: str
) -> None:
    s = make(4)
    r = await s.reserve("op-1", {"a": 1}, principal="p")
    keys = Keys(namespace, 4)
    state = keys.generation(keys.of("op-1")[0])
    redis_client.delete(state)
    redis_client.set(state, "oops")
    before = _state(redis_client, namespace)
    for call in (
        lambda: s.complete(r.reservation, {"ok": 1}),
        lambda: s.reserve("op-1", {"a": 1}, principal="p"),
    ):
        with pytest.raises(CorruptRecord, match="is not a hash") as info:
            await call()
        assert state in str(info.value)
        assert info.value.operation_id == "op-1"
    assert _state(redis_client, namespace) == before  # nothing was written


async def test_a_replay_on_a_shard_state_of_another_type_is_a_typed_error(
    make: Any, redis_client: redis.Redis, namespace: str
) -> None:
    """The replay of a settled operation is answered by the read head, which checks the
    shard's claim too: a state of another type is the same typed error there."""
    s = make(4)
    r = await s.reserve("op-1", {"a": 1}, principal="p")
    await s.complete(r.reservation, {"ok": 1})
    keys = Keys(namespace, 4)
    state = keys.generation(keys.of("op-1")[0])
    redis_client.delete(state)
    redis_client.set(state, "oops")
    before = _state(redis_client, namespace)
    with pytest.raises(CorruptRecord, match="is not a hash") as info:
        await s.reserve("op-1", {"a": 1}, principal="p")
    assert state in str(info.value)
    assert _state(redis_client, namespace) == before  # nothing was written


async def test_metadata_of_another_type_is_a_typed_error_naming_it(
    make: Any, redis_client: redis.Redis, namespace: str
) -> None:
    meta = Keys(namespace, 4).meta
    redis_client.set(meta, "oops")
    with pytest.raises(CorruptRecord, match="is not a hash") as info:
        await make(4).reserve("op-2", {"a": 1}, principal="p")
    assert meta in str(info.value)
    assert redis_client.get(meta) == b"oops"
    assert list(redis_client.scan_iter(match=f"settle:{{{namespace}:*")) == []
