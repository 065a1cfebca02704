"""Two real redis-servers for the progress tests: one holds the stream, one the progress
(so "progress recorded" and "acknowledged" are writes to different servers, and their order
is really tested)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from settle.embedded import EmbeddedRedis
from tests.faults.servers import primary, replica  # noqa: F401 - fixtures of test_durability
from tests.progress.harness import Names


@pytest.fixture(scope="session")
def stream_server() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis().start()
    yield server
    server.close()


@pytest.fixture(scope="session")
def progress_server() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis().start()
    yield server
    server.close()


@pytest.fixture
def names() -> Names:
    tag = uuid.uuid4().hex[:10]
    return Names(stream=f"orders-{tag}", group="billing", consumer=f"billing-{tag}", namespace="t")


@pytest.fixture
def stream_client(stream_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(stream_server.url)
    yield client
    client.close()


@pytest.fixture
def progress_client(progress_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(progress_server.url)
    yield client
    client.close()
