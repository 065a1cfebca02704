"""Eviction on Redis Cluster: every primary's ``maxmemory-policy`` is read, so one evicting
primary among healthy ones is refused by name (issue 20, item 1)."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from settle import AsyncSettler, ConfigurationError, Reserved, Settler
from tests.cluster.cluster_support import LocalCluster

pytestmark = [pytest.mark.cluster]


def test_one_evicting_primary_is_refused_by_name(cluster: LocalCluster, namespace: str) -> None:
    with cluster.client(2) as c:
        c.config_set("maxmemory-policy", "volatile-ttl")
    try:
        s = Settler.from_cluster(cluster.url, namespace=namespace, shards=4)
        with pytest.raises(ConfigurationError) as info:
            s.check()
        s.close()
        assert "volatile-ttl" in str(info.value)
        assert f"127.0.0.1:{cluster.nodes[2].port}" in str(info.value)

        async def main() -> None:
            a = AsyncSettler.from_cluster(
                cluster.startup_nodes, namespace=namespace, shards=4, allow_eviction=True
            )
            try:
                with capture_logs() as logs:
                    r = await a.reserve("op-1", {"n": 1}, principal="p")
                assert isinstance(r, Reserved)
                warned = [e for e in logs if e["event"] == "settle.backend.eviction_allowed"]
                assert [e["policy"] for e in warned] == ["volatile-ttl"]
            finally:
                await a.aclose()

        asyncio.run(main())
    finally:
        with cluster.client(2) as c:
            c.config_set("maxmemory-policy", "noeviction")
