"""Fixtures for fault tests: a proxy that cuts connections, shells that see only settle's own
retries, and ``figures``: measurements printed at the end of the run (docs/operations.md
quotes them)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
import redis

from settle import AsyncSettler, Settler
from settle._core.scripts import SCRIPT_NAMES, source
from tests.faults.figures import FIGURES
from tests.faults.servers import async_client, cut_timeout, sync_client
from tests.faults.tcp_proxy import FaultyProxy
from tests.integration.conftest import Awaitable


@pytest.fixture
def figures() -> dict[str, str]:
    return FIGURES


@pytest.fixture
def proxy(redis_url: str) -> Iterator[FaultyProxy]:
    """A proxy to the session's server, whose script cache holds every script (the steady
    state: a cut then strikes the script itself, not a NOSCRIPT reply)."""
    with redis.Redis.from_url(redis_url) as raw:
        port = raw.connection_pool.connection_kwargs["port"]
        for name in SCRIPT_NAMES:
            raw.script_load(source(name))
    running = FaultyProxy(int(port)).start()
    yield running
    running.close()


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest_asyncio.fixture
async def api(
    flavour: str, proxy: FaultyProxy, namespace: str, request: pytest.FixtureRequest
) -> AsyncIterator[Any]:
    """A shell connected through the proxy with redis-py's own retries off, so every repeat
    of a call is settle's (tenacity). Its socket timeout is short only in a test whose
    ``at`` parameter is a stall, which that timeout ends: elsewhere a call a loaded worker
    held past 0.5 s would time out and be repeated, beside the cut one."""
    callspec = getattr(request.node, "callspec", None)
    timeout = cut_timeout(str(callspec.params.get("at", "")) if callspec else "")
    if flavour == "sync":
        s = Settler(sync_client(proxy.port, timeout), namespace=namespace, shards=4)
        yield Awaitable(s)
        s.close()
    else:
        a = AsyncSettler(async_client(proxy.port, timeout), namespace=namespace, shards=4)
        yield a
        await a.aclose()
