"""The speed cases: each builds one operation (a no-argument callable, or coroutine function
for async) from clients it opens itself. Every operation does one logical idempotent call:
a fresh operation id per call for first calls, the same completed one for replays."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio

from settle import AsyncSettler, Replay, Reserved, Settler

__all__ = ["PRINCIPAL", "REQUEST", "RESULT", "Case", "Clients", "build_cases"]

PRINCIPAL = "tenant:acme"
#: The request both libraries see (the peer hashes the same fields for its validation).
REQUEST: dict[str, Any] = {
    "order_id": "order-0",
    "customer_id": "cus_42",
    "amount": 1250,
    "currency": "EUR",
}
RESULT: dict[str, Any] = {
    "charge_id": "ch_3PqXb2",
    "order_id": "order-0",
    "amount": 1250,
    "currency": "EUR",
    "status": "succeeded",
}
LEASE_MS = 30_000
RETENTION_MS = 86_400_000

SyncOp = Callable[[], object]
AsyncOp = Callable[[], Awaitable[object]]


@dataclass
class Case:
    """One row of the speed table."""

    key: str
    label: str
    mode: str  # "sync" | "async"
    op: SyncOp | AsyncOp
    ops: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    round_rates: list[float] = field(default_factory=list)
    latencies_ns: list[int] = field(default_factory=list)
    stats: dict[str, dict[str, float]] = field(default_factory=dict)
    client_commands: dict[str, float] = field(default_factory=dict)
    script_commands: dict[str, float] = field(default_factory=dict)


@dataclass
class Clients:
    """Everything the cases connect with; one sync connection each, one async pool each."""

    url: str
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    raw: redis.Redis = field(init=False)
    araw: redis.asyncio.Redis = field(init=False)
    settler: Settler = field(init=False)
    asettler: AsyncSettler = field(init=False)

    def __post_init__(self) -> None:
        self.raw = redis.Redis.from_url(self.url)
        self.araw = redis.asyncio.Redis.from_url(self.url)
        self.settler = Settler.from_url(self.url, namespace=f"bench-{self.run}")
        self.asettler = AsyncSettler.from_url(self.url, namespace=f"bench-{self.run}")

    async def open(self) -> None:
        self.settler.check()
        await self.asettler.check()

    async def aclose(self) -> None:
        self.raw.close()
        await self.araw.aclose()
        self.settler.close()
        await self.asettler.aclose()


def _ids(prefix: str) -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"{prefix}-{next(counter)}"


def raw_cases(c: Clients) -> list[Case]:
    """(a) The floor: SET NX to reserve and SET to complete (2 round trips); a GET loop."""
    result = json.dumps(RESULT).encode()
    sync_id, async_id = _ids(f"raw:{c.run}:s"), _ids(f"raw:{c.run}:a")
    done = f"raw:{c.run}:done"
    c.raw.set(done, result)

    def floor() -> None:
        key = sync_id()
        if not c.raw.set(key, b"pending", nx=True, px=LEASE_MS):
            raise AssertionError(f"{key} was already reserved")
        c.raw.set(key, result, px=RETENTION_MS)

    async def afloor() -> None:
        key = async_id()
        if not await c.araw.set(key, b"pending", nx=True, px=LEASE_MS):
            raise AssertionError(f"{key} was already reserved")
        await c.araw.set(key, result, px=RETENTION_MS)

    def get() -> None:
        if c.raw.get(done) is None:
            raise AssertionError("the GET loop read nothing")

    async def aget() -> None:
        if await c.araw.get(done) is None:
            raise AssertionError("the GET loop read nothing")

    return [
        Case("a.floor", "raw floor: SET NX + SET", "sync", floor),
        Case("a.floor", "raw floor: SET NX + SET", "async", afloor),
        Case("a.get", "raw GET loop", "sync", get),
        Case("a.get", "raw GET loop", "async", aget),
    ]


def core_cases(c: Clients) -> list[Case]:
    """(b) settle reserve + complete on a fresh operation; (c) reserve of a completed one."""
    sync_id, async_id = _ids("op-s"), _ids("op-a")
    done = "op-done"
    first = c.settler.reserve(done, REQUEST, principal=PRINCIPAL)
    assert isinstance(first, Reserved)
    c.settler.complete(first.reservation, RESULT)

    def reserve_complete() -> None:
        got = c.settler.reserve(sync_id(), REQUEST, principal=PRINCIPAL)
        if not isinstance(got, Reserved):
            raise TypeError(f"expected Reserved, got {got!r}")
        c.settler.complete(got.reservation, RESULT)

    async def areserve_complete() -> None:
        got = await c.asettler.reserve(async_id(), REQUEST, principal=PRINCIPAL)
        if not isinstance(got, Reserved):
            raise TypeError(f"expected Reserved, got {got!r}")
        await c.asettler.complete(got.reservation, RESULT)

    def replay() -> None:
        got = c.settler.reserve(done, REQUEST, principal=PRINCIPAL)
        if not isinstance(got, Replay):
            raise TypeError(f"expected Replay, got {got!r}")

    async def areplay() -> None:
        got = await c.asettler.reserve(done, REQUEST, principal=PRINCIPAL)
        if not isinstance(got, Replay):
            raise TypeError(f"expected Replay, got {got!r}")

    return [
        Case("b.reserve_complete", "settle reserve + complete", "sync", reserve_complete),
        Case("b.reserve_complete", "settle reserve + complete", "async", areserve_complete),
        Case("c.replay", "settle replay (reserve of a completed op)", "sync", replay),
        Case("c.replay", "settle replay (reserve of a completed op)", "async", areplay),
    ]


def decorator_cases(c: Clients) -> list[Case]:
    """(d) ``@settler.operation`` end to end on a no-op function: first call and replay."""

    # The sync and async twins share one operation on purpose (the same name=).
    @c.settler.operation(key=lambda order: order["order_id"], principal=PRINCIPAL, name="charge")
    def charge(order: dict[str, Any]) -> dict[str, Any]:  # noqa: ARG001 - a no-op: `order` feeds the key
        return RESULT

    @c.asettler.operation(key=lambda order: order["order_id"], principal=PRINCIPAL, name="charge")
    async def acharge(order: dict[str, Any]) -> dict[str, Any]:  # noqa: ARG001 - as above
        return RESULT

    sync_id, async_id = _ids("dec-s"), _ids("dec-a")
    done = {**REQUEST, "order_id": "dec-done"}
    if charge(order=done) != RESULT:
        raise AssertionError("the decorated function returned something else")

    def first() -> None:
        charge(order={**REQUEST, "order_id": sync_id()})

    async def afirst() -> None:
        await acharge(order={**REQUEST, "order_id": async_id()})

    def replay() -> None:
        if charge(order=done) != RESULT:
            raise AssertionError("the replay returned something else")

    async def areplay() -> None:
        if await acharge(order=done) != RESULT:
            raise AssertionError("the replay returned something else")

    label = "settle @operation, no-op fn"
    return [
        Case("d.first", f"{label}: first call", "sync", first),
        Case("d.first", f"{label}: first call", "async", afirst),
        Case("d.replay", f"{label}: replay", "sync", replay),
        Case("d.replay", f"{label}: replay", "async", areplay),
    ]


def peer_cases(c: Clients) -> list[Case]:
    """(e) Powertools' ``idempotent_function`` on its cache (Redis) persistence layer, the
    same no-op function and request, with payload validation on (settle always validates).
    Powertools has no async API: its rows are sync only."""
    from benchmarks._peer import peer_function  # noqa: PLC0415 - optional dependency

    charge = peer_function(c.url, lambda **_: RESULT)
    sync_id = _ids(f"peer-{c.run}")
    done = {**REQUEST, "order_id": f"peer-{c.run}-done"}
    charge(order=done)

    def first() -> None:
        charge(order={**REQUEST, "order_id": sync_id()})

    def replay() -> None:
        if charge(order=done) != RESULT:
            raise AssertionError("the peer's replay returned something else")

    label = "Powertools idempotent_function"
    return [
        Case("e.first", f"{label}: first call", "sync", first),
        Case("e.replay", f"{label}: replay", "sync", replay),
    ]


def build_cases(c: Clients) -> list[Case]:
    return [*raw_cases(c), *core_cases(c), *decorator_cases(c), *peer_cases(c)]
