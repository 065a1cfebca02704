"""``settle doctor`` on a Redis Cluster with a primary down: the deployment doctor exists to
diagnose. It used to exit 3, "cannot reach Redis at <the seed>" (the seed answered: the dead
node did not; once the cluster flagged it, ``ClusterDownError`` from the namespace read), with
no report. Now it reports every check, the ``cluster slots`` check fails naming the node,
and it exits 1; a primary that failed and whose replica took over (its slots served again)
is no failure."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.cli.conftest import settle
from tests.cluster.cluster_support import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.faults]


def _doctor(url: str) -> tuple[int, dict[str, Any], str]:
    done = settle("doctor", "--redis-url", url, "--json")
    checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]} if done.stdout else {}
    return done.returncode, checks, done.stderr


def _flagged(cluster: LocalCluster, flag: str, via: int = 0) -> bool:
    with cluster.client(via) as c:
        nodes = c.cluster("NODES")
    return any(flag in str(node.get("flags", "")).split(",") for node in nodes.values())


def test_a_dead_primary_is_a_failed_slots_check_not_an_unreachable_cluster() -> None:
    cluster = LocalCluster(primaries=3).start()
    try:
        dead = cluster.nodes[2]
        dead.stop(kill=True)
        name = f"127.0.0.1:{dead.port}"
        # At once (before cluster-node-timeout): the node does not answer.
        code, checks, stderr = _doctor(cluster.url)
        assert code == 1, stderr
        assert checks["cluster slots"]["status"] == "fail"
        assert name in checks["cluster slots"]["detail"]
        assert checks["version"]["status"] == "ok"  # the others are still reported
        # Once the cluster flags it failing, and its state is fail.
        deadline = time.monotonic() + 20
        while not _flagged(cluster, "fail"):
            assert time.monotonic() < deadline, "the cluster never flagged the node"
            time.sleep(0.1)
        code, checks, stderr = _doctor(cluster.url)
        assert code == 1, stderr
        assert name in checks["cluster slots"]["detail"]
        assert "cluster_state not ok" in checks["cluster slots"]["detail"]
        assert checks["namespace"]["status"] == "warn"  # could not be read: said, not raised
    finally:
        cluster.close()


def test_a_primary_whose_replica_took_over_is_no_failure() -> None:
    cluster = LocalCluster(primaries=3, replicas=1).start()
    try:
        cluster.nodes[0].stop(kill=True)
        seed = cluster.nodes[1].url
        deadline = time.monotonic() + 30
        while True:  # the replica is promoted, every slot served again
            code, checks, _ = _doctor(seed)
            if checks.get("cluster slots", {}).get("status") == "ok":
                break
            assert time.monotonic() < deadline, checks.get("cluster slots")
            time.sleep(0.5)
        assert code == 0, checks  # warnings only (no AOF, no replica of the promoted node)
        assert _flagged(cluster, "fail", via=1)  # the old primary is still listed, failed, slotless
    finally:
        cluster.close()
