"""Two different functions under one identity never answer each other's calls (issue 16):
a lambda without ``name=`` and a second definition under a decorated function's
``module.qualname`` are refused when decorated, an explicit ``name=`` shares on purpose, and
the same code decorated again is allowed. A key field written as a memory address (a new
operation at every retry) is refused before anything is written; an ``async def on_replay``
(never awaited) is refused when decorated. On Redis and the in-memory model, sync and async.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from settle import AsyncSettler, Settler
from settle.errors import InvalidInput
from settle.models import OperationRecord
from settle.testing import AsyncMemorySettler

P = "tenant:acme"


@pytest_asyncio.fixture(params=["redis", "memory"])
async def async_any(
    request: pytest.FixtureRequest, redis_url: str, namespace: str
) -> AsyncIterator[AsyncSettler]:
    if request.param == "redis":
        s = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
    else:
        s = AsyncMemorySettler(namespace=f"memory-{uuid.uuid4().hex[:8]}")
    yield s
    await s.aclose()


# -- on_replay must be a plain callable ----------------------------------------------------


async def _async_hook(record: OperationRecord) -> None:
    raise AssertionError("never awaited")


class _AsyncCallable:
    async def __call__(self, record: OperationRecord) -> None:
        raise AssertionError("never awaited")


def test_an_async_on_replay_is_refused_when_decorated(any_settler: Settler) -> None:
    for hook in (_async_hook, _AsyncCallable()):
        with pytest.raises(InvalidInput, match="on_replay must be a plain callable"):
            any_settler.operation(key="k:{n}", principal=P, on_replay=hook)


@pytest.mark.asyncio
async def test_async_an_async_on_replay_is_refused_when_decorated(
    async_any: AsyncSettler,
) -> None:
    seen: list[int] = []
    with pytest.raises(InvalidInput, match="on_replay must be a plain callable"):
        async_any.operation(key="k:{n}", principal=P, on_replay=_async_hook)

    @async_any.operation(key="k:{n}", principal=P, on_replay=lambda r: seen.append(r.generation))
    async def job(n: int) -> int:
        return n

    assert await job(1) == 1
    assert await job(1) == 1
    assert len(seen) == 1
