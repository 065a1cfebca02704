"""Every replica's ``maxmemory-policy`` is read at start-up and by ``settle doctor`` (a failover
makes a replica the primary): a replica settle cannot ask is warned about, never refused, and
never holds the first call up for longer than its one 2 s try (redis-py's default retries
made it ~25 s, and ~60 s in doctor). Real primaries and replicas; a replica that does not
answer is a real SIGSTOP. The refusal itself: tests/faults/test_faults_eviction.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import tempfile
import time
from collections.abc import Iterator

import pytest
import redis
from structlog.testing import capture_logs

from settle import AsyncSettler, ConfigurationError, Settler
from settle.embedded import EmbeddedRedis
from tests.acl import app_user
from tests.cli.conftest import settle
from tests.cluster.cluster_support import LocalCluster
from tests.faults.servers import acks

pytestmark = [pytest.mark.faults]


def _wait_linked(primary: EmbeddedRedis, n: int = 1) -> None:
    with redis.Redis.from_url(primary.url) as raw:
        deadline = time.monotonic() + 10
        # Online: synced, so the replica follows the primary's replication id.
        while acks(raw, n, 100) < n:
            assert time.monotonic() < deadline
            time.sleep(0.05)


@pytest.fixture
def hung() -> Iterator[tuple[EmbeddedRedis, EmbeddedRedis]]:
    """A healthy primary and a replica that stopped answering (the primary still lists it
    until repl-timeout)."""
    primary = EmbeddedRedis().start()
    replica = EmbeddedRedis(extra_args=["--replicaof", "127.0.0.1", str(primary.port)]).start()
    try:
        _wait_linked(primary)
        assert replica.process is not None
        replica.process.send_signal(signal.SIGSTOP)
        yield primary, replica
    finally:
        if replica.process is not None:
            replica.process.send_signal(signal.SIGCONT)
        replica.close()
        primary.close()


def test_a_replica_that_does_not_answer_is_warned_about_after_one_try_sync(
    hung: tuple[EmbeddedRedis, EmbeddedRedis],
) -> None:
    # docs/operations.md: "A replica that does not answer within 2 s is logged as unread".
    primary, replica = hung
    started = time.monotonic()
    with capture_logs() as logs, Settler.from_url(primary.url, namespace="h", shards=1) as s:
        s.check()
    took = time.monotonic() - started
    assert [e["nodes"] for e in logs if e["event"] == "settle.backend.eviction_unknown"] == [
        f"127.0.0.1:{replica.port}"
    ]
    assert took < 10, f"the start-up check took {took:.1f} s for one replica out of reach"


def test_a_replica_that_does_not_answer_is_warned_about_after_one_try_async(
    hung: tuple[EmbeddedRedis, EmbeddedRedis],
) -> None:
    primary, replica = hung

    async def main() -> float:
        started = time.monotonic()
        async with AsyncSettler.from_url(primary.url, namespace="h", shards=1) as s:
            await s.reserve("op", {"n": 1}, principal="p")
        return time.monotonic() - started

    with capture_logs() as logs:
        took = asyncio.run(main())
    assert [e["nodes"] for e in logs if e["event"] == "settle.backend.eviction_unknown"] == [
        f"127.0.0.1:{replica.port}"
    ]
    assert took < 10, f"the first call took {took:.1f} s for one replica out of reach"


def test_doctor_with_a_replica_that_does_not_answer_is_not_stuck(
    hung: tuple[EmbeddedRedis, EmbeddedRedis],
) -> None:
    primary, replica = hung
    started = time.monotonic()
    done = settle("doctor", "--redis-url", primary.url, "--json", timeout=300)
    took = time.monotonic() - started
    checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
    assert f"127.0.0.1:{replica.port}" in checks["eviction"]["detail"]
    assert took < 20, f"settle doctor took {took:.1f} s for one replica out of reach"


# -- other ways to reach or not reach a replica ----------------------------------------------


def test_a_unix_socket_primary_reads_its_tcp_replica() -> None:
    sock = os.path.join(tempfile.mkdtemp(prefix="rv-"), "p.sock")
    primary = EmbeddedRedis(extra_args=["--unixsocket", sock, "--unixsocketperm", "700"]).start()
    replica = EmbeddedRedis(
        extra_args=[
            "--replicaof",
            "127.0.0.1",
            str(primary.port),
            "--maxmemory-policy",
            "allkeys-lru",
        ]
    ).start()
    try:
        _wait_linked(primary)
        with (
            pytest.raises(ConfigurationError, match=f"allkeys-lru on 127.0.0.1:{replica.port}"),
            Settler.from_url(f"unix://{sock}?db=0", namespace="u", shards=1) as s,
        ):
            s.check()
    finally:
        replica.close()
        primary.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_user_denied_info_on_the_replica_is_warned_about_not_refused(flavour: str) -> None:
    primary = EmbeddedRedis().start()
    replica = EmbeddedRedis(extra_args=["--replicaof", "127.0.0.1", str(primary.port)]).start()
    try:
        _wait_linked(primary)
        app_user(primary, "+@all", name="svc")
        app_user(replica, "+@all", "-info", name="svc")
        url = f"redis://svc:pw@127.0.0.1:{primary.port}/0"
        started = time.monotonic()
        with capture_logs() as logs:
            if flavour == "sync":
                with Settler.from_url(url, namespace="a", shards=1) as s:
                    s.check()
            else:

                async def main() -> None:
                    async with AsyncSettler.from_url(url, namespace="a", shards=1) as s:
                        await s.reserve("op", {"n": 1}, principal="p")

                asyncio.run(main())
        assert time.monotonic() - started < 15  # INFO denied is an answer: nothing waits
        unknown = [e["nodes"] for e in logs if e["event"] == "settle.backend.eviction_unknown"]
        assert unknown == [f"127.0.0.1:{replica.port}"]
    finally:
        replica.close()
        primary.close()


def test_a_replica_that_refuses_the_credentials_is_asked_once() -> None:
    # Its ACL LOG counts the AUTH attempts exactly (11 with redis-py's default retries).
    primary = EmbeddedRedis().start()
    replica = EmbeddedRedis(extra_args=["--replicaof", "127.0.0.1", str(primary.port)]).start()
    try:
        _wait_linked(primary)
        with redis.Redis.from_url(primary.url) as raw:
            raw.config_set("requirepass", "pw")
        with redis.Redis.from_url(replica.url) as raw:
            raw.config_set("masterauth", "pw")
            raw.config_set("requirepass", "other")
        with redis.Redis(port=replica.port, password="other") as raw:
            raw.acl_log_reset()
        url = f"redis://:pw@127.0.0.1:{primary.port}/0"
        with capture_logs() as logs, Settler.from_url(url, namespace="c", shards=1) as s:
            s.check()
        unknown = [e["nodes"] for e in logs if e["event"] == "settle.backend.eviction_unknown"]
        assert unknown == [f"127.0.0.1:{replica.port}"]
        with redis.Redis(port=replica.port, password="other") as raw:
            assert [(e["reason"], e["count"]) for e in raw.acl_log()] == [("auth", 1)]
    finally:
        replica.close()
        primary.close()


def test_a_listed_address_that_reaches_another_server_is_not_judged() -> None:
    # The primary lists a replica at the address it announces (or the peer address the
    # primary sees): from the client that address can reach another server (NAT, Docker, a
    # port reused). Here an unrelated allkeys-lru cache; the real replica is noeviction.
    # settle judges only a node that replicates this primary, and says which it could not.
    other = EmbeddedRedis(extra_args=["--maxmemory-policy", "allkeys-lru"]).start()
    primary = EmbeddedRedis().start()
    announce = ["--replica-announce-port", str(other.port)]
    replica = EmbeddedRedis(
        extra_args=["--replicaof", "127.0.0.1", str(primary.port), *announce]
    ).start()
    try:
        _wait_linked(primary)
        with capture_logs() as logs, Settler.from_url(primary.url, namespace="x", shards=1) as s:
            s.check()
        unknown = [e["nodes"] for e in logs if e["event"] == "settle.backend.eviction_unknown"]
        assert unknown == [f"127.0.0.1:{other.port}"]
        done = settle("doctor", "--redis-url", primary.url, "--json", timeout=120)
        checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
        assert checks["eviction"]["status"] == "warn"
        assert f"127.0.0.1:{other.port}" in checks["eviction"]["detail"]
    finally:
        replica.close()
        primary.close()
        other.close()


def test_info_replication_denied_is_said_by_the_runner_and_by_doctor() -> None:
    primary = EmbeddedRedis().start()
    evicting = ["--maxmemory-policy", "allkeys-lru"]
    replica = EmbeddedRedis(
        extra_args=["--replicaof", "127.0.0.1", str(primary.port), *evicting]
    ).start()
    try:
        _wait_linked(primary)
        sections = ["+info|server", "+info|memory", "+info|persistence"]
        app_user(primary, "+@all", "-info", *sections, name="svc")
        url = f"redis://svc:pw@127.0.0.1:{primary.port}/0"
        # The runner judges the primary and warns that its replicas went unread.
        with capture_logs() as logs, Settler.from_url(url, namespace="d", shards=1) as s:
            s.check()
        unknown = [e["nodes"] for e in logs if e["event"] == "settle.backend.eviction_unknown"]
        assert unknown == ["its replicas (INFO replication denied)"]
        done = settle("doctor", "--redis-url", url, "--json", timeout=120)
        checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
        assert checks["eviction"]["status"] == "warn"
        assert "INFO replication denied" in checks["eviction"]["detail"]
        assert checks["replicas"]["status"] == "warn"
        assert "could not be read" in checks["replicas"]["detail"]
    finally:
        replica.close()
        primary.close()


def test_doctor_on_a_cluster_with_a_replica_that_does_not_answer_warns() -> None:
    # Until cluster-node-timeout passes (15 s by default) CLUSTER NODES lists a hung replica
    # without the fail flag (60 s here, so the window stays open); one the doctor's host
    # cannot reach never gets it. doctor must still report, naming the replica.
    cluster = LocalCluster(
        primaries=1, replicas=1, extra_args=["--cluster-node-timeout", "60000"]
    ).start()
    replica = cluster.nodes[cluster.replica_of(0)]
    assert replica.process is not None
    replica.process.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        done = settle("doctor", "--redis-url", cluster.url, "--json", timeout=300)
        took = time.monotonic() - started
        assert done.returncode != 3, done.stderr  # 3: "cannot reach Redis"
        checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
        assert checks["eviction"]["status"] == "warn"
        assert f"127.0.0.1:{replica.port}" in checks["eviction"]["detail"]
        assert took < 40, f"settle doctor took {took:.1f} s for one replica out of reach"
    finally:
        replica.process.send_signal(signal.SIGCONT)
        cluster.close()


def test_an_evicting_replica_in_its_first_full_sync_is_refused() -> None:
    # Until its first full sync has loaded, a replica keeps its own replication id; it is
    # the primary's replica all the same (listed, role slave, link not up) and is judged.
    # A diskless sync held back 20 s keeps it in that window for the test.
    held = ["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "20"]
    primary = EmbeddedRedis(extra_args=held).start()
    evicting = ["--maxmemory-policy", "allkeys-lru"]
    replica = EmbeddedRedis(
        extra_args=["--replicaof", "127.0.0.1", str(primary.port), *evicting]
    ).start()
    try:
        with redis.Redis.from_url(primary.url) as raw:
            deadline = time.monotonic() + 10
            while int(raw.info("replication")["connected_slaves"]) < 1:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert raw.info("replication")["slave0"]["state"] in ("wait_bgsave", "send_bulk")
        with (
            pytest.raises(ConfigurationError, match=f"allkeys-lru on 127.0.0.1:{replica.port}"),
            Settler.from_url(primary.url, namespace="f", shards=1) as s,
        ):
            s.check()
        done = settle("doctor", "--redis-url", primary.url, "--json", timeout=120)
        checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
        assert checks["eviction"]["status"] == "fail"
        assert f"127.0.0.1:{replica.port}" in checks["eviction"]["detail"]
    finally:
        replica.close()
        primary.close()
