"""On a Redis Cluster, each Redis span names the node that served the call's slot
(``server.address`` / ``server.port``): a real 3-primary cluster, the real SDK."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from settle import Settler
from tests.cluster.cluster_support import LocalCluster
from tests.telemetry.conftest import Telemetry, script_operation

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    running = LocalCluster(primaries=3).start()
    yield running
    running.close()


def test_redis_spans_name_the_node_of_the_slot(
    cluster: LocalCluster, namespace: str, otel: Telemetry
) -> None:
    settler = Settler.from_cluster(cluster.startup_nodes, namespace=namespace, shards=8)
    for n in range(8):
        r = settler.reserve(f"op-{n}", {"n": n}, principal="tenant:a")
        settler.complete(r.reservation, {"ok": n})
    ports = {node.port for node in cluster.nodes}
    script = script_operation(cluster.nodes[0].port)
    seen = set()
    for span in otel.spans():
        a = span.attributes or {}
        if a.get("db.operation.name") != script:
            continue
        assert a["server.address"] == "127.0.0.1"
        assert a["server.port"] in ports
        assert a["db.namespace"] == "0"
        seen.add(a["server.port"])
    settler.close()
    assert len(seen) > 1  # eight shards spread over the three primaries
