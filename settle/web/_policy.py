"""The banner of a console whose settler allows eviction (``settle web`` without a token):
the evicting ``maxmemory-policy`` of its server, or of each cluster primary, read at most
once per :data:`READ_EVERY` seconds in a task of its own. A page waits for the first read
only: read before each page, a primary that did not answer (hung, cut off) held up every
page for ``redis_timeout`` and made it a 503, those reading only the other primaries too."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import RedisCluster

from settle._async.settler import AsyncSettler
from settle._runtime.health import eviction_policy, is_evicting
from settle.errors import SettleError

__all__ = ["READ_EVERY", "EvictionBanner", "evicting_policies"]

#: Seconds between two reads of the policies for the banner (a policy set at runtime is
#: named within them).
READ_EVERY = 10.0


async def evicting_policies(settler: AsyncSettler) -> list[str]:
    """The evicting ``maxmemory-policy`` of the settler's server (of each primary, on a
    cluster), from ``INFO memory``: empty when none evicts. A failed read (INFO denied: the
    settler warned of that, ``settle.backend.eviction_unknown``; Redis failing) raises
    :class:`SettleError`."""

    def send(client: Any) -> Any:
        if isinstance(client, RedisCluster):
            return client.info("memory", target_nodes=RedisCluster.PRIMARIES)
        return client.info("memory")

    found = await settler._command("INFO", send)
    # redis-py answers {node: reply} for several nodes, the bare reply for one
    several = isinstance(found, dict) and all(isinstance(v, dict) for v in found.values())
    replies = list(found.values()) if several and found else [found]
    policies = (eviction_policy(info) for info in replies if isinstance(info, dict))
    return sorted({p for p in policies if p is not None and is_evicting(p)})


class EvictionBanner:
    """The evicting policies a console's pages name (:func:`evicting_policies`), read
    again once the last read is :data:`READ_EVERY` old, each read within ``seconds``."""

    def __init__(self, settler: AsyncSettler, seconds: float) -> None:
        self._settler = settler
        self._seconds = seconds
        self._policies: list[str] = []
        self._read_at: float | None = None
        self._reading: asyncio.Task[None] | None = None

    async def policies(self) -> list[str]:
        """The policies last read; a read is started when they are due, and awaited by the
        first page alone (within its request's bound: it reads every shard anyway)."""
        loop = asyncio.get_running_loop()
        if self._reading is not None and self._reading.get_loop() is not loop:
            self._reading = None  # a task of a closed loop (an app served again) never ends
        due = self._read_at is None or loop.time() - self._read_at >= READ_EVERY
        if due and self._reading is None:
            self._reading = loop.create_task(self._read())
        if self._read_at is None and self._reading is not None:
            await asyncio.wait({self._reading})  # not cancelled with the page
        return self._policies

    async def _read(self) -> None:
        try:
            async with asyncio.timeout(self._seconds):
                self._policies = await evicting_policies(self._settler)
        except (TimeoutError, SettleError):
            # A primary that does not answer, INFO denied, Redis failing (the page's own
            # reads say that): the policies read last stand, as the banner of an evicting
            # server must not disappear on one failed read.
            pass
        finally:
            self._read_at = asyncio.get_running_loop().time()
            self._reading = None
