"""The asyncio shell of ``settle.cursor``: ``AsyncCursorStore`` runs the planned script calls,
``AsyncCursorConsumer`` carries out one step after another. Hand-written; ``_sync.py`` is
generated from it by ``python scripts/unasync.py`` (a test fails on drift)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from redis import exceptions as rx
from redis.asyncio import Redis, RedisCluster

# unasync: async-only
from settle._input import awaited

# unasync: end
from settle._runtime import Call, Durability
from settle._runtime._async import AsyncConnectable, AsyncRunner
from settle._runtime.options import check_client
from settle._runtime.transient import APART_ROUNDS, error_code, unsettled_apart
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
        return self.core.decode_checkpoint(call, await self._inspect(call))

    async def witnesses(self, stream: str, *, limit: int = 20) -> list[Witness]:
        """The newest witnesses, newest generation first."""
        call = self.core.plan_witnesses(stream, limit)
        return self.core.decode_witnesses(call, await self._inspect(call))

    async def receipts(
        self, stream: str, *, after: int | None = None, limit: int = 100
    ) -> list[Receipt]:
        """The durable receipts of the stream's events (what was applied, where, by which
        response), in position order, from just after position ``after``."""
        call = self.core.plan_receipts(stream, after, limit)
        return self.core.decode_receipts(call, await self._inspect(call))

    async def _inspect(self, call: Call) -> Any:
        """Run an inspection call (``witnesses``, ``receipts``: the stream's five keys, read
        only). On Redis Cluster, one a migration refuses while it splits the keys between
        two nodes (or while one of them does not exist: the importing node cannot hold it)
        is read one key at a time (:meth:`_inspect_apart`), with the same answer."""
        return await self._runner.run_or_apart(call, self._inspect_apart)

    async def _inspect_apart(self, call: Call) -> Any:
        """``call`` in single-key reads, which a migrating slot serves (after ASK if the key
        moved): the checkpoint, the witness index or receipt index, the witnesses or
        receipts it names (and, for witnesses, the index again), then the checkpoint again.
        Every write that deletes a witness or a receipt, or changes a receipt or a witness
        but its ``updated`` (a promotion, a reset), changes the checkpoint: when it is the
        same before and after, every entry the index named was still there when the hash
        was read (one HMGET for all), each as it was then. A witness recorded and another
        resumed (its ``updated``) leave the checkpoint as it was: the index read again, the
        same, says no witness was recorded before that resume was read. Else all is read
        again."""
        ckpt, wit, wits, rcpt, rpos = call.keys
        for _ in range(APART_ROUNDS):
            first = await self._checkpoint_fields(ckpt)
            code = self.core.apart_code(first)
            if first is None or code != "ok":
                return self.core.apart_reply(code, {}, [])
            if call.script == "witnesses":
                extra = await self._witnesses_apart(wit, wits, int(call.args[0]))
            else:
                extra = await self._receipts_apart(rcpt, rpos, call.args[0], int(call.args[1]))
            if extra is not None and await self._checkpoint_fields(ckpt) == first:
                return self.core.apart_reply("ok", first, extra)
        raise unsettled_apart(call, "the stream's checkpoint")

    async def _checkpoint_fields(self, key: str) -> dict[Any, Any] | None:
        """The checkpoint's fields ({}: none), None when the key is not a hash."""

        async def send(client: Any) -> dict[Any, Any] | None:
            try:
                found: dict[Any, Any] = await client.hgetall(key)
            except rx.ResponseError as exc:
                if error_code(exc) != "WRONGTYPE":
                    raise
                return None
            return found

        return await self._runner.command("HGETALL", send, key=key)  # type: ignore[no-any-return]

    async def _witnesses_apart(self, wit: str, wits: str, limit: int) -> list[Any] | None:
        """The newest ``limit`` witnesses as the script lists them; None when the index
        changed while they were read (a witness recorded: read again)."""
        if not limit:
            return []
        aids = await self._newest(wits, limit)
        if not aids:
            return []
        fields = self.core.witness_fields(aids)
        values = await self._runner.command(
            "HMGET", lambda client: client.hmget(wit, fields), key=wit
        )
        if await self._newest(wits, limit) != aids:
            return None
        return self.core.witnesses_apart(aids, values)

    async def _newest(self, wits: str, limit: int) -> list[Any]:
        """The witness index's newest ``limit`` attempt ids."""
        aids: list[Any] = await self._runner.command(
            "ZREVRANGEBYSCORE",
            lambda client: client.zrevrangebyscore(wits, "+inf", "-inf", start=0, num=limit),
            key=wits,
        )
        return aids

    async def _receipts_apart(self, rcpt: str, rpos: str, after: Any, limit: int) -> list[Any]:
        low = "-inf" if after == "" else f"({after}"
        ids = await self._runner.command(
            "ZRANGEBYSCORE",
            lambda client: client.zrangebyscore(rpos, low, "+inf", start=0, num=limit),
            key=rpos,
        )
        if not ids:
            return []
        values = await self._runner.command(
            "HMGET", lambda client: client.hmget(rcpt, ids), key=rcpt
        )
        return self.core.receipts_apart(ids, values)

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
