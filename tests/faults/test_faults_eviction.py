"""Eviction (issue 20, item 1): a server whose ``maxmemory-policy`` may evict settle's keys is
refused before the first write, by every part (the core sync and async, the cursor and
progress stores), unless ``allow_eviction=True`` accepts the risk with one warning. Each test
starts a real redis-server with the policy; one measures what the refusal prevents."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

from settle import AsyncSettler, ConfigurationError, Reserved, Settler
from settle.cursor import AsyncCursorStore, CursorStore
from settle.embedded import EmbeddedRedis
from settle.progress import (
    AsyncProgressStore,
    DeliveryId,
    EmissionId,
    ProgressStore,
    ProviderScope,
)
from tests.acl import app_user
from tests.faults.servers import acks

pytestmark = [pytest.mark.faults]

EVICTING = [
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
]


SCOPE = ProviderScope("orders", "billing", "i1")


async def _nothing(ctx: object) -> None:
    return None


def _server(policy: str, *extra: str) -> EmbeddedRedis:
    return EmbeddedRedis(extra_args=["--maxmemory-policy", policy, *extra]).start()


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, EmbeddedRedis]]:
    running = {policy: _server(policy) for policy in [*EVICTING, "noeviction"]}
    yield running
    for server in running.values():
        server.close()


def _first_call_sync(part: str, url: str, **options: Any) -> None:
    if part == "settler":
        s = Settler.from_url(url, namespace="evict", shards=2, **options)
        try:
            r = s.reserve(uuid.uuid4().hex, {"n": 1}, principal="p")
            assert isinstance(r, Reserved)
        finally:
            s.close()
    elif part == "cursor":
        with CursorStore.from_url(url, namespace="evict", **options) as c:
            c.start("stream", b"c0")
    else:
        with ProgressStore.from_url(url, consumer="billing", namespace="evict", **options) as p:
            p.apply(SCOPE, DeliveryId("1-1"), EmissionId("e1"), lambda ctx: None)


async def _first_call_async(part: str, url: str, **options: Any) -> None:
    # No ``async with`` for the settler: the refusal must come from the first call itself
    # (a with block runs the check on entry: tested at the end of this file).
    if part == "settler":
        s = AsyncSettler.from_url(url, namespace="evict", shards=2, **options)
        try:
            r = await s.reserve(uuid.uuid4().hex, {"n": 1}, principal="p")
            assert isinstance(r, Reserved)
        finally:
            await s.aclose()
    elif part == "cursor":
        async with AsyncCursorStore.from_url(url, namespace="evict", **options) as c:
            await c.start("stream", b"c0")
    else:
        store = AsyncProgressStore.from_url(url, consumer="billing", namespace="evict", **options)
        async with store as p:
            await p.apply(SCOPE, DeliveryId("1-1"), EmissionId("e1"), _nothing)


def _first_call(flavour: str, part: str, url: str, **options: Any) -> None:
    if flavour == "sync":
        _first_call_sync(part, url, **options)
    else:
        asyncio.run(_first_call_async(part, url, **options))


def _keys(server: EmbeddedRedis) -> int:
    with redis.Redis.from_url(server.url) as raw:
        return int(raw.dbsize())


@pytest.mark.parametrize("part", ["settler", "cursor", "progress"])
@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("policy", EVICTING)
def test_an_evicting_policy_is_refused_before_the_first_write(
    servers: dict[str, EmbeddedRedis], policy: str, flavour: str, part: str
) -> None:
    server = servers[policy]
    with pytest.raises(ConfigurationError) as info:
        _first_call(flavour, part, server.url)
    message = str(info.value)
    assert policy in message
    assert "noeviction" in message
    assert "allow_eviction=True" in message
    assert _keys(server) == 0  # nothing was written


@pytest.mark.parametrize("part", ["settler", "cursor", "progress"])
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_allow_eviction_accepts_the_risk_with_one_warning(
    servers: dict[str, EmbeddedRedis], flavour: str, part: str
) -> None:
    server = servers["volatile-lru"]
    with capture_logs() as logs:
        _first_call(flavour, part, server.url, allow_eviction=True)
    warned = [e for e in logs if e["event"] == "settle.backend.eviction_allowed"]
    assert len(warned) == 1
    assert warned[0]["policy"] == "volatile-lru"
    assert warned[0]["log_level"] == "warning"
    assert _keys(server) > 0
    with redis.Redis.from_url(server.url) as raw:
        raw.flushall()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_noeviction_passes_without_a_warning(
    servers: dict[str, EmbeddedRedis], flavour: str
) -> None:
    with capture_logs() as logs:
        _first_call(flavour, "settler", servers["noeviction"].url)
    assert not [e for e in logs if e["event"].startswith("settle.backend.eviction")]


def test_a_policy_that_cannot_be_read_warns_and_does_not_refuse(
    servers: dict[str, EmbeddedRedis],
) -> None:
    # A managed Redis may deny INFO memory to the application's user: settle cannot tell
    # the policy, so it says so and goes on (refusing would lock out every such deployment).
    server = servers["allkeys-lru"]
    url = app_user(server, "+@all", "-info", "+info|server")
    try:
        with capture_logs() as logs:
            _first_call("sync", "settler", url)
        unknown = [e for e in logs if e["event"] == "settle.backend.eviction_unknown"]
        assert len(unknown) == 1
        assert unknown[0]["log_level"] == "warning"
    finally:
        with redis.Redis.from_url(server.url) as raw:
            raw.acl_deluser("app")
            raw.flushall()


@pytest.mark.parametrize("part", ["settler", "cursor", "progress"])
@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("rules", [("-info",), ("-@dangerous",)], ids=["-info", "-@dangerous"])
def test_a_user_denied_every_info_is_warned_about_not_refused(
    servers: dict[str, EmbeddedRedis], flavour: str, part: str, rules: tuple[str, ...]
) -> None:
    # INFO is in @dangerous: a user of "+@all -@dangerous", or one denied INFO, was refused
    # by every part (ConfigurationError: "Redis refused settle's credentials"). The policy
    # cannot be read: settle says so, as when INFO memory alone is denied, and goes on.
    server = servers["allkeys-lru"]
    url = app_user(server, "+@all", *rules)
    try:
        with capture_logs() as logs:
            _first_call(flavour, part, url)
        unknown = [e for e in logs if e["event"] == "settle.backend.eviction_unknown"]
        assert len(unknown) == 1
        assert unknown[0]["log_level"] == "warning"
        assert unknown[0]["nodes"] == "server"
    finally:
        with redis.Redis.from_url(server.url) as raw:
            raw.acl_deluser("app")
            raw.flushall()


def test_what_the_refusal_prevents_completed_records_are_evicted(
    figures: dict[str, str],
) -> None:
    # With the risk accepted and memory short, completed records disappear: a retry of an
    # evicted operation reserves again, and the operation runs twice.
    for policy in ("allkeys-lru", "volatile-lru"):
        server = _server(policy, "--maxmemory", "2mb")
        try:
            with Settler.from_url(
                server.url, namespace="evict", shards=2, allow_eviction=True
            ) as s:
                for i in range(300):
                    r = s.reserve(f"op-{i}", {"n": i}, principal="p")
                    assert isinstance(r, Reserved)
                    s.complete(r.reservation, {"blob": "x" * 8000})
                again = sum(
                    isinstance(s.reserve(f"op-{i}", {"n": i}, principal="p"), Reserved)
                    for i in range(300)
                )
            figures[f"completed records evicted under {policy} (2 MB, 300 x 8 KB)"] = (
                f"{again} of 300 reserved again"
            )
            assert again > 0
        finally:
            server.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_refusal_in_a_with_block_closes_the_client(
    servers: dict[str, EmbeddedRedis], flavour: str
) -> None:
    # The check runs in __enter__ / __aenter__; a refusal there must not leave the client's
    # connections open (an unclosed asyncio connection fails this suite as a warning).
    url = servers["allkeys-lru"].url
    if flavour == "sync":
        with pytest.raises(ConfigurationError), Settler.from_url(url, namespace="evict"):
            pass  # pragma: no cover - refused before the body

    async def main() -> None:
        with pytest.raises(ConfigurationError):
            async with AsyncSettler.from_url(url, namespace="evict"):
                pass  # pragma: no cover - refused before the body

    if flavour == "async":
        asyncio.run(main())


# -- replicas: a failover makes a replica the primary, with the policy it has ---------------


@pytest.fixture
def replicated() -> Iterator[tuple[EmbeddedRedis, EmbeddedRedis]]:
    """A noeviction primary and its replica, the replica set to evict (replicas ignore
    maxmemory while they replicate; promoted, they evict with their own policy)."""
    primary = _server("noeviction")
    replica = _server("allkeys-lru", "--replicaof", "127.0.0.1", str(primary.port))
    try:
        with redis.Redis.from_url(primary.url) as raw:  # synced: WAIT is acknowledged
            for _ in range(100):
                if acks(raw, timeout_ms=100) == 1:
                    break
            assert acks(raw, timeout_ms=100) == 1
        yield primary, replica
    finally:
        replica.close()
        primary.close()


@pytest.mark.parametrize("part", ["settler", "cursor", "progress"])
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_an_evicting_replica_is_refused_by_name_before_the_first_write(
    replicated: tuple[EmbeddedRedis, EmbeddedRedis], flavour: str, part: str
) -> None:
    primary, replica = replicated
    with pytest.raises(ConfigurationError) as info:
        _first_call(flavour, part, primary.url)
    assert f"allkeys-lru on 127.0.0.1:{replica.port}" in str(info.value)
    assert _keys(primary) == 0  # nothing was written

    # allow_eviction accepts it with one warning; a replica set right passes silently.
    with capture_logs() as logs:
        _first_call(flavour, part, primary.url, allow_eviction=True)
    allowed = [e for e in logs if e["event"] == "settle.backend.eviction_allowed"]
    assert [e["policy"] for e in allowed] == ["allkeys-lru"]
    with redis.Redis.from_url(replica.url) as raw:
        raw.config_set("maxmemory-policy", "noeviction")
    with capture_logs() as logs:
        _first_call(flavour, part, primary.url)
    assert not [e for e in logs if e["event"].startswith("settle.backend.eviction")]
