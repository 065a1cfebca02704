"""The asyncio shell of ``settle.cursor``: ``AsyncCursorStore`` runs the planned script calls,
``AsyncCursorConsumer`` carries out one step after another. Hand-written; ``_sync.py`` is
generated from it by ``python scripts/unasync.py`` (a test fails on drift)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis, RedisCluster

# unasync: async-only
from settle._input import awaited

# unasync: end
from settle._runtime import Call, Durability
from settle._runtime._async import AsyncConnectable, AsyncRunner
from settle._runtime.options import check_client
from settle.cursor._core import STAND_DOWN_FOR, CursorCore
from settle.cursor._scripts import SCRIPTS
from settle.cursor._step import Done, FetchPage, HandleEvent, RunScript, procedure
from settle.cursor.errors import ProviderCursorExpired
from settle.cursor.models import (
    Checkpoint,
    Event,
    EventContext,
    Page,
    ProviderContract,
    Receipt,
    StepOutcome,
    StepResult,
    Witness,
)
from settle.errors import InvalidInput

__all__ = ["AsyncCursorConsumer", "AsyncCursorStore"]

_STOP = frozenset({StepOutcome.HELD, StepOutcome.NO_PROGRESS, StepOutcome.LOST})
#: The empty windows in a row one ``run()`` goes over (pages with no event whose coverage
#: marker moved the boundary): a feed's quiet stretch is crossed, and a provider whose marker
#: follows the clock (every fetch covers up to "now", empty) is not fetched ``max_steps``
#: times for nothing new.
EMPTY_WINDOWS = 10

#: An ``async def`` fetch_page, or a plain function (its page stands).
AsyncFetchPageFn = Callable[[bytes], Awaitable[Page] | Page]
#: An ``async def`` handler, or a plain function (its value stands: it ran).
AsyncHandleEventFn = Callable[[Event, EventContext], Awaitable[object] | object]


class AsyncCursorStore(AsyncConnectable):
    """Checkpoints, witnesses and receipts of one namespace's streams in Redis.

    ``min_replicas`` / ``replica_timeout``: as ``SettleConfig``'s, every writing step is
    followed by ``WAIT`` and too few acknowledgements raise ``DurabilityError``.
    ``allow_eviction``: as ``SettleConfig``'s, accept an evicting ``maxmemory-policy``."""

    def __init__(
        self,
        client: Redis | RedisCluster,
        *,
        namespace: str = "default",
        keep_generations: int = 64,
        receipt_horizon: int | None = None,
        min_replicas: int = 0,
        replica_timeout: float = 1.0,
        allow_eviction: bool = False,
    ) -> None:
        check_client(client, (Redis, RedisCluster), type(self).__name__)
        self.core = CursorCore(namespace, keep_generations, receipt_horizon)
        self._runner = AsyncRunner(
            client, SCRIPTS, Durability(min_replicas, replica_timeout, allow_eviction)
        )

    # unasync: async-only
    async def close(self) -> None:
        """The same as ``aclose()``."""
        await self.aclose()

    # unasync: end
    async def run(self, call: Call) -> Any:
        """Run one planned call (every cursor step is safe to repeat)."""
        return await self._runner.run(call)

    async def start(self, stream: str, cursor: bytes, *, boundary: int = 0) -> Checkpoint:
        """Create the stream's checkpoint at its first cursor, unless it exists already."""
        call = self.core.plan_start(stream, cursor, boundary)
        return self.core.decode_start(call, await self.run(call))

    async def checkpoint(self, stream: str) -> Checkpoint | None:
        call = self.core.plan_witnesses(stream, 0)
        return self.core.decode_checkpoint(call, await self.run(call))

    async def witnesses(self, stream: str, *, limit: int = 20) -> list[Witness]:
        """The newest witnesses, newest generation first."""
        call = self.core.plan_witnesses(stream, limit)
        return self.core.decode_witnesses(call, await self.run(call))

    async def receipts(
        self, stream: str, *, after: int | None = None, limit: int = 100
    ) -> list[Receipt]:
        """The durable receipts of the stream's events (what was applied, where, by which
        response), in position order, from just after position ``after``."""
        call = self.core.plan_receipts(stream, after, limit)
        return self.core.decode_receipts(call, await self.run(call))

    async def reset(
        self,
        stream: str,
        *,
        cursor: bytes,
        boundary: int,
        expected_generation: int,
        reapply_pruned: bool = False,
    ) -> Checkpoint:
        """Recovery after a divergence or an expired cursor (see the error's ``recovery``).

        A boundary below a position whose receipt ``receipt_horizon`` pruned is refused
        (``CursorError``, nothing reset): those events would reach ``handle_event`` again
        as new. ``reapply_pruned=True`` accepts that (the handler is idempotent under
        ``ctx.key``)."""
        call = self.core.plan_reset(
            stream,
            cursor=cursor,
            boundary=boundary,
            expected_generation=expected_generation,
            reapply_pruned=reapply_pruned,
        )
        return self.core.decode_reset(call, await self.run(call))


class AsyncCursorConsumer:
    """Pages a provider through ``fetch_page(cursor)`` and hands each event once to
    ``handle_event(event, context)``; the checkpoint advances only to the successor of the
    exact response whose events all have durable receipts."""

    def __init__(
        self,
        fetch_page: AsyncFetchPageFn,
        handle_event: AsyncHandleEventFn,
        contract: ProviderContract,
        *,
        store: AsyncCursorStore,
        stream: str,
        stand_down_for: float = STAND_DOWN_FOR,
    ) -> None:
        """``stand_down_for``: seconds a pending response of another worker may go without
        progress while a shorter copy of it stands down (``LOST``); after that the shorter
        copy stops the stream (``CoverageNotProven``) instead of standing down for good."""
        if not isinstance(store, AsyncCursorStore):  # the other flavour's replies differ
            raise InvalidInput(
                f"store must be a settle.cursor.AsyncCursorStore, got {type(store).__name__}"
            )
        self._core = store.core
        self.stream, self.contract, self._stand_down_ms = self._core.check_consumer(
            stream, contract, stand_down_for
        )
        self.fetch_page = fetch_page
        self.handle_event = handle_event
        self.store = store

    async def step(self) -> StepResult:
        """Fetch the page at the checkpoint, apply it, promote its successor."""
        steps = procedure(self._core, self.stream, self.contract, self._stand_down_ms)
        instruction = next(steps)
        while True:
            match instruction:
                case Done(result=result):
                    return result
                case RunScript(call=call):
                    reply = await self.store.run(call)
                case HandleEvent(event=event, context=context):
                    try:
                        reply = self.handle_event(event, context)
                        # unasync: async-only
                        reply = await awaited(reply)  # a plain handler ran: its value stands
                        # unasync: end
                    except Exception as exc:  # noqa: BLE001 - the handler's own: said, raised
                        instruction = steps.throw(exc)
                        continue
                case FetchPage(cursor=cursor):
                    try:
                        reply = self.fetch_page(cursor)
                        # unasync: async-only
                        reply = await awaited(reply)  # a plain fetch_page's page stands
                        # unasync: end
                    except ProviderCursorExpired as exc:
                        instruction = steps.throw(exc)
                        continue
            instruction = steps.send(reply)

    async def run(self, *, max_steps: int = 1000) -> list[StepResult]:
        """Step until caught up or ``max_steps`` steps ran, and return every step's result.

        The stop rule: stop after a step that is ``HELD`` (an empty page without evidence),
        ``NO_PROGRESS`` (a loop) or ``LOST`` (another worker's response must go on), or
        after a step that applied nothing new and did not move the applied boundary (its
        page had no events, or only events already applied). ``PROMOTED`` with progress and
        ``SUPERSEDED`` (the next step reads the new checkpoint) go on: an empty page whose
        coverage marker moved the boundary is progress, up to ``EMPTY_WINDOWS`` of them in a
        row (a provider whose marker follows the clock moves it on every fetch). Divergences
        and errors propagate."""
        results: list[StepResult] = []
        # The boundary before the first step, so that an empty page that moved it (a coverage
        # marker) goes on: taken for "nothing new", it stopped run() one empty window on.
        start = await self.store.checkpoint(self.stream)
        empty = 0  # empty windows in a row
        for _ in range(max_steps):
            before = results[-1].boundary if results else start.boundary if start else None
            result = await self.step()
            results.append(result)
            if result.outcome is StepOutcome.SUPERSEDED:
                continue  # another worker moved the checkpoint: the next step reads it
            if result.outcome in _STOP or (result.applied == 0 and result.boundary == before):
                break
            empty = empty + 1 if result.applied == 0 else 0
            if empty >= EMPTY_WINDOWS:
                break
        return results
