"""A Sentinel-managed settler's kept connections follow a failover the pool has learned of.

redis-py's Sentinel pool asks the Sentinels for the primary when one of its connections
connects (or when ``get_master_address()`` is called), and when the answer changed it closes
its idle connections, so that they reconnect to the promoted node. settle's lane keeps its
own connections between calls, outside the pool: before, they went on writing to the old
primary, which a graceful failover (``SENTINEL FAILOVER``, a healed partition) leaves a
writable primary for seconds, and whatever was written there was lost when it was demoted."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from redis.cache import CacheConfig, CacheFactory
from redis.connection import CacheProxyConnection

from settle import AsyncSettler, Reserved, Settler
from settle._runtime._sync import _left_primary
from tests.faults.sentinel_support import (
    SERVICE,
    SentinelDeployment,
    sentinel_deployment,
    switch_gracefully,
)

pytestmark = [pytest.mark.faults]

REQ = {"amount": 1000}
WHO = "tenant:acme"


@pytest.fixture
def deployment() -> Iterator[SentinelDeployment]:
    with sentinel_deployment() as running:
        yield running


def _switch(deployment: SentinelDeployment) -> None:
    switch_gracefully(deployment, time.monotonic() + 30)


def _where(deployment: SentinelDeployment, operation: str) -> tuple[bool, bool, str]:
    """Whether ``operation``'s record is on the old primary, on the promoted node, and the
    old primary's role."""

    def on(port: int) -> bool:
        with redis.Redis(port=port) as raw:
            return any(operation.encode() in k for k in raw.scan_iter("settle:*"))

    with redis.Redis(port=deployment.primary.port, decode_responses=True) as raw:
        role = str(raw.info("replication")["role"])
    return on(deployment.primary.port), on(deployment.replica.port), role


def test_a_kept_connection_follows_a_failover_the_pool_learned_of(
    deployment: SentinelDeployment, namespace: str
) -> None:
    s = Settler.from_sentinel(deployment.sentinels, service_name=SERVICE, namespace=namespace)
    try:
        assert isinstance(s.reserve("op-1", REQ, principal=WHO), Reserved)  # a kept connection
        _switch(deployment)
        # What a connection the pool opens (another thread's) does: ask the Sentinels.
        s.client.connection_pool.get_master_address()
        assert isinstance(s.reserve("op-2", REQ, principal=WHO), Reserved)
        on_old, on_promoted, role = _where(deployment, "op-2")
    finally:
        s.close()
    assert role == "master", "the old primary was demoted before the call: nothing was shown"
    assert (on_promoted, on_old) == (True, False)


def test_an_async_kept_connection_follows_a_failover_the_pool_learned_of(
    deployment: SentinelDeployment, namespace: str
) -> None:
    async def main() -> tuple[bool, bool, str]:
        a = AsyncSettler.from_sentinel(
            deployment.sentinels, service_name=SERVICE, namespace=namespace
        )
        try:
            assert isinstance(await a.reserve("op-1", REQ, principal=WHO), Reserved)
            await asyncio.to_thread(_switch, deployment)
            await a.client.connection_pool.get_master_address()
            assert isinstance(await a.reserve("op-2", REQ, principal=WHO), Reserved)
            return await asyncio.to_thread(_where, deployment, "op-2")
        finally:
            await a.aclose()

    on_old, on_promoted, role = asyncio.run(main())
    assert role == "master", "the old primary was demoted before the call: nothing was shown"
    assert (on_promoted, on_old) == (True, False)


def test_a_client_side_caching_connection_is_judged_by_the_primary_it_reaches(
    deployment: SentinelDeployment, namespace: str
) -> None:
    """With redis-py's client-side caching (RESP3, ``cache_config``: Redis 7.4 or later, so
    the proxy is made here as the pool makes it, its connection connected as the proxy's
    own connect does, which refuses Valkey) the pool hands out a proxy whose ``host`` and
    ``port`` are those it was made with, before it connected: redis-py's defaults, not the
    primary the Sentinels named. Judged by them, every kept connection was taken for one to
    an old primary, closed and replaced on every call (a new connection and a question to
    the Sentinels each); judged by the connection inside, it is replaced after a failover
    only."""
    s = Settler.from_sentinel(deployment.sentinels, service_name=SERVICE, namespace=namespace)
    pool = s.client.connection_pool
    proxy = CacheProxyConnection(
        pool.make_connection(), CacheFactory(CacheConfig()).get_cache(), threading.RLock()
    )
    try:
        proxy._conn.connect()
        pool.get_master_address()
        assert not _left_primary(pool, proxy)
        _switch(deployment)
        pool.get_master_address()
        assert _left_primary(pool, proxy)
    finally:
        proxy.disconnect()
        s.close()
