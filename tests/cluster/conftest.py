"""A real 3-primary Redis Cluster for the session; the contract fixtures point at it.

``redis_url`` is overridden with the URL of one cluster node, so every fixture and test in
this folder that connects with ``from_url`` goes through settle's cluster detection; ``api``
connects the sync shell that way and the async shell with ``from_cluster`` and seed nodes.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from settle import AsyncSettler, Settler
from tests.cluster.cluster_support import LocalCluster
from tests.faults.figures import FIGURES
from tests.integration.conftest import Awaitable


@pytest.fixture
def figures() -> dict[str, str]:
    return FIGURES


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    started = time.perf_counter()
    running = LocalCluster(primaries=3).start()
    FIGURES["3-primary cluster up (start, ADDSLOTS, MEET, cluster_state:ok)"] = (
        f"{time.perf_counter() - started:.1f} s"
    )
    try:
        yield running
    finally:
        running.close()


@pytest.fixture(scope="session")
def redis_url(cluster: LocalCluster) -> str:
    return cluster.url


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def settler_options() -> dict[str, Any]:
    """More ``SettleConfig`` options for ``api`` (a test parametrizes this name to set them),
    as in tests/integration."""
    return {}


@pytest_asyncio.fixture
async def api(
    flavour: str, cluster: LocalCluster, namespace: str, settler_options: dict[str, Any]
) -> AsyncIterator[Any]:
    opts = {"namespace": namespace, "shards": 4, **settler_options}
    if flavour == "sync":
        s = Settler.from_url(cluster.url, **opts)
        yield Awaitable(s)
        s.close()
    else:
        seeds = [f"{host}:{port}" for host, port in cluster.startup_nodes]
        a = AsyncSettler.from_cluster(seeds, **opts)
        yield a
        await a.aclose()
