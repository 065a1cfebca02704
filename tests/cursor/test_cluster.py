"""Every cursor script runs unchanged on a real 3-primary Redis Cluster: each stream's keys
share one hash tag, so each call touches one slot, whichever node owns it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from redis.cluster import RedisCluster

from settle.cursor import CursorConsumer, CursorError, CursorStore, ProviderContract
from settle.cursor.models import Disposition
from tests.cluster.cluster_support import LocalCluster
from tests.cursor.conftest import Sink
from tests.cursor.helpers import Crash, drain, truth
from tests.cursor.provider import fetcher
from tests.cursor.test_reset_pruned import fetch

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    running = LocalCluster(primaries=3).start()
    try:
        yield running
    finally:
        running.close()


def test_streams_on_every_primary_run_the_whole_procedure(cluster, serve, namespace) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    store = CursorStore(client, namespace=namespace)
    streams = [f"stream-{i}" for i in range(12)]
    slots = {client.keyslot(f"settle:{{{namespace}:cursor:{s}}}:ckpt") for s in streams}
    owners = {client.nodes_manager.get_node_from_slot(slot).port for slot in slots}
    assert len(owners) == 3  # the streams are spread over every primary
    with httpx.Client() as http:
        for stream in streams:
            server = serve(page_size=2, rotate=True)
            server.provider.append(5)
            store.start(stream, server.provider.token(0).encode())
            sink = Sink()
            fetch = fetcher(server.url, http)
            contract = ProviderContract(rotation_allowed=True)

            def crash(event, ctx):
                raise Crash

            with pytest.raises(Crash):
                CursorConsumer(fetch, crash, contract, store=store, stream=stream).step()
            drain(CursorConsumer(fetch, sink, contract, store=store, stream=stream))
            assert sink.applied() == truth(server.provider)
            ck = store.checkpoint(stream)
            assert ck is not None
            assert ck.boundary == 5
            witnesses = store.witnesses(stream, limit=50)
            dispositions = {w.disposition for w in witnesses if w.reason != "held"}
            assert dispositions == {Disposition.PROMOTED, Disposition.ABANDONED}
            # The final empty page (caught up, no evidence) is on record, pending, unpromoted.
            [held] = [w for w in witnesses if w.reason == "held"]
            assert (held.disposition, held.events, held.generation) == (
                Disposition.PENDING,
                (),
                ck.generation,
            )
    store.close()


def test_a_reset_below_pruned_receipts_is_refused_on_every_primary(cluster, namespace) -> None:
    """The pruned position promote keeps and reset reads is one more field of the
    checkpoint, in the stream's slot, on every primary."""
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    store = CursorStore(client, namespace=namespace, receipt_horizon=3)
    streams = [f"pruned-{i}" for i in range(12)]
    owners = {
        client.nodes_manager.get_node_from_slot(
            client.keyslot(f"settle:{{{namespace}:cursor:{s}}}:ckpt")
        ).port
        for s in streams
    }
    assert len(owners) == 3
    for stream in streams:
        store.start(stream, b"0")
        CursorConsumer(
            fetch, lambda e, ctx: None, ProviderContract(), store=store, stream=stream
        ).run()
        ck = store.checkpoint(stream)
        assert ck is not None
        with pytest.raises(CursorError, match="up to position 6"):
            store.reset(stream, cursor=b"0", boundary=0, expected_generation=ck.generation)
        assert store.checkpoint(stream) == ck
    store.close()
