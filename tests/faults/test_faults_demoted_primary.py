"""A server that is not a primary: a URL that names a replica (a provider's reader endpoint,
a typo in a port), and a primary demoted while settle holds connections to it (a Sentinel's
graceful failover, ``SENTINEL FAILOVER``, or a partition healed: the old primary is alive
and becomes a replica of the promoted one).

settle refuses a replica before the first write with a ConfigurationError naming its
primary (a replica refuses every write, or loses it at its next sync), ``settle doctor``
fails it, and a Sentinel-managed settler follows a demotion to the promoted node: Redis 6.2
answers a script's write on a demoted primary with a script error that carries READONLY,
which redis-py's Sentinel connections did not drop, so every later call of the settler
failed on the demoted node for as long as the process lived."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from settle import (
    AsyncSettler,
    ConfigurationError,
    Settler,
)
from settle.embedded import EmbeddedRedis
from tests.cli.conftest import settle
from tests.faults.servers import replica_of, wait_replicas

pytestmark = [pytest.mark.faults]

REQ = {"amount": 1000}
WHO = "tenant:acme"


@pytest.fixture
def pair() -> Iterator[tuple[EmbeddedRedis, EmbeddedRedis]]:
    """A primary and its replica, in sync."""
    with EmbeddedRedis() as primary:
        replica = replica_of(primary)
        try:
            wait_replicas(primary, 1)
            yield primary, replica
        finally:
            replica.close()


def _keys(server: EmbeddedRedis) -> list[bytes]:
    with redis.Redis(port=server.port) as raw:
        return list(raw.scan_iter("settle:*"))


def test_a_settler_on_a_replicas_url_is_refused_before_the_first_write(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str
) -> None:
    primary, replica = pair
    # It used to be a BackendError ("check that the server is reachable") from a script's
    # READONLY, on every call.
    s = Settler.from_url(replica.url, namespace=namespace, shards=2)
    try:
        with pytest.raises(
            ConfigurationError, match=f"replica of 127.0.0.1:{primary.port}"
        ) as info:
            s.reserve("op-1", REQ, principal=WHO)
    finally:
        s.close()
    assert "Connect to the primary" in str(info.value)
    assert _keys(primary) == []
    assert _keys(replica) == []


@pytest.mark.asyncio
async def test_an_async_settler_on_a_writable_replica_is_refused_too(namespace: str) -> None:
    # A writable replica (replica-read-only no) would take the writes, and lose them at its
    # next sync with its primary: a completed record that vanishes.
    with (
        EmbeddedRedis() as primary,
        EmbeddedRedis(
            extra_args=["--replicaof", "127.0.0.1", str(primary.port), "--replica-read-only", "no"]
        ) as writable,
    ):
        wait_replicas(primary, 1)
        a = AsyncSettler.from_url(writable.url, namespace=namespace, shards=2)
        try:
            with pytest.raises(ConfigurationError, match="replica of"):
                await a.reserve("op-1", REQ, principal=WHO)
        finally:
            await a.aclose()
        assert _keys(writable) == []


def test_doctor_fails_a_replicas_url(pair: tuple[EmbeddedRedis, EmbeddedRedis]) -> None:
    primary, replica = pair
    done = settle("doctor", "--redis-url", replica.url, "--json")
    checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
    assert done.returncode == 1, checks  # it used to pass (a warning: "0 replicas")
    assert checks["replicas"]["status"] == "fail"
    assert f"is a replica of 127.0.0.1:{primary.port}" in checks["replicas"]["detail"]
    assert "primary" in checks["replicas"]["fix"]
