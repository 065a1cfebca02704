"""``min_replicas`` on a Redis Cluster during a resharding: each write runs with its WAIT on one
connection (WAIT counts that connection's writes), to the node that holds the call's keys.

While a slot migrates, the slot is still the migrating node's: it answers ASK for a key it no
longer holds, and a topology read names it again. The runner read the topology again on ASK
as on MOVED, three times, and raised BackendError ("kept moving the slot"): a Settler with
``min_replicas`` whose namespace metadata was being resharded could not reserve, and a
settlement of a migrating slot failed at once. It now sends ASKING, the script and WAIT to
the importing node in one pipeline; MOVED still reads the topology again. A script some of
whose keys are missing on the importing node is refused there with TRYAGAIN (Redis
Cluster's rule for a split slot): transient, repeated by the call's own retries."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis
from redis.crc import key_slot
from structlog.testing import capture_logs

from settle import (
    AsyncSettler,
    BackendError,
    ConfigurationError,
    DurabilityError,
    Reserved,
    Settler,
    State,
    Verdict,
)
from settle._core.engine import FINGERPRINT_VERSION
from settle._core.keys import Keys
from settle._core.layout import unpack
from settle._core.scripts import SCRIPTS
from settle._runtime import Call, Durability
from settle._runtime._sync import Runner, cluster_client
from settle._runtime.scripts import wait_probe_key
from settle._runtime.transient import ATTEMPTS, TRYAGAIN_PAUSE, TRYAGAIN_SENDS
from settle._sessions import SCRIPTS as SESSIONS
from settle.config import MAX_SHARDS
from tests.acl import app_user
from tests.cluster.cluster_support import LocalCluster
from tests.integration.conftest import Awaitable

pytestmark = [pytest.mark.cluster, pytest.mark.faults, pytest.mark.asyncio]

REQ = {"amount": 1000}
WHO = "tenant:acme"
RESULT = {"ok": True}
SHARDS = 4
#: How long a replica may take to learn from the cluster bus that its primary now serves a
#: slot (it redirects reads of that slot until then); a bound for a loaded machine.
GOSSIP_BOUND = 10.0


@pytest.fixture(scope="module")
def replicated() -> Iterator[LocalCluster]:
    """2 primaries with a replica each. Tests move slots: each works in its own namespace
    and asks the cluster which primary serves a slot."""
    running = LocalCluster(primaries=2, replicas=1).start()
    try:
        yield running
    finally:
        running.close()


@asynccontextmanager
async def _settler(
    cluster: LocalCluster, flavour: str, namespace: str, url: str = "", **options: Any
) -> AsyncIterator[Any]:
    """A settler of ``flavour`` on the cluster (the sync one's methods awaitable), as the
    user of ``url`` if given."""
    options = {"namespace": namespace, "shards": SHARDS, **options}
    if flavour == "sync":
        s = Settler.from_cluster(url or cluster.url, **options)
        try:
            yield Awaitable(s)
        finally:
            s.close()
    else:
        a = AsyncSettler.from_cluster(url or cluster.startup_nodes[:2], **options)
        try:
            yield a
        finally:
            await a.aclose()


def _namespace(prefix: str) -> str:
    """A namespace whose metadata key has a slot of its own: none of its shards' keys share
    it, nor the state keys beyond its shard count (up to MAX_SHARDS) that a first start reads
    with EXISTS (two or more of those in a migrating slot is another case, its own test)."""
    for i in range(1000):
        keys = Keys(f"{prefix}m{i}", SHARDS)
        shards = {key_slot(keys.generation(shard).encode()) for shard in range(MAX_SHARDS)}
        if key_slot(keys.meta.encode()) not in shards:
            return keys.namespace
    raise AssertionError("no namespace found")  # pragma: no cover


def _record_on_replica(cluster: LocalCluster, primary: int, key: str) -> dict[bytes, Any]:
    """The record ``key`` as the replica of ``primary`` holds it, read once the replica
    knows its primary serves the key's slot."""
    index = cluster.replica_of(primary)
    deadline = time.monotonic() + GOSSIP_BOUND
    with redis.Redis(port=cluster.nodes[index].port, single_connection_client=True) as replica:
        replica.execute_command("READONLY")  # let a cluster replica answer reads itself
        while True:
            try:
                stored = replica.get(key)
                break
            except redis.exceptions.MovedError:
                assert time.monotonic() < deadline, f"the replica still redirects {key}"
                time.sleep(0.1)
    assert stored is not None
    record = unpack(stored).record
    assert record is not None
    return record


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("created", ["before", "during"])
async def test_a_durable_call_runs_on_the_importing_node_of_its_migrating_slot(
    replicated: LocalCluster, namespace: str, flavour: str, created: str
) -> None:
    """The namespace metadata's slot migrates, its key (if any yet) already on the importing
    node: a Settler with ``min_replicas`` checks (and, first used, creates) the metadata
    there, then reserves and completes. The metadata is on the importing node and its
    replica alone when the call returns, and a settler made after the migration ended
    finds it. Raised BackendError before, for a namespace created before or during the
    move."""
    ns = _namespace(namespace)
    meta = Keys(ns, SHARDS).meta
    slot = key_slot(meta.encode())
    source = replicated.serving(slot)
    target = 1 - source
    if created == "before":
        async with _settler(replicated, "sync", ns) as first:
            assert isinstance(await first.reserve("before", REQ, principal=WHO), Reserved)
    moved = replicated.migrate(slot, source, target)
    assert moved == ([meta] if created == "before" else [])
    async with _settler(replicated, flavour, ns, min_replicas=1) as s:
        r = await s.reserve("during", REQ, principal=WHO)
        assert isinstance(r, Reserved)
        held = {i: _of(ns, replicated.keys_in_slot(i, slot)) for i in range(len(replicated.nodes))}
        # Creating the metadata waited: the probe after the script (its ASKING too) wrote
        # on the importing node as well, and left no key there (wait_probe.lua). Checking
        # metadata that is there writes nothing and sends no WAIT (Call.reads_only).
        assert held == {
            source: [],
            replicated.replica_of(source): [],
            target: [meta],
            replicated.replica_of(target): [meta],
        }
        assert (await s.complete(r.reservation, RESULT)).verdict is Verdict.ACCEPTED
    replicated.migrated(slot, target)
    async with _settler(replicated, flavour, ns, min_replicas=1) as later:
        record = await later.get("during")
        assert record is not None
        assert record.state is State.COMPLETED
    # The metadata found, with the shard count it was created for: another count is refused.
    async with _settler(replicated, "sync", ns, shards=SHARDS + 1) as other:
        with pytest.raises(ConfigurationError, match="created for 4 shards"):
            await other.reserve("other", REQ, principal=WHO)


async def test_a_script_whose_probe_key_moved_ahead_of_what_it_read_is_a_durability_error(
    replicated: LocalCluster, namespace: str
) -> None:
    """A migration that has moved the slot's probe key (``settle:{<tag>}:wait``) and not yet
    the key a writing script reads: the script runs on the migrating node, which holds its
    key, writes nothing there (the namespace metadata is as it expects), and its probe is
    answered with ASK (a key that node no longer holds). WAIT would then cover the
    connection's earlier writes only, not what the script read: the call raises
    DurabilityError saying the slot is moving. Once the slot has moved, the same call is
    acknowledged. (The runner's rule for any writing script; the settler sends this check
    without WAIT. A record's slot cannot show it: its scripts' keys that do not exist make
    the migrating node answer TRYAGAIN first.)"""
    ns = _namespace(namespace)
    meta = Keys(ns, SHARDS).meta
    probe = wait_probe_key(meta)
    slot = key_slot(meta.encode())
    source = replicated.serving(slot)
    target = 1 - source
    durability = Durability(min_replicas=1, replica_timeout=0.3)
    runner = Runner(cluster_client(replicated.url, None), SCRIPTS, durability)
    try:
        create = Call("namespace", (meta,), (SHARDS, FINGERPRINT_VERSION, "1"))
        check = Call("namespace", (meta,), (SHARDS, FINGERPRINT_VERSION, "0"))
        assert runner.run(create)[0] == b"ok"
        assert _of(ns, replicated.keys_in_slot(source, slot)) == sorted([meta, probe])
        replicated.start_migrating(slot, source, target)
        replicated.move_keys(source, target, [probe])
        with capture_logs() as logs, pytest.raises(DurabilityError, match="slot is moving"):
            runner.run(check)
        refused = [e for e in logs if e["event"] == "settle.backend.durability_failed"]
        assert [(e["script"], e["probe_refused"]) for e in refused] == [("namespace", "AskError")]
        assert replicated.migrate(slot, source, target) == [meta]
        replicated.migrated(slot, target)
        assert runner.run(check)[0] == b"ok"
    finally:
        runner.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize(("min_replicas", "refusal"), [(1, "TryAgainError"), (0, "ClusterError")])
async def test_a_durable_settlement_waits_out_the_migration_of_its_slot(
    replicated: LocalCluster, namespace: str, flavour: str, min_replicas: int, refusal: str
) -> None:
    """The record's slot migrates, its keys on the importing node: the settlement follows
    ASK there, where Redis refuses it with TRYAGAIN (the script's keys that do not exist yet
    count as not moved); the migration ends before the repeat, which the old node answers
    with MOVED. Settled once, on the node that now serves the slot. Raised BackendError
    before, at the first ASK, without a repeat.

    Without ``min_replicas`` the same: redis-py follows ASK and repeats TRYAGAIN itself, 16
    times in about 0.1 s, then raises ClusterError ("TTL exhausted"), which settle repeats
    like TRYAGAIN (nothing ran). It raised BackendError at once, unrepeated."""
    ns = _namespace(namespace)
    record_key = Keys(ns, SHARDS).record("op")
    slot = key_slot(record_key.encode())
    source = replicated.serving(slot)
    target = 1 - source
    ended: list[str] = []

    def end_the_migration(_: Any, __: str, event: MutableMapping[str, Any]) -> Any:
        """At the call's first repeat after TRYAGAIN, the resharding gives the slot to the
        importing node (as redis-cli's does once it has moved the keys)."""
        if event["event"] == "settle.backend.retrying" and not ended:
            ended.append(event["error"])
            replicated.migrated(slot, target)
        return event

    async with _settler(replicated, flavour, ns, min_replicas=min_replicas) as s:
        r = await s.reserve("op", REQ, principal=WHO)
        assert isinstance(r, Reserved)
        assert record_key in replicated.migrate(slot, source, target)
        with capture_logs(processors=[end_the_migration]) as logs:
            settled = await s.complete(r.reservation, RESULT)
        assert settled.verdict is Verdict.ACCEPTED
        assert ended == [refusal]
        assert not [e for e in logs if e["event"] == "settle.backend.failed"]
    assert _of(ns, replicated.keys_in_slot(source, slot)) == []
    if min_replicas:  # acknowledged by the replica when the call returned
        assert _record_on_replica(replicated, target, record_key)[b"state"] == b"completed"
    async with _settler(replicated, flavour, ns) as later:
        record = await later.get("op")
        assert record is not None
        assert record.state is State.COMPLETED
        attempts = await later.attempts("op")
        assert [(a.action, a.verdict) for a in attempts if a.action == "complete"] == [
            ("complete", "accepted")
        ]


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_durable_settlement_follows_its_slot_to_the_node_it_moved_to(
    replicated: LocalCluster, namespace: str, flavour: str
) -> None:
    """The record's slot moved after the runner last read the topology: the old node
    answers MOVED, the runner reads the topology again and settles on the new node (the
    write and its WAIT there)."""
    ns = _namespace(namespace)
    record_key = Keys(ns, SHARDS).record("op")
    slot = key_slot(record_key.encode())
    source = replicated.serving(slot)
    target = 1 - source
    async with _settler(replicated, flavour, ns, min_replicas=1) as s:
        r = await s.reserve("op", REQ, principal=WHO)
        assert isinstance(r, Reserved)
        assert record_key in replicated.migrate(slot, source, target)
        replicated.migrated(slot, target)
        assert (await s.complete(r.reservation, RESULT)).verdict is Verdict.ACCEPTED
        record = await s.get("op")
        assert record is not None
        assert record.state is State.COMPLETED
    assert _of(ns, replicated.keys_in_slot(source, slot)) == []
    assert _record_on_replica(replicated, target, record_key)[b"state"] == b"completed"


def _namespace_sharing_a_slot(prefix: str) -> tuple[str, int]:
    """A namespace and a slot that holds two or more of the state keys beyond its shard
    count, and none of the keys it uses (its metadata, its shards')."""
    for i in range(1000):
        keys = Keys(f"{prefix}b{i}", SHARDS)
        used = {key_slot(keys.meta.encode())}
        used |= {key_slot(keys.generation(shard).encode()) for shard in range(SHARDS)}
        beyond = Counter(
            key_slot(keys.generation(shard).encode()) for shard in range(SHARDS, MAX_SHARDS)
        )
        shared = [slot for slot, n in beyond.items() if n >= 2 and slot not in used]
        if shared:
            return keys.namespace, shared[0]
    raise AssertionError("no namespace found")  # pragma: no cover


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("min_replicas", [0, 1])
async def test_a_new_namespace_starts_while_a_slot_of_its_unused_shards_migrates(
    replicated: LocalCluster, namespace: str, flavour: str, min_replicas: int
) -> None:
    """A namespace's first start asks whether any shard state beyond its shard count exists
    (EXISTS of up to 4,092 keys, on hundreds of slots): during a resharding, one of those
    slots migrates. redis-py sent the keys of one slot in one EXISTS; the importing node
    refuses several keys it does not hold with TRYAGAIN until the slot has moved, and the
    first start raised BackendError ("TTL exhausted"), with or without ``min_replicas``.
    One EXISTS per key is served there after ASK."""
    ns, slot = _namespace_sharing_a_slot(namespace)
    source = replicated.serving(slot)
    target = 1 - source
    replicated.migrate(slot, source, target)
    try:
        async with _settler(replicated, flavour, ns, min_replicas=min_replicas) as s:
            r = await s.reserve("op", REQ, principal=WHO)
            assert isinstance(r, Reserved)
            assert (await s.complete(r.reservation, RESULT)).verdict is Verdict.ACCEPTED
    finally:
        replicated.migrated(slot, target)


def _replica_gone(cluster: LocalCluster, primary: int) -> None:
    """Wait until ``primary`` no longer lists its (stopped) replica."""
    deadline = time.monotonic() + GOSSIP_BOUND
    with cluster.client(primary) as c:
        while c.info("replication")["connected_slaves"]:
            assert time.monotonic() < deadline, "the primary still lists its replica"
            time.sleep(0.02)


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_durable_write_on_the_importing_node_waits_for_that_nodes_replica(
    replicated: LocalCluster, namespace: str, flavour: str
) -> None:
    """WAIT counts the replicas of the node that ran the write: after ASK, the importing
    node's, not the migrating node's. With the importing node's replica stopped, the first
    call (the namespace metadata's check, on the importing node after ASK) raises
    DurabilityError, 0 of 1: the migrating node's replica, up all along, is not counted for
    it. Once the replica is back, the settler carries on."""
    ns = _namespace(namespace)
    meta = Keys(ns, SHARDS).meta
    slot = key_slot(meta.encode())
    source = replicated.serving(slot)
    target = 1 - source
    assert _of(ns, replicated.migrate(slot, source, target)) == []
    replica = replicated.nodes[replicated.replica_of(target)]
    try:
        replica.stop(kill=True)
        try:
            _replica_gone(replicated, target)
            async with _settler(replicated, flavour, ns, min_replicas=1, replica_timeout=0.3) as s:
                with pytest.raises(DurabilityError) as info:
                    await s.reserve("op", REQ, principal=WHO)
                assert (info.value.acknowledged, info.value.required) == (0, 1)
            assert _of(ns, replicated.keys_in_slot(source, slot)) == []
        finally:
            replica.start()  # same port and nodes.conf: it rejoins as the target's replica
            replicated.wait_ok()
        async with _settler(replicated, flavour, ns, min_replicas=1) as s:
            assert isinstance(await s.reserve("op", REQ, principal=WHO), Reserved)
    finally:
        replicated.migrated(slot, target)


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_new_namespace_counts_the_states_beyond_its_count_on_an_importing_node(
    replicated: LocalCluster, namespace: str, flavour: str
) -> None:
    """A namespace used with 16 shards lost its metadata and the states of shards 0-3; a
    client configured with 4 finds the other states with EXISTS, one of them on the
    importing node of its migrating slot (served after ASK), and refuses to create the
    metadata, naming how many survive. Nothing is written."""
    ns = _namespace(namespace)
    sixteen = Keys(ns, 16)
    async with _settler(replicated, "sync", ns, shards=16) as s:
        assert isinstance(await s.reserve("op", REQ, principal=WHO), Reserved)
    with redis.RedisCluster(host="127.0.0.1", port=replicated.nodes[0].port) as raw:
        raw.delete(sixteen.meta, *(sixteen.generation(shard) for shard in range(SHARDS)))
        beyond = [sixteen.generation(shard) for shard in range(SHARDS, 16)]
        surviving = sum(raw.exists(key) for key in beyond)
    assert surviving >= 2
    slot = key_slot(beyond[0].encode())
    source = replicated.serving(slot)
    target = 1 - source
    assert beyond[0] in replicated.migrate(slot, source, target)
    try:
        async with _settler(replicated, flavour, ns) as four:
            with pytest.raises(ConfigurationError, match=f"and {surviving} shard state"):
                await four.reserve("new", REQ, principal=WHO)
    finally:
        replicated.migrated(slot, target)
    meta_slot = key_slot(sixteen.meta.encode())
    assert [_of(ns, replicated.keys_in_slot(i, meta_slot)) for i in range(2)] == [[], []]


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_cluster_user_whose_acl_refuses_exists_still_starts_a_new_namespace(
    replicated: LocalCluster, namespace: str, flavour: str
) -> None:
    """The cluster's EXISTS per key, pipelined: a user whose ACL refuses EXISTS still starts
    a new namespace, the check skipped with one warning (as on a single server)."""
    user = f"noexists{flavour}"
    urls = [app_user(node, "+@all", "-exists", name=user) for node in replicated.nodes]
    url = urls[0]  # the user is on every node: a cluster client reaches them all
    try:
        with capture_logs() as logs:
            if flavour == "sync":
                with Settler.from_cluster(url, namespace=namespace, shards=SHARDS) as s:
                    assert isinstance(s.reserve("op", REQ, principal=WHO), Reserved)
            else:
                async with AsyncSettler.from_cluster(url, namespace=namespace, shards=SHARDS) as a:
                    assert isinstance(await a.reserve("op", REQ, principal=WHO), Reserved)
        skipped = [e for e in logs if e["event"] == "settle.namespace.beyond_unchecked"]
        assert [e["reason"] for e in skipped] == ["EXISTS refused by the ACL"]
    finally:
        for node in replicated.nodes:
            with redis.Redis(port=node.port) as c:
                c.acl_deluser(user)


def _of(ns: str, keys: list[str]) -> list[str]:
    """The keys of namespace ``ns`` among ``keys``: a slot also holds the keys earlier tests
    on this cluster left in it (other namespaces' keys share slots with this one's)."""
    return [key for key in keys if key.startswith((f"settle:{{{ns}}}", f"settle:{{{ns}:"))]


def _slot_contents(cluster: LocalCluster, index: int, slot: int) -> dict[str, bytes | None]:
    """Every key of ``slot`` on node ``index`` and its DUMP (ASKING before each read: the
    node may be importing the slot, which it redirects otherwise)."""
    contents: dict[str, bytes | None] = {}
    with redis.Redis(port=cluster.nodes[index].port, single_connection_client=True) as c:
        for key in cluster.keys_in_slot(index, slot):
            c.execute_command("ASKING")
            contents[key] = c.dump(key)
    return contents


@pytest.mark.parametrize("durable", [{"min_replicas": 1}, {}], ids=["durable", "plain"])
@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_durable_settlement_by_a_user_refused_asking_raises_the_refusal(
    replicated: LocalCluster, namespace: str, flavour: str, durable: dict[str, int]
) -> None:
    """A user whose ACL refuses ASKING settles a record whose slot migrates: the importing
    node answers ASKING with NOPERM, and the script after it with MOVED (it ran nothing).
    The runner dropped ASKING's reply, went round ASK and MOVED until its tries ran out and
    raised BackendError ("kept moving the slot"), which reads as a cluster fault. It raises
    the refusal, a ConfigurationError naming ASKING, as for any NOPERM; nothing is written
    on the importing node. Without min_replicas redis-py's cluster client follows ASK and
    sends ASKING itself: its refusal is the same error (either path needs ASKING, which
    the ACL list of docs/operations.md names)."""
    ns = _namespace(namespace)
    record_key = Keys(ns, SHARDS).record("op")
    slot = key_slot(record_key.encode())
    source = replicated.serving(slot)
    target = 1 - source
    user = f"noasking{flavour}{len(durable)}"
    urls = [app_user(node, "+@all", "-asking", name=user) for node in replicated.nodes]
    url = urls[0]  # the user is on every node: a cluster client reaches them all
    try:
        async with _settler(replicated, flavour, ns, url=url, **durable) as s:
            r = await s.reserve("op", REQ, principal=WHO)  # no slot migrates yet
            assert isinstance(r, Reserved)
            assert record_key in replicated.migrate(slot, source, target)
            before = _slot_contents(replicated, target, slot)
            with pytest.raises(ConfigurationError) as info:
                await s.complete(r.reservation, RESULT)
        message = str(info.value)
        assert "'asking'" in message.lower()
        assert "NoPermissionError" in message
        assert "kept moving" not in message
        assert _slot_contents(replicated, target, slot) == before
        assert _of(ns, replicated.keys_in_slot(source, slot)) == []
    finally:
        replicated.migrated(slot, target)
        for node in replicated.nodes:
            with redis.Redis(port=node.port) as c:
                c.acl_deluser(user)
    async with _settler(replicated, flavour, ns) as later:
        record = await later.get("op")
        assert record is not None
        assert record.state is State.PENDING


def _tryagains(cluster: LocalCluster, index: int) -> int:
    """How many TRYAGAIN refusals node ``index`` has answered (``INFO errorstats``)."""
    with cluster.client(index) as node:
        stats = node.info("errorstats").get("errorstat_TRYAGAIN", {})
    return int(stats.get("count", 0))


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("min_replicas", [0, 1])
async def test_a_slot_that_stays_split_gets_the_same_tryagain_budget_on_either_path(
    replicated: LocalCluster, namespace: str, flavour: str, min_replicas: int
) -> None:
    """A settlement whose slot stays split between two nodes (a migration held: the record
    moved, the attempt log not) is refused with TRYAGAIN on every send. Without
    ``min_replicas`` redis-py sends it up to 16 times a try, pausing 0.05 s from the ninth,
    and settle makes 4 tries; the durable path sent it once a try: 4 sends in ~0.3 s, where
    the other path waits ~1 s and more for the migration to end. Both keep one budget now
    (settle._runtime.transient: TRYAGAIN_SENDS sends a try, TRYAGAIN_PAUSE, ATTEMPTS tries)
    and raise BackendError at its end, nothing written."""
    ns = _namespace(namespace)
    record_key = Keys(ns, SHARDS).record("op")
    slot = key_slot(record_key.encode())
    source = replicated.serving(slot)
    target = 1 - source
    async with _settler(replicated, flavour, ns, min_replicas=min_replicas) as s:
        r = await s.reserve("op", REQ, principal=WHO)
        assert isinstance(r, Reserved)
        assert record_key in replicated.migrate(slot, source, target)
        try:
            before = _tryagains(replicated, target)
            started = time.monotonic()
            with capture_logs() as logs, pytest.raises(BackendError, match="after 4 tries"):
                await s.complete(r.reservation, RESULT)
            took = time.monotonic() - started
            refused = _tryagains(replicated, target) - before
        finally:
            replicated.migrated(slot, target)
        retries = [e for e in logs if e["event"] == "settle.backend.retrying"]
        assert [e["attempt"] for e in retries] == list(range(1, ATTEMPTS))
        # Every send of every try was refused, within the budget; the durable path spends
        # all of it (it stays on the importing node), redis-py spends part of it on the
        # redirections around each TRYAGAIN (MOVED back to the slot's owner, then ASK).
        assert ATTEMPTS < refused <= ATTEMPTS * TRYAGAIN_SENDS
        if min_replicas:
            assert refused == ATTEMPTS * TRYAGAIN_SENDS
            assert took >= ATTEMPTS * (TRYAGAIN_SENDS // 2 - 1) * TRYAGAIN_PAUSE
        record = await s.get("op")
        assert record is not None
        assert record.state is State.PENDING


def _replicas_gone(cluster: LocalCluster, index: int) -> None:
    """Wait until primary ``index`` has no replica connected (one was killed)."""
    deadline = time.monotonic() + GOSSIP_BOUND
    while True:
        with cluster.client(index) as node:
            if not int(node.info("replication")["connected_slaves"]):
                return
        assert time.monotonic() < deadline, "the killed replica is still connected"
        time.sleep(0.05)


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_split_slot_with_too_few_replicas_connected_costs_one_wait_a_try(
    namespace: str, flavour: str
) -> None:
    """A send refused with TRYAGAIN still runs the WAIT of its pipeline, which, with the
    importing node's replica gone, waits ``replica_timeout``. The durable path sent the call
    again up to 16 times a try, each send waiting it: with ``replica_timeout=0.5`` a
    settlement whose slot stayed split took 35 s to raise BackendError (64 waits; 64 s and
    more at the default 1 s) where it took 2 s before TRYAGAIN had a budget. A refused send
    whose WAIT came back short ends its try now: one wait a try, BackendError after the 4
    tries, nothing written."""
    timeout = 0.5
    cluster = LocalCluster(primaries=2, replicas=1).start()
    try:
        ns = _namespace(namespace)
        record_key = Keys(ns, SHARDS).record("op")
        slot = key_slot(record_key.encode())
        source = cluster.serving(slot)
        target = 1 - source
        durable = {"min_replicas": 1, "replica_timeout": timeout}
        async with _settler(cluster, flavour, ns, **durable) as s:
            r = await s.reserve("op", REQ, principal=WHO)
            assert isinstance(r, Reserved)
            cluster.nodes[cluster.replica_of(target)].stop(kill=True)
            _replicas_gone(cluster, target)
            assert record_key in cluster.migrate(slot, source, target)
            before = _tryagains(cluster, target)
            started = time.monotonic()
            with pytest.raises(BackendError, match="after 4 tries"):
                await s.complete(r.reservation, RESULT)
            took = time.monotonic() - started
            assert _tryagains(cluster, target) - before == ATTEMPTS  # one send a try
            assert took < TRYAGAIN_SENDS * timeout  # 64 sends took 32 s and more
            record = await s.get("op")
            assert record is not None
            assert record.state is State.PENDING
    finally:
        cluster.close()


async def test_a_probe_refused_on_the_importing_node_is_a_durability_error(
    replicated: LocalCluster, namespace: str
) -> None:
    """ASK: the script runs on the importing node and the probe after it (behind its own
    ASKING) is refused there, by an ACL without PEXPIRE. The call raises DurabilityError
    naming the refusal, as on a node that serves its slot: the reply after the script's is
    the second ASKING's OK, and taking that for the probe's acknowledged a script whose
    reads no WAIT covered."""
    ns = _namespace(namespace)
    meta = Keys(ns, SHARDS).meta
    slot = key_slot(meta.encode())
    source = replicated.serving(slot)
    target = 1 - source
    durability = Durability(min_replicas=1, replica_timeout=0.3)
    user = "nopexpire"
    urls = [app_user(node, "+@all", "-pexpire", name=user) for node in replicated.nodes]
    admin = Runner(cluster_client(replicated.url, None), SCRIPTS, durability)
    runner = Runner(cluster_client(urls[0], None), SCRIPTS, durability)
    try:
        assert admin.run(Call("namespace", (meta,), (SHARDS, FINGERPRINT_VERSION, "1")))[0] == b"ok"
        assert meta in replicated.migrate(slot, source, target)  # ASK for it from now on
        check = Call("namespace", (meta,), (SHARDS, FINGERPRINT_VERSION, "0"))
        with capture_logs() as logs, pytest.raises(DurabilityError, match="was refused") as info:
            runner.run(check)
        assert (info.value.acknowledged, info.value.required) == (0, 1)
        refused = [e for e in logs if e["event"] == "settle.backend.durability_failed"]
        assert [(e["script"], e["probe_refused"]) for e in refused] == [
            ("namespace", "ResponseError")
        ]
        assert _of(ns, replicated.keys_in_slot(source, slot)) == []  # it ran on the importing node
    finally:
        replicated.migrated(slot, target)
        runner.close()
        admin.close()
        for node in replicated.nodes:
            with redis.Redis(port=node.port) as c:
                c.acl_deluser(user)


async def test_a_probe_behind_asking_leaves_no_key_the_migrating_node_still_holds(
    replicated: LocalCluster, namespace: str
) -> None:
    """A slot migrates while its probe key (``settle:{<tag>}:wait``) is still on the
    migrating node, and a durable call whose keys do not exist there yet runs on the
    importing node (ASK; here the console's first epoch of a namespace). Its probe, behind
    ASKING, wrote the key there too: both nodes held it, and the resharding tool's MIGRATE
    of the migrating node's keys (without REPLACE) failed with BUSYKEY. The probe behind
    ASKING now writes and deletes a missing key: the call is acknowledged, the importing
    node holds only the call's key, and the keys move."""
    ns = _namespace(namespace)
    keys = Keys(ns, SHARDS)
    meta, probe = keys.meta, wait_probe_key(keys.meta)
    slot = key_slot(meta.encode())
    source = replicated.serving(slot)
    target = 1 - source
    durability = Durability(min_replicas=1, replica_timeout=0.3)
    core = Runner(cluster_client(replicated.url, None), SCRIPTS, durability)
    sessions = Runner(cluster_client(replicated.url, None), SESSIONS, durability)
    try:
        assert core.run(Call("namespace", (meta,), (SHARDS, FINGERPRINT_VERSION, "1")))[0] == b"ok"
        assert _of(ns, replicated.keys_in_slot(source, slot)) == sorted([meta, probe])
        replicated.start_migrating(slot, source, target)
        renew = Call("epoch_renew", (keys.console_epochs,), ("d" * 64, "epoch-1"))
        assert sessions.run(renew) == [b"renewed"]
        assert _of(ns, replicated.keys_in_slot(target, slot)) == [keys.console_epochs]
        assert _of(ns, replicated.migrate(slot, source, target)) == sorted([meta, probe])
        replicated.migrated(slot, target)
        assert _of(ns, replicated.keys_in_slot(source, slot)) == []
    finally:
        core.close()
        sessions.close()
