"""Eviction on Redis Cluster: every node's ``maxmemory-policy`` is read, so one evicting
primary among healthy ones is refused by name (issue 20, item 1), and so is an evicting
replica (a failover makes it the primary, with its own policy)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
from structlog.testing import capture_logs

from settle import AsyncSettler, ConfigurationError, Reserved, Settler
from settle._core.keys import Keys, shard_of
from tests.cli.helpers import stale_settlement
from tests.cluster.cluster_support import LocalCluster, primary_of
from tests.stopwatch import Stopwatch
from tests.web.server import settle_web

pytestmark = [pytest.mark.cluster]


def test_one_evicting_primary_is_refused_by_name(cluster: LocalCluster, namespace: str) -> None:
    with cluster.client(2) as c:
        c.config_set("maxmemory-policy", "volatile-ttl")
    try:
        s = Settler.from_cluster(cluster.url, namespace=namespace, shards=4)
        with pytest.raises(ConfigurationError) as info:
            s.check()
        s.close()
        assert "volatile-ttl" in str(info.value)
        assert f"127.0.0.1:{cluster.nodes[2].port}" in str(info.value)

        async def main() -> None:
            a = AsyncSettler.from_cluster(
                cluster.startup_nodes, namespace=namespace, shards=4, allow_eviction=True
            )
            try:
                with capture_logs() as logs:
                    r = await a.reserve("op-1", {"n": 1}, principal="p")
                assert isinstance(r, Reserved)
                warned = [e for e in logs if e["event"] == "settle.backend.eviction_allowed"]
                assert [e["policy"] for e in warned] == ["volatile-ttl"]
            finally:
                await a.aclose()

        asyncio.run(main())
    finally:
        with cluster.client(2) as c:
            c.config_set("maxmemory-policy", "noeviction")


@pytest.fixture(scope="module")
def replicated() -> Iterator[LocalCluster]:
    running = LocalCluster(primaries=2, replicas=1).start()
    # Every node's CLUSTER SLOTS names the replicas (gossip may lag the replication link):
    # the client learns its topology from them.
    deadline = time.monotonic() + 20
    for index in range(len(running.nodes)):
        with running.client(index) as c:
            # Each entry: low, high, the primary, then its replicas.
            while sum(len(e) - 3 for e in c.execute_command("CLUSTER SLOTS")) < 2:
                assert time.monotonic() < deadline, "the replicas never showed in CLUSTER SLOTS"
                time.sleep(0.05)
    try:
        yield running
    finally:
        running.close()


@pytest.mark.faults
def test_an_evicting_replica_is_refused_by_name(replicated: LocalCluster, namespace: str) -> None:
    replica = replicated.replica_of(1)
    with replicated.client(replica) as c:
        c.config_set("maxmemory-policy", "allkeys-lfu")
    try:
        s = Settler.from_cluster(replicated.url, namespace=namespace, shards=4)
        with pytest.raises(ConfigurationError) as info:
            s.check()
        s.close()
        assert f"allkeys-lfu on 127.0.0.1:{replicated.nodes[replica].port}" in str(info.value)

        async def main() -> None:
            seeds = replicated.startup_nodes
            async with AsyncSettler.from_cluster(seeds, namespace=namespace, shards=4) as a:
                await a.reserve("op-1", {"n": 1}, principal="p")

        with pytest.raises(ConfigurationError, match="allkeys-lfu on"):
            asyncio.run(main())
    finally:
        with replicated.client(replica) as c:
            c.config_set("maxmemory-policy", "noeviction")
    with Settler.from_cluster(replicated.url, namespace=namespace, shards=4) as s:
        assert isinstance(s.reserve("op-1", {"n": 1}, principal="p"), Reserved)


def test_the_read_only_console_names_one_evicting_primary(
    cluster: LocalCluster, namespace: str
) -> None:
    """``settle web`` without a token serves a cluster one of whose primaries evicts (it was
    refused), and every page names that primary's policy: the banner reads each primary's
    ``INFO memory``, not the seed's alone (node 0 here, which does not evict)."""
    with Settler.from_cluster(cluster.url, namespace=namespace, shards=4) as writer:
        writer.reserve("op-1", {"n": 1}, principal="p")
    with cluster.client(2) as c:
        c.config_set("maxmemory-policy", "volatile-ttl")
    try:
        with settle_web("--redis-url", cluster.url, "--namespace", namespace) as url:
            page = httpx.get(url + "/", timeout=30)
        assert page.status_code == 200, page.text
        assert "maxmemory-policy volatile-ttl evicts" in page.text
    finally:
        with cluster.client(2) as c:
            c.config_set("maxmemory-policy", "noeviction")


def test_the_read_only_console_serves_an_entry_while_another_primary_hangs(
    cluster: LocalCluster, namespace: str
) -> None:
    """A hung primary (SIGSTOP) holds up only the pages that read its slots: an entry whose
    keys are on another primary loads, as the settler's calls on the healthy primaries are
    served. The policy banner must not make every page wait for every primary."""
    with Settler.from_cluster(cluster.url, namespace=namespace, shards=4) as writer:
        ref = stale_settlement(writer, "order-1")
    tag = Keys(namespace, 4).tag(shard_of("order-1", 4))
    home = primary_of(tag, cluster.primaries)
    hung = 2 if home != 2 else 1
    timeout = ("--redis-timeout", "3")
    with settle_web("--redis-url", cluster.url, "--namespace", namespace, *timeout) as url:
        assert httpx.get(url + f"/entry/{ref}", timeout=30).status_code == 200  # checked
        with cluster.frozen(hung):
            page = httpx.get(url + f"/entry/{ref}", timeout=30)
    assert page.status_code == 200, page.text
    assert "order-1" in page.text


@pytest.mark.asyncio
async def test_a_console_page_never_waits_for_the_banners_read_of_a_hung_primary(
    cluster: LocalCluster, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the first page read the policies, a read due while a primary hangs goes on in
    its own task: the page of an entry on another primary loads at once, not after
    ``redis_timeout`` as a 503."""
    from settle.web import _policy, create_app  # noqa: PLC0415
    from tests.web.conftest import client_for  # noqa: PLC0415

    monkeypatch.setattr(_policy, "READ_EVERY", 0.0)  # a read due before every page
    with Settler.from_cluster(cluster.url, namespace=namespace, shards=4) as writer:
        ref = stale_settlement(writer, "order-1")
    home = primary_of(Keys(namespace, 4).tag(shard_of("order-1", 4)), cluster.primaries)
    hung = 2 if home != 2 else 1
    seeds = [f"{host}:{port}" for host, port in cluster.startup_nodes]
    reader = AsyncSettler.from_cluster(seeds, namespace=namespace, shards=4, allow_eviction=True)
    try:
        async with client_for(create_app(reader, redis_timeout=3)) as browser:
            assert (await browser.get(f"/entry/{ref}")).status_code == 200
            with cluster.frozen(hung):
                clock = Stopwatch()  # in this thread: the app runs on this event loop
                page = await browser.get(f"/entry/{ref}")
                waited = clock.unloaded()  # not the time a loaded worker held it off a CPU
                await asyncio.sleep(3.5)  # the banner's read ends, its primary unanswered
            assert page.status_code == 200, page.text
            assert waited < 2, waited
    finally:
        await reader.aclose()


@pytest.mark.asyncio
async def test_the_console_names_the_primary_whose_policy_it_cannot_read(
    cluster: LocalCluster, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console's user is denied INFO on one primary only (each node keeps its own
    ACL): every page names that primary as the one whose policy could not be read, and
    still names the evicting policy another primary was read to have. Allowed INFO there,
    the next read drops it from the banner."""
    from settle.web import _policy, create_app  # noqa: PLC0415
    from tests.web.conftest import client_for  # noqa: PLC0415

    monkeypatch.setattr(_policy, "READ_EVERY", 0.0)  # a read due before every page
    # The test before this one froze a primary: the others may still mark it failed
    cluster.wait_ok()
    with Settler.from_cluster(cluster.url, namespace=namespace, shards=4) as writer:
        ref = stale_settlement(writer, "order-1")
    host, port = cluster.startup_nodes[1]
    for index in range(cluster.primaries):
        with cluster.client(index) as c:
            rules = ["on", ">pw", "~*", "&*", "+@all"] + (["-info"] if index == 1 else [])
            c.execute_command("ACL", "SETUSER", "console", "reset", *rules)
    with cluster.client(2) as c:
        c.config_set("maxmemory-policy", "volatile-ttl")
    h0, p0 = cluster.startup_nodes[0]
    reader = AsyncSettler.from_url(
        f"redis://console:pw@{h0}:{p0}", namespace=namespace, shards=4, allow_eviction=True
    )
    try:
        async with client_for(create_app(reader._reading())) as browser:
            denied = [await browser.get("/"), await browser.get(f"/entry/{ref}")]
            with cluster.client(1) as c:
                c.execute_command("ACL", "SETUSER", "console", "+info")
            for _ in range(2):  # the read in flight (denied), then one sent after
                await browser.get("/quarantine")
                await asyncio.sleep(0.3)
            read = await browser.get("/")
    finally:
        await reader.aclose()
        for index in range(cluster.primaries):
            with cluster.client(index) as c:
                c.execute_command("ACL", "DELUSER", "console")
        with cluster.client(2) as c:
            c.config_set("maxmemory-policy", "noeviction")
    for page in denied:
        assert page.status_code == 200, page.text
        assert f"maxmemory-policy of primary {host}:{port} (INFO" in page.text, page.text
        assert "maxmemory-policy volatile-ttl evicts" in page.text
    assert read.status_code == 200, read.text
    assert "could not read" not in read.text
    assert "maxmemory-policy volatile-ttl evicts" in read.text
