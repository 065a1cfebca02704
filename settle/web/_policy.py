"""The banner of a console whose settler allows eviction (``settle web`` without a token):
the evicting ``maxmemory-policy`` of its server, or of each cluster primary, or the
primaries whose policy could not be read (``INFO`` denied), read at most once per
:data:`READ_EVERY` seconds in a task of its own. A page waits for the first read only: read
before each page, a primary that did not answer (hung, cut off) held up every page for
``redis_timeout`` and made it a 503, those reading only the other primaries too."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, NamedTuple

from redis.asyncio import RedisCluster
from redis.exceptions import NoPermissionError

from settle._async.settler import AsyncSettler
from settle._runtime.health import eviction_policy, is_evicting
from settle.errors import SettleError

__all__ = ["READ_EVERY", "Banner", "EvictionBanner", "read_policies"]

#: Seconds between two reads of the policies for the banner (a policy set at runtime is
#: named within them).
READ_EVERY = 10.0


class Banner(NamedTuple):
    """What a page's banner says: the evicting policies read (empty: none evicts), and the
    primaries whose policy was never read, INFO denied there (``""``: the server of a
    console that is not on a cluster; empty: every policy was read)."""

    evicting: list[str]
    unread: list[str]


async def read_policies(settler: AsyncSettler) -> tuple[dict[str, str | None], list[str]]:
    """The ``maxmemory-policy`` of the settler's server (node ``""``), or of each primary
    of a cluster (``host:port``), from ``INFO memory`` (None: the reply does not say); and
    the nodes whose ACL denies ``INFO`` (the settler warned of them,
    ``settle.backend.eviction_unknown``). Each primary is asked on its own, so one
    denied leaves the others' read. Redis failing, or a primary that does not answer,
    raises :class:`SettleError`."""

    async def info(client: Any, **target: Any) -> Mapping[str, Any] | None:
        try:
            found = await client.info("memory", **target)
        except NoPermissionError:
            return None
        # redis-py answers {node: reply} for a node named, or the bare reply
        if isinstance(found, dict) and found and all(isinstance(v, dict) for v in found.values()):
            found = next(iter(found.values()))
        return found if isinstance(found, dict) else {}

    async def send(client: Any) -> dict[str, Mapping[str, Any] | None]:
        if isinstance(client, RedisCluster):
            primaries = client.get_primaries()
            replies = await asyncio.gather(*(info(client, target_nodes=n) for n in primaries))
            return {str(n.name): reply for n, reply in zip(primaries, replies, strict=True)}
        return {"": await info(client)}

    found: dict[str, Mapping[str, Any] | None] = await settler._command("INFO", send)
    policies = {node: eviction_policy(i) for node, i in found.items() if i is not None}
    return policies, sorted(node for node, i in found.items() if i is None)


def _evicting(policies: Mapping[str, str | None]) -> list[str]:
    return sorted({p for p in policies.values() if p is not None and is_evicting(p)})


class EvictionBanner:
    """What a console's pages say of the policy (:class:`Banner`), read again once the last
    read is :data:`READ_EVERY` old, each read within ``seconds``. A primary's policy read
    stands until it is read again: a read that fails, or that a primary denies, keeps it
    (the banner of an evicting server must not disappear on one failed read); a primary
    whose policy was never read is named as such until a read of it succeeds."""

    def __init__(self, settler: AsyncSettler, seconds: float) -> None:
        self._settler = settler
        self._seconds = seconds
        self._known: dict[str, str | None] = {}
        self._banner = Banner([], [])
        self._read_at: float | None = None
        self._reading: asyncio.Task[None] | None = None

    async def banner(self) -> Banner:
        """The banner of the last read; a read is started when it is due, and awaited by
        the first page alone (within its request's bound: it reads every shard anyway)."""
        loop = asyncio.get_running_loop()
        if self._reading is not None and self._reading.get_loop() is not loop:
            self._reading = None  # a task of a closed loop (an app served again) never ends
        due = self._read_at is None or loop.time() - self._read_at >= READ_EVERY
        if due and self._reading is None:
            self._reading = loop.create_task(self._read())
        if self._read_at is None and self._reading is not None:
            await asyncio.wait({self._reading})  # not cancelled with the page
        return self._banner

    async def _read(self) -> None:
        try:
            async with asyncio.timeout(self._seconds):
                policies, refused = await read_policies(self._settler)
        except (TimeoutError, SettleError):
            # A primary that does not answer, Redis failing (the page's own reads say
            # that): the banner read last stands.
            pass
        else:
            # The primaries of this read (a cluster's may have changed): each read now, or
            # refused now and known from an earlier read, whose policy stands.
            known = {node: self._known[node] for node in refused if node in self._known}
            self._known = {**known, **policies}
            unread = [node for node in refused if node not in self._known]
            self._banner = Banner(_evicting(self._known), unread)
        finally:
            self._read_at = asyncio.get_running_loop().time()
            self._reading = None
