"""A stream consumer of either flavour on a cluster client, for the cluster tests of
delivery progress: ``call`` runs one of its methods from an async test (the sync flavour's
off the event loop, so that a test's own timeout still fires)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from settle.progress import (
    AsyncProgressStore,
    AsyncStreamConsumer,
    EffectContext,
    ProgressStore,
    StreamConsumer,
)

#: What the tests pass to every consumer: polls that do not wait, claims soon.
OPTIONS: dict[str, Any] = {"group": "billing", "worker": "w1", "block": 0.01, "claim_idle": 0.05}


@dataclass
class Worker:
    """A consumer of ``stream`` whose effect appends each emission id to ``runs``."""

    stream: str
    consumer: Any
    runs: list[str]
    effect: Any
    call: Callable[..., Any]

    async def poll(self) -> Any:
        return await self.call("poll", self.effect)

    async def close(self) -> None:
        closing = self.consumer.close()
        if asyncio.iscoroutine(closing):
            await closing


def stream_worker(
    client: Any, flavour: str, *, stream: str, consumer: str, namespace: str
) -> Worker:
    """A consumer on ``client`` (a cluster client of ``flavour``) whose progress lives on
    the same cluster."""
    runs: list[str] = []
    if flavour == "sync":
        store = ProgressStore(client, consumer=consumer, namespace=namespace)
        made: Any = StreamConsumer(client, store, stream=stream, **OPTIONS)

        def effect(ctx: EffectContext) -> None:
            runs.append(ctx.emission.value)

        async def call(method: str, *args: Any) -> Any:
            return await asyncio.to_thread(getattr(made, method), *args)
    else:
        store_a = AsyncProgressStore(client, consumer=consumer, namespace=namespace)
        made = AsyncStreamConsumer(client, store_a, stream=stream, **OPTIONS)

        async def effect(ctx: EffectContext) -> None:  # type: ignore[misc]
            runs.append(ctx.emission.value)

        async def call(method: str, *args: Any) -> Any:
            return await getattr(made, method)(*args)

    return Worker(stream, made, runs, effect, call)
