"""Fixtures of the console tests: a settler writing evidence (sync, as a service would) and
the console app reading it through an AsyncSettler, both on the session's redis-server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import pytest_asyncio

from settle import AsyncSettler, Settler
from settle.web import create_app, token_authorizer

TOKEN = "s3cret-console-token"


@pytest.fixture
def writer(redis_url: str, namespace: str) -> Iterator[Settler]:
    s = Settler.from_url(redis_url, namespace=namespace, shards=4, quarantine_payload_bytes=256)
    s.check()
    yield s
    s.close()


@pytest_asyncio.fixture
async def reader(redis_url: str, namespace: str, writer: Settler) -> AsyncIterator[AsyncSettler]:
    del writer  # the namespace exists before the console opens it
    s = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
    yield s
    await s.aclose()


def client_for(app: object) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url="http://localhost")


@pytest_asyncio.fixture
async def read_only(reader: AsyncSettler) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(create_app(reader)) as client:
        yield client


@pytest_asyncio.fixture
async def guarded(reader: AsyncSettler) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(reader, authorize=token_authorizer(TOKEN, "alice@finance"))
    async with client_for(app) as client:
        yield client
