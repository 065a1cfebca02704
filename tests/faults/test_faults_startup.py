"""Start-up errors (SPEC 11): a Redis too old for the scripts and wrong credentials give a
clear, typed error before anything is written. (A cluster with a missing hash slot is in
``tests/cluster/test_cluster_topology.py``.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from settle import AsyncSettler, ConfigurationError, Settler
from settle._runtime import topology
from settle.embedded import EmbeddedRedis

pytestmark = [pytest.mark.faults]

REQ = {"amount": 1000}
WHO = "tenant:acme"
PASSWORD = "s3cret-Pa55"


@pytest.fixture(scope="module")
def real_info(redis_url: str) -> dict[str, Any]:
    with redis.Redis.from_url(redis_url) as raw:
        info: dict[str, Any] = raw.info("server")
    return info


@pytest.mark.parametrize("version", ["6.0.20", "5.0.14", "4.0.9"])
def test_a_redis_older_than_6_2_is_refused_at_start_up(
    real_info: dict[str, Any], version: str
) -> None:
    # The INFO a real server sent, with only its version string edited: the same check
    # a too-old server meets when a Settler starts.
    # (On Valkey, its own version fields go: an old Redis has none.)
    redis_only = {k: v for k, v in real_info.items() if k not in ("valkey_version", "server_name")}
    old = {**redis_only, "redis_version": version}
    with pytest.raises(
        ConfigurationError, match=r"Redis 6\.2 or newer.*" + version.replace(".", r"\.")
    ):
        topology.check_server(old)


@pytest.mark.parametrize(
    "field", [("redis_version", "6.2.0"), ("redis_version", "7.4.1"), ("valkey_version", "8.0.2")]
)
def test_supported_versions_pass_the_check(
    real_info: dict[str, Any], field: tuple[str, str]
) -> None:
    topology.check_server({**real_info, field[0]: field[1]})


def test_the_real_server_of_this_run_passes_the_check(
    real_info: dict[str, Any], figures: dict[str, str]
) -> None:
    version = real_info.get("valkey_version")
    server = f"valkey {version}" if version else str(real_info["redis_version"])
    figures["redis-server of this run"] = server
    topology.check_server(real_info)


@pytest.fixture(scope="module")
def locked() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis().start()
    with redis.Redis.from_url(server.url) as raw:
        raw.config_set("requirepass", PASSWORD)
    yield server
    server.close()


def _url(server: EmbeddedRedis, password: str | None) -> str:
    auth = f":{password}@" if password is not None else ""
    return f"redis://{auth}127.0.0.1:{server.port}/0"


def _keys(server: EmbeddedRedis) -> int:
    with redis.Redis.from_url(_url(server, PASSWORD)) as raw:
        return int(raw.dbsize())


@pytest.mark.parametrize("password", ["wrong-password", None], ids=["wrong", "missing"])
def test_wrong_or_missing_password_is_a_configuration_error(
    locked: EmbeddedRedis, namespace: str, password: str | None
) -> None:
    s = Settler.from_url(_url(locked, password), namespace=namespace)
    with pytest.raises(ConfigurationError) as info:
        s.reserve("op", REQ, principal=WHO)  # the first call runs the start-up check
    message = str(info.value)
    assert "credentials" in message
    assert "password" in message
    assert "wrong-password" not in message  # a secret never ends up in an error or a log
    assert isinstance(info.value.__cause__, redis.RedisError)
    assert _keys(locked) == 0
    s.close()


@pytest.mark.asyncio
async def test_wrong_password_is_a_configuration_error_in_async_too(
    locked: EmbeddedRedis, namespace: str
) -> None:
    s = AsyncSettler(aioredis.Redis.from_url(_url(locked, "nope")), namespace=namespace)
    with pytest.raises(ConfigurationError, match="credentials"):
        await s.check()
    await s.aclose()
    assert _keys(locked) == 0


def test_the_right_password_works(locked: EmbeddedRedis, namespace: str) -> None:
    with Settler.from_url(_url(locked, PASSWORD), namespace=namespace) as s:
        r = s.reserve("op", REQ, principal=WHO)
        assert s.get("op") is not None
        assert r.record.version == 1


def test_a_replica_timeout_longer_than_the_socket_timeout_is_refused_up_front() -> None:
    """Found in review: WAIT outlived the client's socket timeout, so every durable write
    timed out, was sent again four times and ended as BackendError, not DurabilityError."""
    client = redis.Redis(host="127.0.0.1", port=1, socket_timeout=0.5)
    with pytest.raises(ConfigurationError, match=r"replica_timeout \(2\.0 s\) must be shorter"):
        Settler(client, namespace="wait", min_replicas=1, replica_timeout=2.0)
    Settler(client, namespace="wait", min_replicas=1, replica_timeout=0.2).close()
