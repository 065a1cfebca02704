"""The CLI on a Redis Cluster with a primary down (killed, or frozen with SIGSTOP). doctor's
eviction and persistence rows said "ok" having read only the nodes that answered; ``stats``,
``quarantine ls`` and ``inspect`` said "cannot reach Redis at <the seed URL>", the node that
answered, so the operator checked the wrong server. Now the rows name the node they could
not read (a ``warn``), and the commands name the node and the namespace's shards on it
(exit 3, no partial answer)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from redis.crc import key_slot

from settle import Settler
from tests.cli.conftest import settle
from tests.cli.helpers import stale_settlement
from tests.cluster.cluster_support import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.faults]

NAMESPACE = "down"


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    c = LocalCluster(primaries=3).start()
    try:
        with Settler.from_url(c.url, namespace=NAMESPACE, shards=8) as s:
            s.check()
            for i in range(4):
                stale_settlement(s, f"order-{i}")
        yield c
    finally:
        c.close()


def _shards_on(cluster: LocalCluster, index: int) -> list[int]:
    with cluster.client(0) as c:
        served = [
            (low, high)
            for low, high, at, *_ in c.execute_command("CLUSTER", "SLOTS")
            if int(at[1]) == cluster.nodes[index].port
        ]
    return [
        s
        for s in range(8)
        if any(lo <= key_slot(f"settle:{{{NAMESPACE}:{s}}}".encode()) <= hi for lo, hi in served)
    ]


def test_doctor_memory_names_the_fullest_node_of_the_cluster(cluster: LocalCluster) -> None:
    """The memory row grades the fullest node: one near its maxmemory (about 87%) is a
    ``warn`` naming it, though another node has room to spare and a third no limit."""
    with cluster.client(1) as full, cluster.client(2) as roomy:
        used = int(full.info("memory")["used_memory"])
        full.config_set("maxmemory", str(int(used * 1.15)))
        roomy.config_set("maxmemory", "1gb")
        try:
            done = settle("doctor", "--redis-url", cluster.url, "--namespace", NAMESPACE, "--json")
        finally:
            full.config_set("maxmemory", "0")
            roomy.config_set("maxmemory", "0")
    checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["memory"]["status"] == "warn", checks["memory"]
    assert checks["memory"]["detail"].startswith(f"127.0.0.1:{cluster.nodes[1].port} uses")


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_a_primary_down_is_named_by_every_command(cluster: LocalCluster, how: str) -> None:
    index = 2 if how == "killed" else 1
    node = f"127.0.0.1:{cluster.nodes[index].port}"
    shards = _shards_on(cluster, index)
    assert shards, "the test needs shards on that node"
    if how == "killed":
        cluster.nodes[index].stop(kill=True)
    else:
        cluster.freeze(index)
    try:
        base = ("--redis-url", cluster.url, "--namespace", NAMESPACE, "--redis-timeout", "1")
        shown = ", ".join(map(str, shards))
        named = f"shard{'s' if len(shards) > 1 else ''} {shown} of namespace {NAMESPACE!r}"
        for command in (("stats",), ("quarantine", "ls"), ("inspect", "order-1")):
            # The shards on the node are named when the count is known: given, or read
            # before the cluster flags the node failing (then every node refuses reads).
            for extra in ((), ("--shards", "8")):
                started = time.monotonic()
                done = settle(*command, *base, *extra, timeout=120)
                took = time.monotonic() - started
                assert done.returncode == 3, (command, done.stderr)
                assert done.stdout == "", command
                line = done.stderr.strip()
                assert "\n" not in line
                assert "Traceback" not in line
                assert f"cannot reach Redis node {node}" in line, line
                assert f"cannot reach Redis at {cluster.url}" not in line, line
                if extra:
                    assert named in line, line
                assert took < 30, (command, took)
        done = settle("doctor", *base, "--json", timeout=120)
        assert done.returncode == 1, done.stderr
        checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
        for row in ("eviction", "persistence"):
            assert checks[row]["status"] in {"warn", "fail"}, checks[row]
            # the killed node of the other case stays down: both are named, in address order
            unread = checks[row]["detail"].split("not read on ", 1)[1].split(" (primary down")[0]
            assert node in unread.split(", "), checks[row]
        assert node in checks["cluster slots"]["detail"]
    finally:
        if how == "frozen":
            cluster.thaw(index)
