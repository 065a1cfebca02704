"""Cancel a task that calls settle in a loop, and count the cancellations it lost (shared by
tests/integration/test_cancellation.py and the cluster and Sentinel tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

ROUNDS = 40
#: How long a cancelled task may take to end: far above one call on a loaded machine.
ENDS_WITHIN = 5.0


async def lost_cancellations(call: Callable[[], Awaitable[Any]]) -> int:
    """Cancel a task that awaits ``call()`` in a loop, ROUNDS times at moments spread over a
    few calls; how many times it ran on (each such task is cancelled until it ends)."""
    lost = 0
    for i in range(ROUNDS):

        async def loop() -> None:
            while True:
                await call()

        task = asyncio.create_task(loop())
        await asyncio.sleep(0.002 + (i % 9) * 0.0004)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=ENDS_WITHIN)
        if not done:
            lost += 1
            for _ in range(100):  # each cancellation can be lost again
                task.cancel()
                done, _ = await asyncio.wait([task], timeout=0.1)
                if done:
                    break
            assert done, "a task that lost its cancellation never stopped"
        assert task.cancelled() or isinstance(task.exception(), asyncio.CancelledError)
    return lost
