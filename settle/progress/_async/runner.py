"""Runs planned script calls on a redis-py asyncio client (EVALSHA with NOSCRIPT fallback)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from settle._core.engine import Call
from settle.errors import BackendError
from settle.progress.scripts import source

__all__ = ["AsyncScriptRunner", "backend_error"]


class AsyncScriptRunner:
    """One registered script object per script name, for one client's connection pool."""

    def __init__(self, client: Redis, names: tuple[str, ...]) -> None:
        self.client = client
        self._scripts: dict[str, AsyncScript] = {
            name: client.register_script(source(name)) for name in names
        }

    async def load(self) -> None:
        """Load every script now (so no first call pays the NOSCRIPT round trip)."""
        try:
            for script in self._scripts.values():
                await self.client.script_load(script.script)
        except RedisError as exc:
            raise backend_error(exc, "SCRIPT LOAD") from exc

    async def run(self, call: Call) -> Any:
        try:
            return await self._scripts[call.script](keys=list(call.keys), args=list(call.args))
        except RedisError as exc:
            raise backend_error(exc, call.script) from exc


def backend_error(exc: RedisError, what: str) -> BackendError:
    return BackendError(
        f"Redis failed during {what}: {exc.__class__.__name__}: {exc}. Check that the server "
        "is reachable; progress and fenced settlements are safe to repeat."
    )
