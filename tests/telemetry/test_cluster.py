"""On a Redis Cluster, each Redis span names the node that served the call's slot
(``network.peer.address`` / ``network.peer.port``; ``server.address`` / ``server.port`` are
the address the application configured): a real 3-primary cluster, the real SDK."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from redis.cluster import ClusterNode

from settle import AsyncSettler, Settler
from settle.progress import ProgressStore, StreamConsumer
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
    """The node is the peer; ``server.address`` / ``server.port`` are the address the
    application configured (the first startup node: here not the cluster's first), as the
    Redis semantic conventions ask, never the node a call went to. A dashboard filtering on
    ``server.address`` sees one cluster, not one series per primary."""
    configured = cluster.startup_nodes[1:] + cluster.startup_nodes[:1]
    settler = Settler.from_cluster(configured, namespace=namespace, shards=8)
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
        assert (a["server.address"], a["server.port"]) == configured[0], span.name
        assert a["network.peer.address"] == "127.0.0.1"
        assert a["network.peer.port"] in ports
        assert a["db.namespace"] == "0"
        seen.add(a["network.peer.port"])
    settler.close()
    assert len(seen) > 1  # eight shards spread over the three primaries


def test_stream_command_spans_name_the_node_of_the_slot_too(
    cluster: LocalCluster, namespace: str, otel: Telemetry
) -> None:
    """The stream consumer's plain commands (``XREADGROUP``, ``XAUTOCLAIM``...) go to the
    node of their stream's slot as the scripts do, and their spans named no node at all:
    docs/observability.md gives them the script spans' attributes ("as above"). The
    settlement's messaging span names the stream's node too."""
    client = redis.RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster.startup_nodes])
    stream = f"orders-{namespace}"
    store = ProgressStore(client, consumer="c1", namespace=namespace)
    consumer = StreamConsumer(client, store, stream=stream, group="billing", block=0.01)
    try:
        consumer.start()
        client.xadd(stream, {"emission_id": "e-1", "body": "payload-e-1"})
        consumer.poll(lambda _ctx: None)
    finally:
        consumer.close()
        client.close()
    node = cluster.serving(redis.RedisCluster.keyslot(client, stream))
    port = cluster.nodes[node].port
    commands = {"XREADGROUP", "XAUTOCLAIM", "XRANGE"}
    seen = set()
    for span in otel.spans():
        a = span.attributes or {}
        if a.get("db.operation.name") in commands or a.get("messaging.operation.type"):
            node = (a.get("network.peer.address"), a.get("network.peer.port"))
            assert node == ("127.0.0.1", port), span.name
            configured = ("127.0.0.1", cluster.nodes[0].port)
            assert (a.get("server.address"), a.get("server.port")) == configured, span.name
            seen.add(a.get("db.operation.name") or "settlement")
    assert {"XREADGROUP", "settlement"} <= seen, seen
    # The duration metric keeps the configured server only: a series per node would split
    # one cluster's settlements (the node is the span's alone, docs/observability.md).
    points = otel.points(
        "messaging.client.operation.duration", **{"messaging.destination.name": stream}
    )
    assert points
    for point in points:
        given = dict(point.attributes)
        assert (given["server.address"], given["server.port"]) == configured, given
        assert not {"network.peer.address", "network.peer.port"} & set(given), given


def _configured_and_peers(otel: Telemetry, configured: tuple[str, int], port: int) -> set[int]:
    """Every script span names ``configured`` as its server and a primary as its peer; the
    peers seen."""
    script = script_operation(port)
    peers = set()
    for span in otel.spans():
        a = span.attributes or {}
        if a.get("db.operation.name") != script:
            continue
        assert (a["server.address"], a["server.port"]) == configured, span.name
        peers.add(a["network.peer.port"])
    return peers


def test_a_cluster_node_url_is_the_configured_server(
    cluster: LocalCluster, namespace: str, otel: Telemetry
) -> None:
    """``Settler.from_url`` on one node's URL (not the cluster's first node) switches to a
    cluster client at its check: the spans' server is that URL's node, whichever primary
    each call goes to."""
    node = cluster.nodes[2]
    settler = Settler.from_url(node.url, namespace=namespace, shards=8)
    try:
        for n in range(8):
            settler.reserve(f"op-{n}", {"n": n}, principal="tenant:a")
    finally:
        settler.close()
    peers = _configured_and_peers(otel, ("127.0.0.1", node.port), node.port)
    assert len(peers) > 1


@pytest.mark.asyncio
async def test_async_cluster_spans_name_the_configured_server_and_the_peer(
    cluster: LocalCluster, namespace: str, otel: Telemetry
) -> None:
    """The async cluster client (its own redis-py class) as the sync one."""
    configured = cluster.startup_nodes[1:] + cluster.startup_nodes[:1]
    settler = AsyncSettler.from_cluster(configured, namespace=namespace, shards=8)
    try:
        for n in range(8):
            await settler.reserve(f"op-{n}", {"n": n}, principal="tenant:a")
    finally:
        await settler.aclose()
    peers = _configured_and_peers(otel, configured[0], cluster.nodes[0].port)
    assert len(peers) > 1
