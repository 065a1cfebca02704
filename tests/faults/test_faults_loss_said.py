"""settle says when it finds that Redis lost a shard's state (SPEC §1: "after settle knows it
could have been lost: settle refuses or says so").

Every settler claims each shard of its namespace before its first write, so a write that
finds its shard's state gone is evidence that Redis lost data: a restart without
persistence, a FLUSHALL, a failover that dropped writes, a DEL. settle claims the shard again
and goes on (the generations stay above every earlier one), and a retry of an operation
whose completed record went with it runs again: nothing in Redis can prevent that, but the
operator must hear of it. It used to be silent: the retry was logged as an ordinary new
reservation (``settle.reserve.reserved``), nothing else."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

from settle import AsyncSettler, QuarantineKind, Replay, Reserved, Settler, Verdict
from settle._core.keys import Keys, shard_of
from settle._log import operation_digest
from settle.embedded import EmbeddedRedis

pytestmark = [pytest.mark.faults]

REQ = {"amount": 1000, "currency": "EUR"}
WHO = "tenant:acme"


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as s:  # persistence off: a restart comes back empty
        yield s


def _lost(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "settle.namespace.state_lost"]


def test_a_restart_without_persistence_is_said_when_a_paid_operation_runs_again(
    server: EmbeddedRedis,
) -> None:
    op = "charge-7"
    with Settler.from_url(server.url, namespace="paid", shards=4) as settler:
        held = settler.reserve(op, REQ, principal=WHO)
        assert isinstance(held, Reserved)
        settler.complete(held.reservation, {"charge": "ch_1"})
        server.stop(kill=True)
        server.start()  # the same port, empty
        with capture_logs() as logs:
            again = settler.reserve(op, REQ, principal=WHO)
            settler.get(op)  # a read after the loss was said: nothing more
    # The completed record is gone: the retry reserves again (the charge would run again)...
    assert isinstance(again, Reserved)
    assert again.takeover is None
    # ... and settle says so, once, at error level, naming the shard's state.
    [said] = _lost(logs)
    assert said["log_level"] == "error"
    assert said["namespace"] == "paid"
    assert said["state_key"] == Keys("paid", 4).generation(shard_of(op, 4))
    assert said["script"] == "reserve"
    assert said["operation_digest"] == operation_digest(op)
    assert op not in str(said)  # the operation id only as its keyed digest


def test_a_lost_counter_alone_is_said_and_its_records_still_replay(server: EmbeddedRedis) -> None:
    op = "charge-8"
    keys = Keys("paid", 4)
    with Settler.from_url(server.url, namespace="paid", shards=4) as settler:
        held = settler.reserve(op, REQ, principal=WHO)
        assert isinstance(held, Reserved)
        settler.complete(held.reservation, {"charge": "ch_2"})
        with redis.Redis(port=server.port) as raw:
            assert raw.delete(keys.generation(shard_of(op, 4))) == 1  # a DEL, an eviction
        with capture_logs() as logs:
            replay = settler.reserve(op, REQ, principal=WHO)
    assert isinstance(replay, Replay)  # the record survived: nothing runs again
    [said] = _lost(logs)
    assert said["state_key"] == keys.generation(shard_of(op, 4))


def test_an_async_settler_says_a_flushall_once(server: EmbeddedRedis) -> None:
    async def main() -> list[dict[str, Any]]:
        async with AsyncSettler.from_url(server.url, namespace="paid", shards=2) as a:
            ops = [f"op-{n}" for n in range(6)]
            for op in ops:
                first = await a.reserve(op, REQ, principal=WHO)
                assert isinstance(first, Reserved)
            with redis.Redis(port=server.port) as raw:
                raw.flushall()
            with capture_logs() as logs:
                for op in ops:  # one after the other: the first finds the loss
                    assert isinstance(await a.reserve(op, REQ, principal=WHO), Reserved)
            return logs

    logs = asyncio.run(main())
    # The first write finds the loss; the re-check that follows claims every shard again,
    # so the later writes find their states and say nothing more.
    assert len(_lost(logs)) == 1


def test_a_new_namespace_says_nothing(server: EmbeddedRedis) -> None:
    with capture_logs() as logs, Settler.from_url(server.url, namespace="new", shards=4) as s:
        for n in range(8):
            assert isinstance(s.reserve(f"op-{n}", REQ, principal=WHO), Reserved)
    assert _lost(logs) == []


def test_a_restore_of_an_older_dump_goes_back_in_time_but_never_hands_out_an_old_generation(
    server: EmbeddedRedis,
) -> None:
    # A restore of an older RDB dump (here: SAVE, more writes, kill -9, a restart that loads
    # the dump): records and generation states go back to the dump together. The states
    # exist, so settle sees no loss and says nothing (docs/operations.md, "When Redis
    # forgets"); what it promises still holds: a completion in the dump replays, a
    # reservation issued after the dump is fenced off, new generations are above all.
    with Settler.from_url(server.url, namespace="dump", shards=2) as settler:
        kept = settler.reserve("kept", REQ, principal=WHO)
        assert isinstance(kept, Reserved)
        settler.complete(kept.reservation, {"charge": "ch_kept"})
        first = settler.reserve("taken", REQ, principal=WHO)
        assert isinstance(first, Reserved)
        settler.mark_provisional(first.reservation, reason="timeout")
        with redis.Redis(port=server.port) as raw:
            raw.save()  # the dump
        later = settler.reserve("taken", REQ, principal=WHO)  # a takeover after the dump
        assert isinstance(later, Reserved)
        issued = later.reservation.generation
        server.stop(kill=True)
        server.start()  # loads the dump
        with capture_logs() as logs:
            replay = settler.reserve("kept", REQ, principal=WHO)
            late = settler.complete(later.reservation, {"charge": "ch_late"})
            again = settler.reserve("taken", REQ, principal=WHO)
    assert isinstance(replay, Replay)
    assert replay.value() == {"charge": "ch_kept"}
    # The record is back at the first reservation's generation: the later holder's
    # settlement names another one, and is quarantined, never merged.
    assert late.verdict is Verdict.QUARANTINED
    assert late.kind is QuarantineKind.STALE_GENERATION
    assert isinstance(again, Reserved)
    assert again.reservation.generation > issued  # the fencing token never goes back
    assert _lost(logs) == []


def test_a_loss_found_by_every_call_in_flight_is_said_once(server: EmbeddedRedis) -> None:
    # A busy process finds a loss with every call it had in flight: each used to log its
    # own error (sixteen threads, sixteen alerts for one FLUSHALL). The first says it;
    # the calls sent before the shards were claimed again found the same loss.
    with Settler.from_url(server.url, namespace="paid", shards=4) as settler:
        for n in range(16):
            assert isinstance(settler.reserve(f"op-{n}", REQ, principal=WHO), Reserved)
        with redis.Redis(port=server.port) as raw:
            raw.flushall()
        start = threading.Barrier(16)

        def retry(n: int) -> None:
            start.wait()
            assert isinstance(settler.reserve(f"op-{n}", REQ, principal=WHO), Reserved)

        with capture_logs() as logs, ThreadPoolExecutor(16) as pool:
            list(pool.map(retry, range(16)))
        assert len(_lost(logs)) == 1
        # A later loss is another: said again.
        with redis.Redis(port=server.port) as raw:
            raw.flushall()
        with capture_logs() as later:
            assert isinstance(settler.reserve("op-0", REQ, principal=WHO), Reserved)
        assert len(_lost(later)) == 1


def test_an_async_settler_says_a_loss_its_concurrent_calls_found_once(
    server: EmbeddedRedis,
) -> None:
    async def main() -> list[dict[str, Any]]:
        async with AsyncSettler.from_url(server.url, namespace="paid", shards=4) as a:
            ops = [f"op-{n}" for n in range(16)]
            await asyncio.gather(*(a.reserve(op, REQ, principal=WHO) for op in ops))
            with redis.Redis(port=server.port) as raw:
                raw.flushall()
            with capture_logs() as logs:
                again = await asyncio.gather(*(a.reserve(op, REQ, principal=WHO) for op in ops))
            assert all(isinstance(r, Reserved) for r in again)
            return logs

    assert len(_lost(asyncio.run(main()))) == 1


def test_a_completion_made_after_the_restored_dump_is_gone_and_its_retry_runs_again(
    server: EmbeddedRedis,
) -> None:
    """docs/operations.md ("When Redis forgets") says of a restore of an older dump: a
    completion made after it is gone, and its retry runs again. The test above held every
    other claim of that row, not this one."""
    with Settler.from_url(server.url, namespace="dump", shards=2) as settler:
        before = settler.reserve("before", REQ, principal=WHO)
        assert isinstance(before, Reserved)
        with redis.Redis(port=server.port) as raw:
            raw.save()  # the dump: "after" not reserved yet
        after = settler.reserve("after", REQ, principal=WHO)
        assert isinstance(after, Reserved)
        settler.complete(after.reservation, {"charge": "ch_after"})
        server.stop(kill=True)
        server.start()  # loads the dump
        with capture_logs() as logs:
            assert settler.get("after") is None  # the completion is gone
            again = settler.reserve("after", REQ, principal=WHO)
    assert isinstance(again, Reserved)  # its retry runs again (the charge would repeat)
    assert again.reservation.generation > after.reservation.generation
    assert _lost(logs) == []  # the states exist: settle sees no loss, says nothing
