"""Fixtures of the middleware tests: a side-effect ledger and clients for real apps."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from settle import AsyncSettler
from tests.http.apps import Ledger, MakeClient, starlette_app


@pytest.fixture
def ledger() -> Ledger:
    return Ledger()


@pytest_asyncio.fixture
async def make_client(async_settler: AsyncSettler, ledger: Ledger) -> AsyncIterator[MakeClient]:
    """``make_client(**middleware_options)``: an httpx client on the Starlette test app."""
    clients: list[httpx.AsyncClient] = []

    def make(*, raise_app_exceptions: bool = True, **options: Any) -> httpx.AsyncClient:
        app = starlette_app(async_settler, ledger, **options)
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
        client = httpx.AsyncClient(transport=transport, base_url="http://testserver")
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()
