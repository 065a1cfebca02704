"""The console behind Redis Sentinel (``AsyncSettler.from_sentinel``, ``settle web
--redis-url redis+sentinel://``): before each page, the Sentinels asked for the primary, so that
no page writes on an old one (docs/console.md)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import RedisError

from settle._async.settler import AsyncSettler
from settle._log import logger

__all__ = ["FollowingPrimary", "behind_sentinel"]


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
    became the new primary's replica. Asked, the pool closes its idle connections to any
    other primary, and the runner replaces the ones it keeps before their next use
    (settle/_runtime, ``_Lane._take``), whichever connection asked first; when no Sentinel
    answers, the page is served as it would have been (its own calls ask again)."""

    def __init__(self, app: Any, settler: AsyncSettler, timeout: float) -> None:
        self._app = app
        self._settler = settler
        self._timeout = timeout
        #: The primary the Sentinels named at this console's last ask (None: not yet).
        self._primary: tuple[Any, ...] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and "/static/" not in scope.get("path", ""):
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                async with asyncio.timeout(self._timeout):
                    pool = self._settler.client.connection_pool
                    named = tuple(await pool.get_master_address())
                    before, self._primary = self._primary, named
                    if before is not None and before != named:
                        logger.warning("settle.web.primary_changed")
        await self._app(scope, receive, send)
