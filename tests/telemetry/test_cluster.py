"""On a Redis Cluster, each Redis span names the node that served the call's slot
(``network.peer.address`` / ``network.peer.port``; ``server.address`` / ``server.port`` are
the address the application configured): a real 3-primary cluster, the real SDK."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from opentelemetry.trace import StatusCode
from redis.cluster import ClusterNode
from redis.crc import key_slot

from settle import AsyncSettler, Settler
from settle._core.keys import Keys
from settle.cursor import CursorStore
from settle.cursor._keys import stream_keys
from settle.errors import BackendError
from settle.progress import AsyncProgressStore, ProgressStore, StreamConsumer
from settle.progress.identity import DeliveryId, EmissionId, ProviderScope
from tests.cluster.cluster_support import LocalCluster
from tests.cluster.test_cluster_quarantine_resharding import SHARDS, _late_settlements, _settler
from tests.cluster.test_cluster_read_split import _migrating, _ops, write_refused
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


def _split_reads(otel: Telemetry, scripts: set[str]) -> list[Any]:
    """The script spans of ``scripts`` that a migration refused and whose keys were read
    apart."""
    return [
        span
        for span in otel.spans()
        if (span.attributes or {}).get("db.stored_procedure.name") in scripts
        and "settle.cluster.read_split" in (span.attributes or {})
    ]


#: The calls read apart, by their ``settle.call.name``.
_SPLIT_CALLS = ("get_many", "attempts", "quarantine.list")


def _measured(otel: Telemetry, namespace: str) -> dict[str, int]:
    """How many measurements ``settle.call.duration`` holds of each call of
    :data:`_SPLIT_CALLS` (cumulative: the same calls made before count too)."""
    ns = {"settle.namespace": namespace}
    return {
        name: otel.count("settle.call.duration", **ns, **{"settle.call.name": name})
        for name in _SPLIT_CALLS
    }


def _no_error_anywhere(otel: Telemetry, namespace: str, before: dict[str, int]) -> None:
    """No span of the reads is an error, and no measurement of their calls names one; each
    call read apart is measured once more than ``before`` (the metrics are cumulative: the
    same calls made before the migration must not stand in for those made during it)."""
    for span in otel.spans():
        a = span.attributes or {}
        assert span.status.status_code is StatusCode.UNSET, (span.name, span.status, a)
        assert "error.type" not in a, (span.name, a)
    after = _measured(otel, namespace)
    assert after == {name: count + 1 for name, count in before.items()}, (before, after)
    points = otel.points("settle.call.duration", **{"settle.namespace": namespace})
    assert not [p for p in points if "error.type" in dict(p.attributes)], points


@pytest.mark.asyncio
@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_read_split_by_a_migration_is_no_error_in_traces_or_metrics(
    cluster: LocalCluster, namespace: str, otel: Telemetry, flavour: str
) -> None:
    """A read a migrating slot refuses (TRYAGAIN, or redis-py's ClusterError after its own
    repeats) whose caller reads its keys apart succeeds: its Redis span said ERROR with
    ``error.type`` TRYAGAIN, so a trace-based error rate alerted during every resharding for
    reads that succeeded. The span now names the refusal and the split
    (``settle.cluster.read_split``, and the Redis reply's ``db.response.status_code``), its
    status unset (a handled error is not recorded as one: OpenTelemetry's "Recording
    errors"); the call's span and ``settle.call.duration`` name no error either."""
    keys = Keys(namespace, SHARDS)
    ids = _ops(3)
    _late_settlements(cluster, namespace, 0, 2)
    async with _settler(cluster, flavour, namespace) as s:
        reserved = await s.reserve(ids[0], {"n": 1}, principal="p")
        await s.complete(reserved.reservation, {"done": 1})
        records, log = await s.get_many(ids), await s.attempts(ids[0])
        listed = await s.quarantine.list()
        slot = key_slot(keys.record(ids[0]).encode())
        assert key_slot(keys.quarantine(0).encode()) == slot
        with _migrating(cluster, slot, namespace, []):
            otel.exporter.clear()
            before = _measured(otel, namespace)
            assert await s.get_many(ids) == records
            assert await s.attempts(ids[0]) == log
            assert await s.quarantine.list() == listed
            split = _split_reads(otel, {"get_many", "attempts", "quarantine_read"})
            _no_error_anywhere(otel, namespace, before)
    assert {span.attributes["db.stored_procedure.name"] for span in split} == {
        "get_many",
        "attempts",
        "quarantine_read",
    }
    for span in split:
        a = span.attributes
        assert a["settle.cluster.read_split"] in ("TRYAGAIN", "ClusterError"), a
        if a["settle.cluster.read_split"] == "TRYAGAIN":
            assert a["db.response.status_code"] == "TRYAGAIN", a
        # The split read's own single-key reads are children of the same call's span.
        assert span.parent is not None


def test_a_write_refused_by_a_migration_is_still_an_error(
    cluster: LocalCluster, namespace: str, otel: Telemetry
) -> None:
    """A write is never split: a migration's refusal of it, retried, then raised as
    ``BackendError``, is an error on its Redis span and its call's, and in
    ``settle.call.duration``."""
    with write_refused(cluster, namespace) as refused:
        otel.exporter.clear()
        with pytest.raises(BackendError):
            refused()
    refused = [
        span
        for span in otel.spans()
        if (span.attributes or {}).get("db.stored_procedure.name") == "reserve"
    ]
    assert refused
    for span in refused:
        a = span.attributes or {}
        assert span.status.status_code is StatusCode.ERROR, a
        assert a["error.type"] in ("TRYAGAIN", "ClusterError"), a
        assert "settle.cluster.read_split" not in a, a
    call = otel.span("settle.reserve")
    assert call.status.status_code is StatusCode.ERROR
    points = otel.points(
        "settle.call.duration", **{"settle.namespace": namespace, "settle.call.name": "reserve"}
    )
    assert "BackendError" in {dict(p.attributes).get("error.type") for p in points}, points


def test_a_cursor_read_split_by_a_migration_is_no_error_in_traces(
    cluster: LocalCluster, namespace: str, otel: Telemetry
) -> None:
    """The cursor's inspection (and the progress store's reads: the same runner call) read
    apart during a migration: its refused script span is no error either, and what it reads
    apart is one trace."""
    stream = "orders"
    keys = stream_keys(namespace, stream)
    with CursorStore.from_cluster(cluster.url, namespace=namespace) as store:
        store.start(stream, b"c0")
        before = store.checkpoint(stream)
        with _migrating(cluster, key_slot(keys[0].encode()), namespace, []):
            otel.exporter.clear()
            assert store.checkpoint(stream) == before
    split = [s for s in otel.spans() if "settle.cluster.read_split" in (s.attributes or {})]
    assert split
    for span in otel.spans():
        assert span.status.status_code is StatusCode.UNSET, (span.name, span.attributes)
        assert "error.type" not in (span.attributes or {}), (span.name, span.attributes)
    # Its reads apart (four or more plain commands, each a root span before) are one trace.
    _one_trace_apart(otel)


def _one_trace_apart(otel: Telemetry) -> None:
    """The reads apart of a refused read are one trace, under ``settle.cluster.read_apart``
    naming the refused script; only the refused script's span is a trace of its own."""
    spans = otel.spans()
    refused = [s for s in spans if "settle.cluster.read_split" in (s.attributes or {})]
    apart = [s for s in spans if s.name == "settle.cluster.read_apart"]
    assert refused
    assert len(apart) == len(refused), [s.name for s in spans]
    scripts = {(s.attributes or {}).get("db.stored_procedure.name") for s in refused}
    assert {(s.attributes or {}).get("db.stored_procedure.name") for s in apart} == scripts
    roots = [s for s in spans if s.parent is None]
    assert sorted(s.name for s in roots) == sorted(
        [s.name for s in refused] + ["settle.cluster.read_apart"] * len(apart)
    ), [(s.name, s.parent) for s in spans]
    for span in apart:
        inside = [s for s in spans if s.context.trace_id == span.context.trace_id]
        assert len(inside) > 1  # the plain commands of the reads apart
        assert all(s.status.status_code is StatusCode.UNSET for s in inside)


def test_a_progress_read_apart_is_one_trace(
    cluster: LocalCluster, namespace: str, otel: Telemetry
) -> None:
    """``ProgressStore.read`` apart during a migration: one trace, as the cursor's."""
    scope = ProviderScope("orders", "billing", "inc1")
    with ProgressStore.from_cluster(cluster.url, consumer="c1", namespace=namespace) as store:
        store.apply(scope, DeliveryId("1-1"), EmissionId("e1"), lambda c: None)
        before = store.read(scope)
        slot = key_slot(store.core.keys.scope(scope.scope_id)[0].encode())
        with _migrating(cluster, slot, namespace, []):
            otel.exporter.clear()
            assert store.read(scope) == before
            _one_trace_apart(otel)


def test_an_async_progress_read_apart_is_one_trace(
    cluster: LocalCluster, namespace: str, otel: Telemetry
) -> None:
    """``AsyncProgressStore.read`` apart during a migration: one trace, as on the sync
    runner (the asyncio runner's span was untested: taken out, every test passed)."""
    scope = ProviderScope("orders", "billing", "inc1")

    async def main() -> None:
        async with AsyncProgressStore.from_cluster(
            cluster.url, consumer="c1", namespace=namespace
        ) as store:
            await store.apply(scope, DeliveryId("1-1"), EmissionId("e1"), _nothing)
            before = await store.read(scope)
            slot = key_slot(store.core.keys.scope(scope.scope_id)[0].encode())
            with _migrating(cluster, slot, namespace, []):
                otel.exporter.clear()
                assert await store.read(scope) == before
                _one_trace_apart(otel)

    asyncio.run(main())


async def _nothing(_: object) -> None:
    return None
