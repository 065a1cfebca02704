"""``settle doctor`` with a replica that does not answer (a hung host its primary still lists):
the eviction check warns that the replica's policy could not be read, and the persistence
check, which judges replicas too since this release, said ``ok`` "AOF on every primary and
replica" of a replica it never read. It says the replica's persistence could not be read."""

from __future__ import annotations

import json

from settle import Settler
from settle._runtime import health
from settle._runtime.health import Status
from settle.embedded import EmbeddedRedis
from tests.cli.conftest import settle
from tests.cli.test_doctor import _wait_replica
from tests.faults.servers import frozen


def test_a_replica_that_does_not_answer_is_not_said_to_have_aof() -> None:
    primary = EmbeddedRedis(extra_args=["--appendonly", "yes"]).start()
    replica_args = ["--appendonly", "yes", "--replicaof", "127.0.0.1", str(primary.port)]
    replica = EmbeddedRedis(extra_args=replica_args).start()
    try:
        _wait_replica(primary)
        with Settler.from_url(primary.url, namespace="payments", shards=4) as s:
            s.check()
        with frozen(replica):
            done = settle("doctor", "--redis-url", primary.url, "--namespace", "payments", "--json")
    finally:
        replica.close()
        primary.close()
    checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
    name = f"127.0.0.1:{replica.port}"
    assert checks["eviction"]["status"] == "warn", checks["eviction"]
    persistence = checks["persistence"]
    assert persistence["status"] == "warn", persistence
    assert name in persistence["detail"], persistence
    assert "could not be read" in persistence["detail"], persistence


def test_an_unread_node_is_named_once_every_node_read_passes() -> None:
    aof = {"aof_enabled": 1}
    finding = health.persistence_finding(
        {"p:1": aof, "r:2": aof}, {}, {}, replicas=["r:2"], unread=["r:3"]
    )
    assert (finding.status, "r:3" in finding.detail) == (Status.WARN, True)
    # a node read without AOF is what the row says first
    finding = health.persistence_finding({"p:1": {"aof_enabled": 0}}, {"p:1": ""}, unread=["r:3"])
    assert finding.detail.startswith("no AOF, no RDB save rule on p:1")
    assert health.persistence_finding({"p:1": aof}, {}).status is Status.OK
