"""The console behind Redis Sentinel (``AsyncSettler.from_sentinel``, ``settle web
--redis-url redis+sentinel://``): before each page, the Sentinels asked for the primary and
the connections to any other closed (docs/console.md)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import RedisError

from settle._async.settler import AsyncSettler
from settle._log import logger

__all__ = ["FollowingPrimary", "behind_sentinel", "kept_connections"]


def behind_sentinel(settler: AsyncSettler) -> bool:
    """Whether ``settler`` reaches the primary the Sentinels name (``from_sentinel``)."""
    return isinstance(getattr(settler.client, "connection_pool", None), SentinelConnectionPool)


class FollowingPrimary:
    """The console on a Sentinel-managed settler (``from_sentinel``, ``settle web --redis-url
    redis+sentinel://``), asking the Sentinels for the primary before each page
    (one ``SENTINEL MASTERS``, within ``redis_timeout``). redis-py's Sentinel client asks
    them only when it opens a connection, and the console keeps its connections: after a
    ``SENTINEL FAILOVER`` the old primary stays a primary until the Sentinels reconfigure
    it, seconds later, and a resolve written there meanwhile was lost with its data when it
    became the new primary's replica. When the primary named is not the one this console
    last settled on (the pool's own record is no guide: any new connection of the settler
    updates it), the connections to any other are closed (the runner's kept ones too)
    before the page is served, one page at a time; when no Sentinel answers, the page is
    served as it would have been (its own calls ask again)."""

    def __init__(self, app: Any, settler: AsyncSettler, timeout: float) -> None:
        self._app = app
        self._settler = settler
        self._timeout = timeout
        #: The primary this console's connections were last settled on (None: not yet).
        self._primary: tuple[Any, ...] | None = None
        self._settling = asyncio.Lock()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and "/static/" not in scope.get("path", ""):
            named: tuple[Any, ...] | None = None
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                async with asyncio.timeout(self._timeout):
                    named = tuple(await self._settler.client.connection_pool.get_master_address())
            if named is not None:
                await self._settle_on(named)
        await self._app(scope, receive, send)

    async def _settle_on(self, named: tuple[Any, ...]) -> None:
        """Close the connections to any primary but ``named`` (every one, the first time: a
        settler of a service may have kept some before the first page)."""
        async with self._settling:  # a page served meanwhile waits for the old ones closed
            if named == self._primary:
                return
            first, self._primary = self._primary is None, named
            pool = self._settler.client.connection_pool
            release = kept_connections(self._settler)
            if release is not None:
                await release()
                await pool.disconnect(inuse_connections=False)
            else:  # not found by name: every connection closed, in use too
                await pool.disconnect(inuse_connections=True)
        if not first:
            closed = "kept_and_idle" if release is not None else "all"
            logger.warning("settle.web.primary_changed", connections=closed)


def kept_connections(settler: AsyncSettler) -> Callable[[], Awaitable[None]] | None:
    """What hands back the connections ``settler``'s runner keeps between calls, for the
    pool to close (settle/_runtime: ``_Lane.release_idle``); None when the runner has none
    by that name (tests/web/test_console_sentinel.py fails first)."""
    lane = getattr(getattr(settler, "_runner", None), "_lane", None)
    release = getattr(lane, "release_idle", None)
    return release if callable(release) else None
