"""Fixtures of the cursor tests: a store on the session's real Redis, a real HTTP provider."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from settle.cursor import CursorStore, Event, EventContext
from tests.cursor.provider import Provider, ProviderServer
from tests.faults.servers import primary, replica  # noqa: F401 - fixtures of test_durability


class Sink:
    """The user's side effect: idempotent under ``ctx.key``; counts every handler call."""

    def __init__(self) -> None:
        self.effects: dict[str, str] = {}
        self.calls: Counter[str] = Counter()
        self.order: list[str] = []

    def __call__(self, event: Event, ctx: EventContext) -> None:
        self.calls[event.id] += 1
        if ctx.key not in self.effects:
            self.effects[ctx.key] = event.id
            self.order.append(event.id)

    async def handle(self, event: Event, ctx: EventContext) -> None:
        """The same, as an async consumer's handler."""
        self(event, ctx)

    def applied(self) -> list[str]:
        return list(self.order)


@pytest.fixture
def store(redis_url: str, namespace: str) -> Iterator[CursorStore]:
    s = CursorStore.from_url(redis_url, namespace=namespace)
    yield s
    s.close()


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=5.0) as client:
        yield client


@pytest.fixture
def serve() -> Iterator[Callable[..., ProviderServer]]:
    servers: list[ProviderServer] = []

    def start(**options: Any) -> ProviderServer:
        server = ProviderServer(Provider(**options)).__enter__()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.__exit__(None, None, None)


@pytest.fixture
def sink() -> Sink:
    return Sink()
