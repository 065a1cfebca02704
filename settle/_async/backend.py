"""Runs planned script calls on a redis-py asyncio client, standalone or Redis Cluster
(EVALSHA with a NOSCRIPT fallback), repeating a call after a transient failure."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.commands.core import AsyncScript
from redis.exceptions import AskError, NoScriptError, RedisClusterException, RedisError
from tenacity import AsyncRetrying

from settle._core import topology
from settle._core.engine import Call
from settle._core.scripts import SCRIPT_NAMES, WRITING_SCRIPTS, source
from settle._core.transient import (
    ATTEMPTS,
    backend_error,
    first_retry_delay,
    is_transient,
    retry_options,
)
from settle._log import logger
from settle.config import SettleConfig
from settle.errors import BackendError, ConfigurationError, DurabilityError

__all__ = ["AsyncRedisBackend"]

#: A reply that never comes must not hang a payment path forever (standalone and cluster).
SOCKET_TIMEOUT = 30.0
CONNECT_TIMEOUT = 5.0
_CLIENT_DEFAULTS: dict[str, Any] = {
    "decode_responses": False,
    "require_full_coverage": False,
    "socket_timeout": SOCKET_TIMEOUT,
    "socket_connect_timeout": CONNECT_TIMEOUT,
}
#: Connection settings a node's client passes on to the cluster client it is replaced with.
_NODE_SETTINGS = frozenset(
    {
        "host",
        "port",
        "username",
        "password",
        "credential_provider",
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "socket_keepalive_options",
        "client_name",
        "health_check_interval",
        "protocol",
        "retry",
    }
)


class AsyncRedisBackend:
    """Holds one registered script object per script for the client's connection pool.

    Each script call is tried up to ``settle._core.transient.ATTEMPTS`` times with the same
    KEYS and ARGV when the connection drops or times out: every script is safe to repeat.
    """

    def __init__(self, client: Redis | RedisCluster, config: SettleConfig) -> None:
        self._min_replicas = config.min_replicas
        self._wait_ms = max(1, round(config.replica_timeout * 1000))
        self._use(client)

    def _use(self, client: Redis | RedisCluster) -> None:
        self.client = client
        self._nodes: dict[str, Redis] = {}
        self._scripts: dict[str, AsyncScript] = {
            name: client.register_script(source(name)) for name in SCRIPT_NAMES
        }

    @property
    def is_cluster(self) -> bool:
        return isinstance(self.client, RedisCluster)

    @staticmethod
    def cluster_client(
        nodes: str | Sequence[str | tuple[str, int]], options: Mapping[str, Any] | None = None
    ) -> RedisCluster:
        """A binary-safe cluster client from one node's URL or seed ``host:port`` nodes."""
        url, seeds = topology.parse_seed_nodes(nodes)
        kwargs = {**_CLIENT_DEFAULTS, **(options or {})}
        try:
            if url is not None:
                return RedisCluster.from_url(url, **kwargs)
            startup = [ClusterNode(h, p) for h, p in seeds]  # type: ignore[no-untyped-call,unused-ignore]
            return RedisCluster(startup_nodes=startup, **kwargs)
        except (RedisError, RedisClusterException) as exc:
            raise backend_error(exc, None) from exc

    async def run(self, call: Call) -> Any:
        try:
            try:
                return await self._run_once(call)
            except (RedisError, RedisClusterException) as exc:
                if not is_transient(exc):
                    raise
                await asyncio.sleep(first_retry_delay(call, exc))
            retrying = AsyncRetrying(**retry_options(call, tries=ATTEMPTS - 1))
            return await retrying(self._run_once, call)
        except (RedisError, RedisClusterException) as exc:
            raise backend_error(exc, call) from exc

    async def _run_once(self, call: Call) -> Any:
        script = self._scripts[call.script]
        if self._min_replicas and call.script in WRITING_SCRIPTS:
            return await self._run_durable(script, call)
        try:
            return await self.client.evalsha(script.sha, len(call.keys), *call.keys, *call.args)
        except NoScriptError:  # a flushed or restarted server: load once, call again
            await self.client.script_load(script.script)
            return await self.client.evalsha(script.sha, len(call.keys), *call.keys, *call.args)

    async def _run_durable(self, script: AsyncScript, call: Call) -> Any:
        # EVALSHA and WAIT must share one connection: WAIT counts that connection's writes.
        # On a cluster it is a connection to the node that serves the call's slot.
        for _ in range(3):
            node = self._node_for(call)
            async with node.pipeline(transaction=False) as pipe:
                pipe.evalsha(script.sha, len(call.keys), *call.keys, *call.args)
                pipe.execute_command("WAIT", self._min_replicas, self._wait_ms)  # type: ignore[no-untyped-call,unused-ignore]
                reply, acks = await pipe.execute(raise_on_error=False)
            if isinstance(reply, NoScriptError):
                await node.script_load(script.script)
                continue
            if isinstance(reply, AskError):  # the slot moved (MOVED) or is moving (ASK)
                assert isinstance(self.client, RedisCluster)
                await self.client.nodes_manager.initialize()
                continue
            if isinstance(reply, Exception):
                raise reply
            if isinstance(acks, Exception):
                raise acks
            if int(acks) < self._min_replicas:
                logger.error(
                    "settle.backend.durability_failed",
                    script=call.script,
                    operation_id=call.operation_id,
                    attempt_id=call.attempt_id,
                    acknowledged=int(acks),
                    required=self._min_replicas,
                )
                raise DurabilityError(
                    f"{call.script}: {acks} of {self._min_replicas} replicas acknowledged within "
                    f"{self._wait_ms} ms; the outcome is uncertain, read the record back",
                    operation_id=call.operation_id,
                    acknowledged=int(acks),
                    required=self._min_replicas,
                )
            return reply
        raise BackendError(
            f"{call.script}: the server kept losing its script cache or moving the slot; "
            "the outcome is uncertain, read the record back",
            operation_id=call.operation_id,
        )

    def _node_for(self, call: Call) -> Redis:
        """The client of the node that serves the call's slot (the client itself if standalone)."""
        if not isinstance(self.client, RedisCluster):
            return self.client
        node = self.client.get_node_from_key(call.keys[0])  # type: ignore[no-untyped-call,unused-ignore]
        if node is None:
            raise BackendError(
                f"{call.script}: no node serves the slot of {call.keys[0]!r}",
                operation_id=call.operation_id,
            )
        client = self._nodes.get(node.name)
        if client is None:
            client = self._nodes[node.name] = Redis(**_node_settings(node))
        return client

    async def run_many(self, calls: list[Call]) -> list[Any]:
        """Run read calls together: one pipeline on a single server; on a cluster, one call
        per shard (each shard's slot may live on another node, and EVALSHA is not pipelined
        across nodes)."""
        if self.is_cluster:
            return [await self.run(call) for call in calls]
        first = calls[0] if calls else None
        try:
            return await AsyncRetrying(**retry_options(first))(self._pipeline, calls)
        except (RedisError, RedisClusterException) as exc:
            raise backend_error(exc, first) from exc

    async def _pipeline(self, calls: list[Call]) -> list[Any]:
        async with self.client.pipeline(transaction=False) as pipe:
            for call in calls:
                await self._scripts[call.script](
                    keys=list(call.keys),
                    args=list(call.args),
                    client=pipe,  # type: ignore[arg-type,unused-ignore]  # redis-py queues it on the pipeline
                )
            return list(await pipe.execute())

    async def server_info(self) -> dict[str, Any]:
        """``INFO server`` of the oldest node. A cluster must serve every hash slot; a
        ``redis://`` URL of a cluster node is switched to a cluster client here."""
        try:
            return await AsyncRetrying(**retry_options(None))(self._server_info)
        except (RedisError, RedisClusterException) as exc:
            raise backend_error(exc, None) from exc

    async def _server_info(self) -> dict[str, Any]:
        if not isinstance(self.client, RedisCluster):
            info: dict[str, Any] = await self.client.info("server")
            if not topology.is_cluster_mode(info):
                return info
            await self._switch_to_cluster(self.client)
        cluster = self.client
        assert isinstance(cluster, RedisCluster)
        every = RedisCluster.ALL_NODES
        per_node = _per_node(await cluster.info("server", target_nodes=every))
        states = _per_node(await cluster.cluster_info(target_nodes=every))
        slots: Mapping[tuple[int, int], Any] = await cluster.cluster_slots()  # type: ignore[assignment,unused-ignore]  # redis-py parses it into {(low, high): nodes}
        served = list(slots)
        topology.check_cluster(states, served)
        return topology.oldest_node_info(per_node)

    async def _switch_to_cluster(self, node: Redis) -> None:
        pool = node.connection_pool
        given = pool.connection_kwargs
        if "path" in given or str(given.get("db", 0)) != "0":
            raise ConfigurationError(
                "the server is a Redis Cluster node: connect over TCP with database 0 "
                "(redis://host:port/0), or use from_cluster()"
            )
        kwargs = {k: v for k, v in given.items() if k in _NODE_SETTINGS or k.startswith("ssl_")}
        if "SSL" in pool.connection_class.__name__:
            kwargs["ssl"] = True
        logger.info("settle.backend.cluster_detected", host=kwargs["host"], port=kwargs["port"])
        self._use(RedisCluster(**{**_CLIENT_DEFAULTS, **kwargs}))
        await node.aclose()

    async def aclose(self) -> None:
        for node in self._nodes.values():
            await node.aclose()
        await self.client.aclose()


def _per_node(result: Any) -> dict[str, Mapping[str, Any]]:
    """redis-py answers ``{node: reply}`` for several nodes and the bare reply for one."""
    if (
        isinstance(result, Mapping)
        and result
        and all(isinstance(v, Mapping) for v in result.values())
    ):
        return {str(k): v for k, v in result.items()}
    return {"node": result}


def _node_settings(node: Any) -> dict[str, Any]:
    """Connection settings for a plain client of one cluster node, taken from the cluster
    client (redis-py's asyncio node keeps them; its sync node keeps a client that has them)."""
    given = getattr(node, "connection_kwargs", None)
    kind = getattr(node, "connection_class", None)
    if given is None:
        pool = node.redis_connection.connection_pool
        given, kind = pool.connection_kwargs, pool.connection_class
    settings = {k: v for k, v in given.items() if k in _NODE_SETTINGS or k.startswith("ssl_")}
    if kind is not None and "SSL" in kind.__name__:
        settings["ssl"] = True
    return {**settings, "host": node.host, "port": node.port, "decode_responses": False}
