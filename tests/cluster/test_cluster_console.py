"""The console's reads on the Redis Cluster of ``conftest.py``, where a namespace's shards
live on several nodes: ``get_many`` (one call per shard, on its slot's node), the overview's
record counts (SCAN on every primary, then batched reads)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from redis.crc import key_slot

from settle import AsyncSettler, Reserved, Settler
from settle._core.keys import Keys
from settle.web import _query
from tests.cluster.cluster_support import LocalCluster
from tests.integration.test_get_many import test_get_many_answers_what_get_answers_for_each_id

pytestmark = [pytest.mark.cluster, pytest.mark.asyncio]

__all__ = ["test_get_many_answers_what_get_answers_for_each_id"]

SCRIPTS = ("evalsha", "evalsha_ro", "eval", "eval_ro", "fcall", "fcall_ro")


@pytest.fixture
def namespace(cluster: LocalCluster) -> str:
    """A fresh namespace whose 4 (and 16) shards live on more than one node."""
    while True:
        candidate = f"t{uuid.uuid4().hex[:12]}"
        if all(len(_nodes_of(cluster, candidate, n)) > 1 for n in (4, 16)):
            return candidate


@pytest.fixture
def shards() -> int:
    return 4  # the overview test asks for 16 too


@pytest.fixture
def writer(cluster: LocalCluster, namespace: str, shards: int) -> Iterator[Settler]:
    s = Settler.from_url(cluster.url, namespace=namespace, shards=shards)
    s.check()
    yield s
    s.close()


@pytest_asyncio.fixture
async def reader(
    cluster: LocalCluster, namespace: str, shards: int, writer: Settler
) -> AsyncIterator[AsyncSettler]:
    del writer  # the namespace exists before the console opens it
    seeds = [f"{host}:{port}" for host, port in cluster.startup_nodes]
    a = AsyncSettler.from_cluster(seeds, namespace=namespace, shards=shards)
    await a.check()
    yield a
    await a.aclose()


def _nodes_of(cluster: LocalCluster, namespace: str, shards: int) -> set[int]:
    """The primaries (their ports) that hold the namespace's shards."""
    with cluster.client(0) as c:
        owners = [
            (int(low), int(high), int(primary[1]))
            for low, high, primary, *_ in c.execute_command("CLUSTER SLOTS")
        ]
    slots = [key_slot(Keys(namespace, shards).tag(s).encode()) for s in range(shards)]
    return {port for slot in slots for low, high, port in owners if low <= slot <= high}


def _script_calls(cluster: LocalCluster) -> int:
    total = 0
    for index in range(len(cluster.startup_nodes)):
        with cluster.client(index) as c:
            stats = c.info("commandstats")
        total += sum(int(stats.get(f"cmdstat_{n}", {}).get("calls", 0)) for n in SCRIPTS)
    return total


@pytest.mark.parametrize("shards", [4, 16])
async def test_the_overview_counts_records_on_every_node_in_few_calls(
    cluster: LocalCluster, writer: Settler, reader: AsyncSettler, namespace: str, shards: int
) -> None:
    assert len(_nodes_of(cluster, namespace, shards)) > 1  # the shards span nodes
    ops = [f"order-{i}" for i in range(200)]
    for i, op in enumerate(ops):
        r = writer.reserve(op, {"n": i}, principal="tenant:acme", lease=30)
        assert isinstance(r, Reserved)
        if i % 3 == 1:
            writer.complete(r.reservation, {"charge_id": f"ch_{i}"})
        elif i % 3 == 2:
            writer.fail(r.reservation, RuntimeError("declined"))
    truth = Counter({"pending": 0, "provisional": 0, "completed": 0, "failed": 0})
    for op in ops:
        record = writer.get(op)
        assert record is not None
        truth[record.state.value] += 1

    before = _script_calls(cluster)
    data = await _query.overview(
        reader,
        window="1h",
        now=await _query.server_now(reader),
        record_limit=10_000,
        entry_limit=100,
    )
    calls = _script_calls(cluster) - before
    assert data.records == dict(truth)
    assert not data.records_capped
    # A get_many and a quarantine read per shard: it was one call per record (200 and more).
    assert calls <= 2 * shards, calls

    capped = await _query.overview(
        reader, window="1h", now=await _query.server_now(reader), record_limit=50, entry_limit=1
    )
    assert capped.records_capped
    assert sum(capped.records.values()) == 50


async def test_console_sessions_start_resolve_and_end_on_a_cluster(
    writer: Settler, reader: AsyncSettler, namespace: str
) -> None:
    """The sessions' keys carry the namespace's hash tag: a sign-in, a resolve and
    end_sessions run on the cluster client, each on the one node of that slot."""
    from settle.web import create_app, end_sessions  # noqa: PLC0415
    from tests.web.conftest import client_for  # noqa: PLC0415
    from tests.web.evidence import stale_settlement  # noqa: PLC0415
    from tests.web.test_console_http import csrf_of  # noqa: PLC0415

    ref = stale_settlement(writer, "order-on-cluster")
    app = create_app(reader, authorize=lambda token: "ana" if token == "t0k" else None)
    async with client_for(app) as browser:
        form = (await browser.get("/signin")).text
        signed = await browser.post("/signin", data={"token": "t0k", "csrf": csrf_of(form)})
        assert signed.status_code == 303
        page = (await browser.get(f"/entry/{ref}")).text
        assert "signed in as ana" in page
        await end_sessions(reader, "ana")
        data = {"note": "refunded", "csrf": csrf_of(page)}
        assert (await browser.post(f"/entry/{ref}/resolve", data=data)).status_code == 403
        form = (await browser.get("/signin")).text
        signed = await browser.post("/signin", data={"token": "t0k", "csrf": csrf_of(form)})
        assert signed.status_code == 303
        page = (await browser.get(f"/entry/{ref}")).text
        data = {"note": "refunded", "csrf": csrf_of(page)}
        assert (await browser.post(f"/entry/{ref}/resolve", data=data)).status_code == 303
    resolution = writer.quarantine.get(ref).resolution
    assert resolution is not None
    assert resolution.note == "[resolved by ana] refunded"


async def test_a_console_on_a_node_url_whose_first_call_is_a_sign_in(
    cluster: LocalCluster, writer: Settler, namespace: str
) -> None:
    """A settler made with one cluster node's URL, whose first call is the console's (a
    sign-in, before any page read a record): the settler checks the server first and
    becomes the cluster client its console's session scripts run on, one client that its
    ``aclose`` closes (a companion that switched to a cluster client of its own left that
    one's connections open after it), the sign-in, the overview and ``end_sessions``
    served."""
    from settle.web import create_app, end_sessions  # noqa: PLC0415
    from tests.web.conftest import client_for  # noqa: PLC0415
    from tests.web.test_console_http import csrf_of  # noqa: PLC0415

    del writer  # the namespace exists
    before = _connections(cluster)
    settler = AsyncSettler.from_url(cluster.url, namespace=namespace, shards=4)
    try:
        app = create_app(settler, authorize=lambda token: "ana" if token == "t0k" else None)
        async with client_for(app) as browser:
            form = (await browser.get("/signin")).text
            signed = await browser.post("/signin", data={"token": "t0k", "csrf": csrf_of(form)})
            assert signed.status_code == 303
            assert "signed in as ana" in (await browser.get("/")).text
            await end_sessions(settler, "ana")
            assert "signed in as" not in (await browser.get("/")).text
    finally:
        await settler.aclose()
    for _ in range(100):  # up to 5 s for the servers to read the closed sockets
        if _connections(cluster) == before:
            break
        await asyncio.sleep(0.05)
    assert _connections(cluster) == before


def _connections(cluster: LocalCluster) -> int:
    """The clients connected to the cluster's nodes, less the ones counting them."""
    total = 0
    for index in range(len(cluster.nodes)):
        with cluster.client(index) as c:
            total += len(c.client_list()) - 1
    return total
