"""``api``: the same contract test runs on the sync shell, the async shell and the model.

Every test in this folder is an ``async def`` that awaits each call. For the sync
``Settler`` each method is wrapped in a coroutine that calls it directly (so the sync code
path really runs); the async shell is awaited for real; the reference model runs too, which
shows the model obeys the same SPEC tables as the scripts.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from settle import AsyncSettler, Settler
from settle.testing import MemorySettler


class Awaitable:
    """Present a sync object's methods as coroutines (and pass attributes through)."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if inspect.ismethod(attr) or inspect.isfunction(attr):

            async def call(*args: Any, **kwargs: Any) -> Any:
                return attr(*args, **kwargs)

            return call
        if hasattr(attr, "__dict__") and not isinstance(attr, type):
            return Awaitable(attr)
        return attr


@pytest.fixture(params=["sync", "async", "model"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def settler_options() -> dict[str, Any]:
    """More ``SettleConfig`` options for ``api`` (a test parametrizes this name to set them)."""
    return {}


@pytest_asyncio.fixture
async def api(
    flavour: str, redis_url: str, namespace: str, settler_options: dict[str, Any]
) -> AsyncIterator[Any]:
    opts = {"namespace": namespace, "shards": 4, **settler_options}
    if flavour == "sync":
        s = Settler.from_url(redis_url, **opts)
        yield Awaitable(s)
        s.close()
    elif flavour == "async":
        a = AsyncSettler(aioredis.Redis.from_url(redis_url), **opts)
        yield a
        await a.aclose()
    else:
        yield Awaitable(MemorySettler(**opts))


@pytest.fixture
def on_redis(flavour: str) -> bool:
    return flavour != "model"


@pytest.fixture
def one_shard(redis_url: str, namespace: str) -> Iterator[Settler]:
    """A settler of one shard, already claimed (``check()``): the scripts' tests call that
    shard's scripts by hand."""
    s = Settler.from_url(redis_url, namespace=namespace, shards=1)
    s.check()  # claims the shard
    yield s
    s.close()
