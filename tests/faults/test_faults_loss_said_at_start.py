"""A settler started after Redis lost shard states says so too (docs/operations.md, "When
Redis forgets"). The namespace metadata can outlive the states of its shards: a cluster
node restarted without persistence loses the shards it held while the metadata's node keeps
it, and a DEL takes what it names. Every settler claims each shard before its first write,
so a shard without state under metadata that is older than the claims of its creator is a
loss. A settler running through the loss said it at its first write; one started after it
(the application restarted with the node, a new worker) claimed the shards again silently,
and the retry of an operation whose completed record was lost ran again, logged as an
ordinary new reservation. A namespace whose metadata was just made (its creator may still
be claiming its shards) says nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

from settle import AsyncSettler, Reserved, Settler
from settle._core.keys import Keys
from settle.embedded import EmbeddedRedis

pytestmark = [pytest.mark.faults]

REQ = {"amount": 1000, "currency": "EUR"}
WHO = "tenant:acme"
SHARDS = 4


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as s:
        yield s


def _lost(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "settle.namespace.state_lost"]


def _lose_every_shard(raw: redis.Redis, namespace: str) -> None:
    """What a node restarted without persistence loses when it holds every shard and not the
    metadata: the shard states and the records, the metadata kept."""
    for key in list(raw.scan_iter(match=f"settle:{{{namespace}:*")):
        raw.delete(key)
    assert raw.exists(Keys(namespace, SHARDS).meta) == 1


def _made_minutes_ago(raw: redis.Redis, namespace: str, minutes: int) -> None:
    """The namespace was first used ``minutes`` ago (its metadata's ``created``, ms on the
    server clock): its creator has long claimed every shard."""
    seconds, _ = raw.time()
    raw.hset(Keys(namespace, SHARDS).meta, "created", seconds * 1000 - minutes * 60_000)


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_settler_started_after_the_shard_states_were_lost_says_so(
    server: EmbeddedRedis, flavour: str
) -> None:
    op = "charge-7"
    raw = redis.Redis.from_url(server.url)
    with Settler.from_url(server.url, namespace="paid", shards=SHARDS) as settler:
        held = settler.reserve(op, REQ, principal=WHO)
        assert isinstance(held, Reserved)
        settler.complete(held.reservation, {"charge": "ch_1"})
    _made_minutes_ago(raw, "paid", 10)
    _lose_every_shard(raw, "paid")
    with capture_logs() as logs:
        if flavour == "sync":
            with Settler.from_url(server.url, namespace="paid", shards=SHARDS) as fresh:
                again = fresh.reserve(op, REQ, principal=WHO)
                fresh.reserve("charge-8", REQ, principal=WHO)
        else:

            async def main() -> Any:
                async with AsyncSettler.from_url(server.url, namespace="paid", shards=SHARDS) as a:
                    first = await a.reserve(op, REQ, principal=WHO)
                    await a.reserve("charge-8", REQ, principal=WHO)
                    return first

            again = asyncio.run(main())
    # The completed record is gone: the retry reserves again (the charge would run again)...
    assert isinstance(again, Reserved)
    # ...and the operator hears of it, once, from the start-up that claimed the lost shards.
    [said] = _lost(logs)
    assert said["log_level"] == "error"
    assert said["namespace"] == "paid"
    assert said["script"] == "claim"
    assert said["state_key"].startswith("settle:{paid:")
    raw.close()


def test_a_settler_started_while_a_new_namespace_is_being_claimed_says_nothing(
    server: EmbeddedRedis,
) -> None:
    raw = redis.Redis.from_url(server.url)
    # Another settler has just made the metadata and not claimed the shards yet.
    raw.hset(Keys("fresh", SHARDS).meta, mapping={"shards": SHARDS, "fpv": 1})
    _made_minutes_ago(raw, "fresh", 0)
    with (
        capture_logs() as logs,
        Settler.from_url(server.url, namespace="fresh", shards=SHARDS) as settler,
    ):
        assert isinstance(settler.reserve("op-1", REQ, principal=WHO), Reserved)
    assert _lost(logs) == []
    raw.close()


def test_a_new_namespace_and_a_second_start_say_nothing(server: EmbeddedRedis) -> None:
    with capture_logs() as logs:
        for _ in range(2):
            with Settler.from_url(server.url, namespace="new", shards=SHARDS) as settler:
                assert settler.reserve("op-1", REQ, principal=WHO) is not None
    assert _lost(logs) == []


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_settler_started_on_an_old_namespace_that_lost_nothing_says_nothing(
    server: EmbeddedRedis, flavour: str
) -> None:
    """Found in review: only new namespaces were started on without a loss. Every restart of
    an application whose namespace is more than 5 minutes old (most of them) finds every
    shard's state: a false alarm there would page an operator on every deploy."""
    raw = redis.Redis.from_url(server.url)
    with Settler.from_url(server.url, namespace="old", shards=SHARDS) as settler:
        assert isinstance(settler.reserve("op-1", REQ, principal=WHO), Reserved)
    _made_minutes_ago(raw, "old", 60)
    with capture_logs() as logs:
        if flavour == "sync":
            with Settler.from_url(server.url, namespace="old", shards=SHARDS) as fresh:
                assert fresh.reserve("op-2", REQ, principal=WHO) is not None
        else:

            async def main() -> None:
                async with AsyncSettler.from_url(server.url, namespace="old", shards=SHARDS) as a:
                    assert await a.reserve("op-2", REQ, principal=WHO) is not None

            asyncio.run(main())
    assert _lost(logs) == []
    raw.close()


def test_a_settler_running_through_a_loss_under_old_metadata_says_it_once(
    server: EmbeddedRedis,
) -> None:
    """Found in review: the write that finds the loss says it, and the re-claim of every
    shard that follows makes the lost states again: that re-claim is not a start-up and
    must not say the same loss a second time."""
    raw = redis.Redis.from_url(server.url)
    with Settler.from_url(server.url, namespace="paid", shards=SHARDS) as settler:
        assert isinstance(settler.reserve("op-1", REQ, principal=WHO), Reserved)
        _made_minutes_ago(raw, "paid", 10)
        _lose_every_shard(raw, "paid")
        with capture_logs() as logs:
            for n in range(2, 6):
                assert isinstance(settler.reserve(f"op-{n}", REQ, principal=WHO), Reserved)
    [said] = _lost(logs)
    assert said["script"] == "reserve"
    raw.close()
