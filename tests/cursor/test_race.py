"""Two workers race to promote the same generation: exactly one wins, and the loser's
successor is never published."""

from __future__ import annotations

import threading

import httpx

from settle.cursor import (
    CursorConsumer,
    CursorStore,
    Event,
    EventContext,
    ProviderContract,
    StepOutcome,
    StepResult,
)
from settle.cursor.models import Disposition
from tests.cursor.conftest import Sink
from tests.cursor.provider import fetcher


def test_two_workers_race_to_promote_the_same_generation(serve, redis_url, namespace) -> None:
    server = serve(page_size=3, rotate=True)
    p = server.provider
    p.append(3)
    contract = ProviderContract(rotation_allowed=True)
    rounds = 12
    for r in range(rounds):
        stream = f"race-{r}"
        setup = CursorStore.from_url(redis_url, namespace=namespace)
        g0 = setup.start(stream, p.token(0).encode()).generation
        setup.close()
        sink = Sink()
        barrier = threading.Barrier(2, timeout=10)
        results: dict[int, StepResult] = {}
        errors: list[BaseException] = []

        def worker(
            i: int, stream=stream, sink=sink, barrier=barrier, results=results, errors=errors
        ) -> None:
            store = CursorStore.from_url(redis_url, namespace=namespace)

            def handle(event: Event, ctx: EventContext) -> None:
                if event.id == "e3":
                    barrier.wait()  # both hold a witness and are one receipt from promoting
                sink(event, ctx)

            try:
                with httpx.Client() as http:
                    c = CursorConsumer(
                        fetcher(server.url, http), handle, contract, store=store, stream=stream
                    )
                    results[i] = c.step()
            except BaseException as exc:
                errors.append(exc)
            finally:
                store.close()

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors

        outcomes = sorted(res.outcome.value for res in results.values())
        assert outcomes == ["promoted", "superseded"], outcomes
        check = CursorStore.from_url(redis_url, namespace=namespace)
        ck = check.checkpoint(stream)
        witnesses = check.witnesses(stream)
        check.close()
        assert ck is not None
        assert ck.generation == g0 + 1
        assert ck.boundary == 3
        [winner] = [w for w in witnesses if w.disposition is Disposition.PROMOTED]
        [loser] = [w for w in witnesses if w.disposition is Disposition.ABANDONED]
        assert ck.cursor == winner.successor != loser.successor
        won = next(res for res in results.values() if res.outcome is StepOutcome.PROMOTED)
        assert won.attempt_id == winner.attempt_id
        # The effect of each event happened once (its idempotency key is shared).
        assert sorted(sink.effects.values()) == ["e1", "e2", "e3"]


def test_a_worker_whose_witness_was_pruned_while_it_handled_an_event_is_superseded(
    redis_url: str, namespace: str
) -> None:
    """Worker B is inside its handler when worker A promotes the stream further than
    ``keep_generations``, which prunes B's witness. B's receipt call then finds no witness:
    the race it lost, answered as SUPERSEDED (nothing published), not as CorruptRecord after
    its effect ran, which sent operators looking for corruption that does not exist."""
    from settle.cursor import Page  # noqa: PLC0415

    log = [Event(f"e{i}", i, {"v": i}) for i in range(1, 50)]

    def fetch(cursor: bytes) -> Page:
        after = int(cursor.decode())
        events = [e for e in log if e.position > after][:2]
        return Page(events, successor=str(events[-1].position if events else after).encode())

    for keep in (1, 3):
        stream = f"pruned-{keep}"
        store = CursorStore.from_url(redis_url, namespace=namespace, keep_generations=keep)
        g0 = store.start(stream, b"0").generation
        a = CursorConsumer(fetch, lambda e, c: None, ProviderContract(), store=store, stream=stream)
        handled: list[str] = []

        def slow(event: Event, ctx: EventContext, a=a, keep=keep, handled=handled) -> None:
            if not handled:
                for _ in range(keep + 2):  # A moves on; B's witness is pruned
                    assert a.step().outcome is StepOutcome.PROMOTED
            handled.append(event.id)

        b = CursorConsumer(fetch, slow, ProviderContract(), store=store, stream=stream)
        result = b.step()
        assert result.outcome is StepOutcome.SUPERSEDED
        assert handled == ["e1"]  # stopped at once: the rest of its response is not handled
        checkpoint = store.checkpoint(stream)
        assert checkpoint is not None
        assert checkpoint.generation == g0 + keep + 2
        store.close()
