"""What Redis forgets (SPEC §1, §4): a restart without persistence, a FLUSHALL under live
clients, and a DEL (or an eviction) of one shard's generation state.

A worker that holds a reservation from before the loss must never have its late settlement
accepted, the generation handed downstream as a fencing token must never go backwards, and
new reservations must work right after the loss with nobody stepping in. A client with
another shard count must never write, also when the namespace metadata was lost and then
re-created by that client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis
from structlog.testing import capture_logs

from settle import AsyncSettler, ConfigurationError, QuarantineKind, Reserved, Settler, Verdict
from settle._core.keys import shard_of
from settle.embedded import EmbeddedRedis
from tests.acl import app_user

pytestmark = [pytest.mark.faults]

REQ = {"amount": 1000, "currency": "EUR"}
WHO = "tenant:acme"
OPS = [f"order-{i}" for i in range(12)]  # several per shard, so every shard's state is used


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as s:  # persistence off: a restart comes back empty
        yield s


def _hold_everything(settler: Settler) -> dict[str, Reserved]:
    """Reserve every op, and take each over once, so workers hold fenced-off reservations."""
    held = {}
    for op in OPS:
        first = settler.reserve(op, REQ, principal=WHO)
        assert isinstance(first, Reserved)
        settler.mark_provisional(first.reservation, reason="timeout")
        second = settler.reserve(op, REQ, principal=WHO)
        assert isinstance(second, Reserved)
        held[op] = second
    return held


def _after_the_loss(settler: Settler, held: dict[str, Reserved]) -> None:
    """New reservations work at once, with generations above every one issued before, and
    no settlement of a reservation from before the loss is accepted."""
    before = max(r.reservation.generation for r in held.values())
    fresh = {}
    for op in OPS:
        again = settler.reserve(op, REQ, principal=WHO)
        assert isinstance(again, Reserved), again
        assert again.reservation.generation > before  # the fencing token never goes back
        fresh[op] = again
    for op, old in held.items():
        late = settler.complete(old.reservation, {"late": True})
        assert late.verdict is Verdict.QUARANTINED
        assert late.kind in (QuarantineKind.STALE_GENERATION, QuarantineKind.UNKNOWN_OPERATION)
        assert settler.get(op).generation == fresh[op].reservation.generation  # type: ignore[union-attr]
    for op, new in fresh.items():
        assert settler.complete(new.reservation, {"ok": op}).verdict is Verdict.ACCEPTED


def test_a_restart_without_persistence_never_hands_out_an_old_generation(
    server: EmbeddedRedis,
) -> None:
    settler = Settler.from_url(server.url, namespace="loss", shards=4)
    try:
        held = _hold_everything(settler)
        server.stop(kill=True)
        server.start()  # the same port, empty: the clients reconnect on their own
        # Late settlements straight after the restart: nothing to fence them with but the
        # empty keyspace, so they are unknown operations (never accepted).
        for old in held.values():
            late = settler.complete(old.reservation, {"late": True})
            assert late.kind is QuarantineKind.UNKNOWN_OPERATION
        _after_the_loss(settler, held)
    finally:
        settler.close()


def test_a_flushall_under_a_live_client_never_hands_out_an_old_generation(
    server: EmbeddedRedis,
) -> None:
    settler = Settler.from_url(server.url, namespace="loss", shards=4)
    try:
        held = _hold_everything(settler)
        with redis.Redis.from_url(server.url) as raw:
            raw.flushall()
        _after_the_loss(settler, held)
    finally:
        settler.close()


def test_a_lost_shard_counter_never_hands_out_an_old_generation(server: EmbeddedRedis) -> None:
    """The records stay, the counter goes (a DEL, or an eviction of that one key): the
    takeover after it must still fence the holder off."""
    settler = Settler.from_url(server.url, namespace="loss", shards=4)
    try:
        held = _hold_everything(settler)
        with redis.Redis.from_url(server.url) as raw:
            for shard in range(4):
                assert raw.delete(settler._core.keys.generation(shard)) == 1
        for op, old in held.items():
            settler.mark_provisional(old.reservation, reason="timeout")
            taken = settler.reserve(op, REQ, principal=WHO)
            assert isinstance(taken, Reserved)
            assert taken.reservation.generation > old.reservation.generation
            late = settler.complete(old.reservation, {"late": True})
            assert late.kind is QuarantineKind.STALE_GENERATION
            assert settler.complete(taken.reservation, {"ok": op}).verdict is Verdict.ACCEPTED
    finally:
        settler.close()


def test_a_client_with_another_shard_count_never_writes_after_a_flushall(
    server: EmbeddedRedis,
) -> None:
    """A 16-shard client is running; FLUSHALL; a 4-shard client starts and re-creates the
    namespace. From then on exactly one of them writes: the 16-shard client gets a
    ConfigurationError for every write, and no operation id is reserved by both."""
    sixteen = Settler.from_url(server.url, namespace="shared", shards=16)
    four = Settler.from_url(server.url, namespace="shared", shards=4)
    try:
        for op in OPS:
            assert isinstance(sixteen.reserve(op, REQ, principal=WHO), Reserved)
        with pytest.raises(ConfigurationError, match="16"):
            four.check()  # the guard at start-up, as before
        with redis.Redis.from_url(server.url) as raw:
            raw.flushall()
        four._checked = False  # a fresh 4-shard process starting after the loss
        four.check()  # the namespace metadata is gone: it is re-created with 4 shards
        for op in OPS:
            assert isinstance(four.reserve(f"new-{op}", REQ, principal=WHO), Reserved)
        for op in OPS:  # every shard of the 16-shard client, claimed by the 4 or not
            with pytest.raises(ConfigurationError, match="4 shards"):
                sixteen.reserve(op, REQ, principal=WHO)
            with pytest.raises(ConfigurationError):
                sixteen.reserve(f"new-{op}", REQ, principal=WHO)
        with redis.Redis.from_url(server.url) as raw:
            # Nothing of the 16-shard layout was written after the flush.
            tags = {shard_of(op, 16) for op in OPS} | {shard_of(f"new-{op}", 16) for op in OPS}
            for shard in tags - set(range(4)):
                assert raw.exists(sixteen._core.keys.generation(shard)) == 0
            used = {shard_of(f"new-{op}", 4) for op in OPS}
            for shard in used:
                assert raw.hget(four._core.keys.generation(shard), "shards") == b"4"
    finally:
        sixteen.close()
        four.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_client_with_fewer_shards_never_recreates_metadata_its_own_shards_lost(
    server: EmbeddedRedis, flavour: str
) -> None:
    """A 16-shard namespace loses its metadata and the states of shards 0-3 (as when the
    node holding them restarts without persistence while the others keep theirs). A 4-shard
    client starting then sees none of its own shards' states, but the states of shards 4-15
    survive: it must refuse to re-create the metadata, write nothing, and let the 16-shard
    client carry on, whose surviving records still answer."""
    sixteen = Settler.from_url(server.url, namespace="partial", shards=16)
    try:
        for op in OPS:
            assert isinstance(sixteen.reserve(op, REQ, principal=WHO), Reserved)
        keys = sixteen._core.keys
        with redis.Redis.from_url(server.url) as raw:
            assert raw.delete(keys.meta, *(keys.generation(s) for s in range(4))) == 5
            before = sorted(raw.keys("*"))

            if flavour == "sync":
                four = Settler.from_url(server.url, namespace="partial", shards=4)
                try:
                    with pytest.raises(ConfigurationError, match="beyond this client's 4"):
                        four.check()
                    with pytest.raises(ConfigurationError, match="beyond this client's 4"):
                        four.reserve("order-new", REQ, principal=WHO)  # no write either
                finally:
                    four.close()
            else:

                async def refused() -> None:
                    four = AsyncSettler.from_url(server.url, namespace="partial", shards=4)
                    try:
                        with pytest.raises(ConfigurationError, match="beyond this client's 4"):
                            await four.check()
                        with pytest.raises(ConfigurationError, match="beyond this client's 4"):
                            await four.reserve("order-new", REQ, principal=WHO)
                    finally:
                        await four.aclose()

                asyncio.run(refused())
            assert sorted(raw.keys("*")) == before  # nothing written, the metadata included

            # The 16-shard client carries on: a record on a surviving shard still holds its
            # reservation, and its first write on a shard whose state was lost re-creates
            # the metadata with its count.
            held = next(op for op in OPS if shard_of(op, 16) >= 4)
            assert not isinstance(sixteen.reserve(held, REQ, principal=WHO), Reserved)
            after = next(f"after-{i}" for i in range(100) if shard_of(f"after-{i}", 16) < 4)
            assert isinstance(sixteen.reserve(after, REQ, principal=WHO), Reserved)
            assert raw.hget(keys.meta, "shards") == b"16"
    finally:
        sixteen.close()


def test_a_user_whose_acl_refuses_exists_still_starts_a_new_namespace(
    server: EmbeddedRedis,
) -> None:
    """The check of the shard states beyond a client's count sends EXISTS; a user whose ACL
    refuses it (a scripting-only user, ``-@keyspace``) ran settle before the check existed.
    It still does: the check is skipped with a warning, never a refusal of every start."""
    url = app_user(server, "+@all", "-exists")
    with capture_logs() as logs, Settler.from_url(url, namespace="acl", shards=4) as settler:
        assert isinstance(settler.reserve("order-1", REQ, principal=WHO), Reserved)
    skipped = [e for e in logs if e["event"] == "settle.namespace.beyond_unchecked"]
    assert len(skipped) == 1
    assert skipped[0]["reason"] == "EXISTS refused by the ACL"
