"""Two different functions under one identity never answer each other's calls (issue 16):
a lambda without ``name=`` and a second definition under a decorated function's
``module.qualname`` are refused when decorated, an explicit ``name=`` shares on purpose, and
the same code decorated again is allowed. A key field written as a memory address (a new
operation at every retry) is refused before anything is written; an ``async def on_replay``
(never awaited) is refused when decorated. On Redis and the in-memory model, sync and async.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable

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


# -- a key field written as a memory address -------------------------------------------------


class Order:
    """No __str__ or __format__ of its own: its text is its address."""

    def __init__(self, oid: int) -> None:
        self.oid = oid


def _address() -> int:
    return 0


class Named(Order):
    def __str__(self) -> str:
        return f"order-{self.oid}"


def _charge(settler: Settler, ran: list[int]) -> Callable[[Order], int]:
    @settler.operation(key="charge:{order}", principal=P, fingerprint=lambda order: order.oid)
    def charge(order: Order) -> int:
        ran.append(order.oid)
        return order.oid

    return charge


def test_a_key_field_written_as_an_address_is_refused_before_anything_runs(
    any_settler: Settler,
) -> None:
    ran: list[int] = []
    charge = _charge(any_settler, ran)

    @any_settler.operation(key="charge:{order!r}", principal=P, fingerprint=lambda order: 0)
    def charge_repr(order: Order) -> int:
        ran.append(order.oid)
        return order.oid

    @any_settler.operation(key="hook:{hook}", principal=P, fingerprint=lambda hook: 0)
    def call(hook: Callable[[], int]) -> int:
        ran.append(0)
        return 0

    calls: list[Callable[[], int]] = [
        lambda: charge(Order(1)),
        lambda: charge_repr(Order(1)),
        lambda: call(_address),
    ]
    for bad in calls:
        with pytest.raises(InvalidInput, match=r"__str__ or __format__"):
            bad()
    with pytest.raises(InvalidInput, match=r"\{order\}"):
        charge(Order(1))
    with pytest.raises(InvalidInput, match=r"\{hook\}"):
        call(lambda: 0)
    assert ran == []


def test_a_key_field_with_its_own_text_or_an_attribute_keeps_working(
    any_settler: Settler,
) -> None:
    ran: list[int] = []
    charge = _charge(any_settler, ran)

    @any_settler.operation(key="c:{order.oid}", principal=P, fingerprint=lambda order: order.oid)
    def by_id(order: Order) -> int:
        ran.append(order.oid)
        return order.oid

    @any_settler.operation(key="s:{text}", principal=P)
    def text(text: str) -> str:
        return text

    assert charge(Named(1)) == 1
    assert charge(Named(1)) == 1  # a retry with an equal order built again: replayed
    assert by_id(Order(2)) == 2
    assert by_id(Order(2)) == 2
    assert ran == [1, 2]
    odd = "<x at 0x1f>"  # a str is the caller's own text
    assert text(odd) == odd


@pytest.mark.asyncio
async def test_async_a_key_field_written_as_an_address_is_refused(
    async_any: AsyncSettler,
) -> None:
    ran: list[int] = []

    @async_any.operation(key="charge:{order}", principal=P, fingerprint=lambda order: order.oid)
    async def charge(order: Order) -> int:
        ran.append(order.oid)
        return order.oid

    with pytest.raises(InvalidInput, match=r"\{order\}.*__str__ or __format__"):
        await charge(Order(1))
    assert ran == []
    assert await charge(Named(3)) == 3
    assert await charge(Named(3)) == 3
    assert ran == [3]


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
