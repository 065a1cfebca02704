"""A cluster failover that redis-py follows on its own (it finds the dead primary, reads the
slot map again and repeats the command on the promoted replica before settle sees an error)
brings a primary whose ``maxmemory-policy`` settle never judged: a replica's policy is read at
start-up only, and an evicting one set afterwards (or a replica attached afterwards) became
the primary. Before this fix every call wrote there, for as long as the recheck interval,
where the same failover behind Sentinel is refused at once. A primary the client never
judged is now checked before the first call settle routes to it. Real cluster of 3
primaries with 1 replica each, the primary killed with SIGKILL."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from settle import AsyncSettler, BackendError, ConfigurationError, Reserved, Settler
from settle._core.keys import Keys
from tests.cluster import test_cluster_failover
from tests.cluster.cluster_support import LocalCluster
from tests.cluster.test_cluster_failover import FAILOVER_BOUND, SHARDS, _ops_on, _until
from tests.integration.conftest import Awaitable

pytestmark = [pytest.mark.cluster, pytest.mark.faults, pytest.mark.asyncio]

REQ = {"amount": 1000}
WHO = "tenant:acme"
#: The failover tests' fixture: a cluster of 3 primaries with 1 replica each, per test.
replicated = test_cluster_failover.replicated


def _settled_again(cluster: LocalCluster, promoted: int) -> bool:
    """The replica is the primary and every live node says the cluster is ok."""
    for index, node in enumerate(cluster.nodes):
        if index == 0:  # killed
            continue
        with redis.Redis(port=node.port, socket_timeout=1) as c:
            if index == promoted and c.info("replication")["role"] != "master":
                return False
            if c.cluster("INFO")["cluster_state"] != "ok":
                return False
    return True


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_promoted_replica_whose_policy_evicts_is_refused_before_settle_writes_there(
    replicated: LocalCluster, namespace: str, flavour: str
) -> None:
    opts: dict[str, Any] = {"namespace": namespace, "shards": SHARDS}
    if flavour == "sync":
        sync = Settler.from_cluster(replicated.url, **opts)
        api: Any = Awaitable(sync)
        runner = sync._runner
    else:
        api = AsyncSettler.from_cluster(replicated.url, **opts)
        runner = api._runner
    ops = _ops_on(0, namespace, 12, "op")
    other = _ops_on(1, namespace, 1, "other")[0]
    try:
        assert isinstance(await api.reserve(ops[0], REQ, principal=WHO), Reserved)
        runner.recheck_interval = 3600.0  # the periodic recheck does not come to the rescue
        promoted = replicated.replica_of(0)
        port = replicated.nodes[promoted].port
        with replicated.client(promoted) as c:  # set after the start-up read the replicas
            c.config_set("maxmemory-policy", "allkeys-lru")
        replicated.nodes[0].stop(kill=True)
        _until(lambda: _settled_again(replicated, promoted), FAILOVER_BOUND)
        landed: list[str] = []
        refusal: ConfigurationError | None = None
        for op in ops[1:]:
            try:
                await api.reserve(op, REQ, principal=WHO)
            except ConfigurationError as exc:
                refusal = exc
                refused = op
                break
            except BackendError:  # the failover seen by settle: also evidence
                await asyncio.sleep(0.2)
                continue
            landed.append(op)
        assert refusal is not None, f"written on an evicting primary: {landed}"
        assert f"allkeys-lru on 127.0.0.1:{port}" in str(refusal)
        # Only the call during which redis-py itself followed the failover is sent
        # unchecked; the refused call wrote nothing.
        assert len(landed) <= 1
        with replicated.client(promoted) as c:
            assert c.exists(Keys(namespace, SHARDS).record(refused)) == 0
        # The other primaries' calls go on.
        assert isinstance(await api.reserve(other, REQ, principal=WHO), Reserved)
    finally:
        if flavour == "sync":
            sync.close()
        else:
            await api.aclose()
