"""Runs planned script calls on a redis-py asyncio client (EVALSHA, NOSCRIPT fallback)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError

from settle._core.engine import Call
from settle._core.scripts import SCRIPT_NAMES, WRITING_SCRIPTS, source
from settle.config import SettleConfig
from settle.errors import BackendError, DurabilityError

__all__ = ["AsyncRedisBackend"]


class AsyncRedisBackend:
    """Holds one registered script object per script for the client's connection pool."""

    def __init__(self, client: Redis | RedisCluster, config: SettleConfig) -> None:
        self.client = client
        self._min_replicas = config.min_replicas
        self._wait_ms = max(1, round(config.replica_timeout * 1000))
        self._scripts: dict[str, AsyncScript] = {
            name: client.register_script(source(name)) for name in SCRIPT_NAMES
        }

    async def run(self, call: Call) -> Any:
        script = self._scripts[call.script]
        try:
            if self._min_replicas and call.script in WRITING_SCRIPTS:
                return await self._run_durable(script, call)
            return await script(keys=list(call.keys), args=list(call.args))
        except RedisError as exc:
            raise _backend_error(exc, call) from exc

    async def _run_durable(self, script: AsyncScript, call: Call) -> Any:
        # EVALSHA and WAIT must share one connection: WAIT counts that connection's writes.
        for _ in range(2):
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.evalsha(script.sha, len(call.keys), *call.keys, *call.args)
                pipe.execute_command("WAIT", self._min_replicas, self._wait_ms)
                reply, acks = await pipe.execute(raise_on_error=False)
            if isinstance(reply, NoScriptError):
                await self.client.script_load(script.script)
                continue
            if isinstance(reply, Exception):
                raise reply
            if isinstance(acks, Exception):
                raise acks
            if int(acks) < self._min_replicas:
                raise DurabilityError(
                    f"{call.script}: {acks} of {self._min_replicas} replicas acknowledged within "
                    f"{self._wait_ms} ms; the outcome is uncertain, read the record back",
                    operation_id=call.operation_id,
                    acknowledged=int(acks),
                    required=self._min_replicas,
                )
            return reply
        raise BackendError(
            "the server keeps losing its script cache", operation_id=call.operation_id
        )

    async def run_many(self, calls: list[Call]) -> list[Any]:
        """Run read calls together (one pipeline where the client allows)."""
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for call in calls:
                    await self._scripts[call.script](
                        keys=list(call.keys),
                        args=list(call.args),
                        client=pipe,  # type: ignore[arg-type,unused-ignore]  # redis-py queues it on the pipeline
                    )
                return list(await pipe.execute())
        except RedisError as exc:
            raise _backend_error(exc, calls[0] if calls else None) from exc

    async def server_info(self) -> dict[str, Any]:
        try:
            info: dict[str, Any] = await self.client.info("server")
        except RedisError as exc:
            raise _backend_error(exc, None) from exc
        return info

    async def aclose(self) -> None:
        await self.client.aclose()


def _backend_error(exc: RedisError, call: Call | None) -> BackendError:
    what = call.script if call else "a command"
    return BackendError(
        f"Redis failed during {what}: {exc.__class__.__name__}: {exc}. Check that the server "
        "is reachable; settlement calls are safe to repeat with the same arguments.",
        operation_id=call.operation_id if call else None,
    )
