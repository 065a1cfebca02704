"""``MemorySettler``: settle without Redis, for your own unit tests.

It is the reference model the Lua scripts are held against (``settle/_core/reference.py``),
behind the same ``Settler`` / ``AsyncSettler`` surface, so it gives the same verdicts,
records and quarantine entries on every sequence of calls. Time comes from a clock you can
replace: :class:`ManualClock` makes leases expire on demand.

    from settle.testing import MemorySettler, ManualClock
    clock = ManualClock()
    settler = MemorySettler(namespace="payments", clock=clock)
    r = settler.reserve("order-1", {"amount": 100}, principal="tenant:acme", lease=5)
    clock.advance(6)            # the lease has now passed
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from settle._async.settler import AsyncSettler
from settle._core.reference import MemoryKeyspace, run_script
from settle._runtime import Call
from settle._sync.settler import Settler
from settle.config import SettleConfig
from settle.errors import InvalidInput

__all__ = [
    "AsyncMemoryBackend",
    "AsyncMemorySettler",
    "ManualClock",
    "MemoryBackend",
    "MemorySettler",
]


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class ManualClock:
    """A clock that only moves when told to (milliseconds since the epoch)."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, seconds: float) -> None:
        self.now_ms += round(seconds * 1000)


class MemoryBackend:
    """Runs planned calls on the in-memory reference model."""

    def __init__(
        self, keyspace: MemoryKeyspace | None = None, clock: Callable[[], int] | None = None
    ):
        self.keyspace = keyspace or MemoryKeyspace(clock or wall_clock_ms)

    def run(self, call: Call) -> Any:
        return run_script(self.keyspace, call.script, list(call.keys), list(call.args))

    def run_many(self, calls: list[Call]) -> list[Any]:
        return [self.run(call) for call in calls]

    def prepare(self) -> dict[str, Any]:
        return {"redis_version": "7.2.0"}

    def check_mark(self) -> int:
        return 0

    @property
    def place(self) -> str:
        """Where its records live: its keyspace (the decorator's identity registry)."""
        return self.keyspace.place

    def suspect(self, mark: int | None = None) -> None:
        """Nothing to check again: the model has no server."""

    def exists(self, keys: tuple[str, ...]) -> int | None:
        with self.keyspace.lock:
            now = self.keyspace.clock()
            return sum(self.keyspace.type(key, now) != "none" for key in keys)

    def close(self) -> None:
        return None


class AsyncMemoryBackend:
    """The async face of :class:`MemoryBackend` (scripts are atomic and never block)."""

    def __init__(self, backend: MemoryBackend) -> None:
        self.sync = backend

    async def run(self, call: Call) -> Any:
        return self.sync.run(call)

    async def run_many(self, calls: list[Call]) -> list[Any]:
        return self.sync.run_many(calls)

    async def prepare(self) -> dict[str, Any]:
        return self.sync.prepare()

    def check_mark(self) -> int:
        return self.sync.check_mark()

    @property
    def place(self) -> str:
        return self.sync.place

    def suspect(self, mark: int | None = None) -> None:
        self.sync.suspect(mark)

    async def exists(self, keys: tuple[str, ...]) -> int | None:
        return self.sync.exists(keys)

    async def aclose(self) -> None:
        return None


def _settings(config: SettleConfig | None, options: dict[str, Any]) -> SettleConfig:
    if config is not None and not isinstance(config, SettleConfig):
        raise InvalidInput(
            f"config must be a SettleConfig, got {type(config).__name__}; pass the settings "
            "as keyword arguments or as SettleConfig(...)"
        )
    if config is None:
        return SettleConfig(**options)
    return SettleConfig(**{**config.model_dump(), **options})


def MemorySettler(  # noqa: N802 - a factory that reads like the class it returns
    config: SettleConfig | None = None,
    *,
    clock: Callable[[], int] | None = None,
    keyspace: MemoryKeyspace | None = None,
    **options: Any,
) -> Settler:
    """A :class:`~settle.Settler` on the in-memory reference model."""
    return Settler._from_backend(MemoryBackend(keyspace, clock), _settings(config, options))


def AsyncMemorySettler(  # noqa: N802 - a factory that reads like the class it returns
    config: SettleConfig | None = None,
    *,
    clock: Callable[[], int] | None = None,
    keyspace: MemoryKeyspace | None = None,
    **options: Any,
) -> AsyncSettler:
    """An :class:`~settle.AsyncSettler` on the in-memory reference model."""
    backend = AsyncMemoryBackend(MemoryBackend(keyspace, clock))
    return AsyncSettler._from_backend(backend, _settings(config, options))
