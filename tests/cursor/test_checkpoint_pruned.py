"""``Checkpoint.pruned``: the highest position whose receipt ``receipt_horizon`` pruned, the
lowest boundary a ``reset`` takes without ``reapply_pruned`` (real Redis, sync and async).

Found in a hunt: the checkpoint kept the position, and ``reset`` refused a boundary below it,
but ``store.checkpoint()`` did not say it, so an operator choosing a stable boundary had to
guess from the receipts left (``receipts(after=-1)``), which a receipt written above the
gap by an older settle makes wrong."""

from __future__ import annotations

import pytest

from settle.cursor import (
    AsyncCursorConsumer,
    AsyncCursorStore,
    CursorConsumer,
    CursorError,
    CursorStore,
    Event,
    ProviderContract,
)
from tests.cursor.test_reset_pruned import afetch, fetch


def test_the_checkpoint_says_up_to_where_receipts_were_pruned(
    redis_url: str, namespace: str
) -> None:
    with CursorStore.from_url(redis_url, namespace=namespace, receipt_horizon=3) as store:
        assert store.start("s", b"0").pruned is None
        CursorConsumer(fetch, lambda e, c: None, ProviderContract(), store=store, stream="s").run()
        ck = store.checkpoint("s")
        assert ck is not None
        assert (ck.boundary, ck.pruned) == (10, 6)
        # It is the line reset draws: below it refused, at it taken.
        with pytest.raises(CursorError, match="reapply_pruned"):
            store.reset("s", cursor=b"5", boundary=5, expected_generation=ck.generation)
        after = store.reset("s", cursor=b"6", boundary=6, expected_generation=ck.generation)
        assert after.pruned == 6
    with CursorStore.from_url(redis_url, namespace=namespace) as kept:
        kept.start("t", b"0")
        CursorConsumer(fetch, lambda e, c: None, ProviderContract(), store=kept, stream="t").run()
        ck = kept.checkpoint("t")
        assert ck is not None
        assert (ck.boundary, ck.pruned) == (10, None)  # nothing pruned without a horizon


@pytest.mark.asyncio
async def test_the_checkpoint_says_up_to_where_receipts_were_pruned_async(
    redis_url: str, namespace: str
) -> None:
    store = AsyncCursorStore.from_url(redis_url, namespace=namespace, receipt_horizon=3)
    try:
        await store.start("s", b"0")

        async def handle(event: Event, ctx: object) -> None:
            return None

        await AsyncCursorConsumer(afetch, handle, ProviderContract(), store=store, stream="s").run()
        ck = await store.checkpoint("s")
        assert ck is not None
        assert (ck.boundary, ck.pruned) == (10, 6)
    finally:
        await store.aclose()
