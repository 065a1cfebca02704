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
import time
from typing import Any

import pytest
import redis

from settle import AsyncSettler, BackendError, ConfigurationError, Reserved, Settler
from settle._core.keys import Keys
from tests.acl import app_user
from tests.cluster import test_cluster_failover
from tests.cluster.cluster_support import LocalCluster
from tests.cluster.test_cluster_failover import FAILOVER_BOUND, SHARDS, _ops_on, _until
from tests.faults.servers import frozen
from tests.integration.conftest import Awaitable

pytestmark = [pytest.mark.cluster, pytest.mark.faults, pytest.mark.asyncio]

REQ = {"amount": 1000}
WHO = "tenant:acme"
#: The failover tests' fixture: a cluster of 3 primaries with 1 replica each, per test.
replicated = test_cluster_failover.replicated


def _settled_again(cluster: LocalCluster, promoted: int, killed: int = 0) -> bool:
    """The replica is the primary and every live node says the cluster is ok."""
    for index, node in enumerate(cluster.nodes):
        if index == killed:
            continue
        with redis.Redis(port=node.port, socket_timeout=1) as c:
            if index == promoted and c.info("replication")["role"] != "master":
                return False
            if c.cluster("INFO")["cluster_state"] != "ok":
                return False
    return True


def _open(cluster: LocalCluster, namespace: str, flavour: str) -> tuple[Any, Any, Any]:
    """The settler of ``flavour`` (its API awaited in both), its runner, and its close."""
    opts: dict[str, Any] = {"namespace": namespace, "shards": SHARDS}
    if flavour == "sync":
        sync = Settler.from_cluster(cluster.url, **opts)

        async def close() -> None:
            sync.close()

        return Awaitable(sync), sync._runner, close
    api = AsyncSettler.from_cluster(cluster.url, **opts)
    return api, api._runner, api.aclose


async def _until_refused(api: Any, ops: Any) -> tuple[ConfigurationError, str, list[str]]:
    """Reserve ``ops`` one after the other until one is refused: the refusal, the refused
    operation and those that landed before it."""
    landed: list[str] = []
    for op in ops:
        try:
            await api.reserve(op, REQ, principal=WHO)
        except ConfigurationError as exc:
            return exc, op, landed
        except BackendError:  # the failover seen by settle: also evidence
            await asyncio.sleep(0.2)
            continue
        landed.append(op)
    raise AssertionError(f"written on an evicting primary: {landed}")


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_promoted_replica_whose_policy_evicts_is_refused_before_settle_writes_there(
    replicated: LocalCluster, namespace: str, flavour: str
) -> None:
    api, runner, close = _open(replicated, namespace, flavour)
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
        refusal, refused, landed = await _until_refused(api, ops[1:])
        assert f"allkeys-lru on 127.0.0.1:{port}" in str(refusal)
        # Only the call during which redis-py itself followed the failover is sent
        # unchecked; the refused call wrote nothing.
        assert len(landed) <= 1
        with replicated.client(promoted) as c:
            assert c.exists(Keys(namespace, SHARDS).record(refused)) == 0
        # The other primaries' calls go on.
        assert isinstance(await api.reserve(other, REQ, principal=WHO), Reserved)
    finally:
        await close()


def _role(cluster: LocalCluster, index: int) -> str:
    with redis.Redis(port=cluster.nodes[index].port, socket_timeout=1) as c:
        return str(c.info("replication")["role"])


def _take_over(cluster: LocalCluster, index: int) -> None:
    """A manual failover (CLUSTER FAILOVER TAKEOVER, as for maintenance) that makes the
    replica ``index`` the primary; the old primary stays up, a replica of it."""
    with redis.Redis(port=cluster.nodes[index].port, socket_timeout=2) as c:
        _until(lambda: c.info("replication").get("master_link_status") == "up", FAILOVER_BOUND)
        c.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
    _until(lambda: _role(cluster, index) == "master", FAILOVER_BOUND)


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_failback_to_a_primary_made_evicting_while_it_was_a_replica_is_refused(
    replicated: LocalCluster, namespace: str, flavour: str
) -> None:
    """Found in review: a primary read at start-up stayed judged for good. Demoted by a
    failover, made evicting while a replica (a restart with another config, a CONFIG SET),
    then promoted again when the standby died, it took every write until the periodic
    recheck, as a never-read promoted replica did before this branch."""
    api, runner, close = _open(replicated, namespace, flavour)
    ops = iter(_ops_on(0, namespace, 24, "op"))
    try:
        first = next(ops)
        assert isinstance(await api.reserve(first, REQ, principal=WHO), Reserved)
        runner.recheck_interval = 3600.0  # the periodic recheck does not come to the rescue
        standby = replicated.replica_of(0)
        _take_over(replicated, standby)
        await api.get(first)  # answered MOVED: redis-py moves the slot to the standby
        await api.get(first)  # the standby, now the primary, is read and passes
        with replicated.client(0) as c:  # the old primary, a replica now, made evicting
            c.config_set("maxmemory-policy", "allkeys-lru")
        replicated.nodes[standby].stop(kill=True)
        _until(lambda: _settled_again(replicated, 0, killed=standby), FAILOVER_BOUND)
        refusal, _, landed = await _until_refused(api, ops)
        assert f"allkeys-lru on 127.0.0.1:{replicated.nodes[0].port}" in str(refusal)
        assert len(landed) <= 1  # only the call during which redis-py followed the failover
    finally:
        await close()


def _info_refused(cluster: LocalCluster, user: str) -> int:
    """How many times the cluster's nodes refused ``user`` an INFO (their ACL LOG)."""
    refused = 0
    for node in cluster.nodes:
        with redis.Redis(port=node.port, socket_timeout=2) as c:
            for entry in c.acl_log():
                if entry.get("username") == user and entry.get("object") == "info":
                    refused += int(entry.get("count", 1))
    return refused


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_user_refused_info_checks_each_primary_once_not_on_every_call(
    cluster: LocalCluster, namespace: str, flavour: str
) -> None:
    """Found in review: a user whose ACL refuses INFO (its policy then unknown, warned
    about, and the calls go on) asked every other primary its role whenever a call reached
    a primary the checks had not read, was refused, and forgot them all: each call on
    another primary than the last checked its own again and asked the others again,
    forever (two more round trips per call, and a warning each time). A role that cannot
    be read is unknown, as the policy is: the primary stays judged."""
    user = f"noinfo{flavour}"
    urls = [app_user(node, "+@all", "-info", "+info|server", name=user) for node in cluster.nodes]
    for node in cluster.nodes:
        with redis.Redis(port=node.port) as c:
            c.acl_log_reset()
    opts: dict[str, Any] = {"namespace": namespace, "shards": SHARDS}
    try:
        if flavour == "sync":
            sync = Settler.from_cluster(urls[0], **opts)
            api: Any = Awaitable(sync)
            runner, close = sync._runner, sync.close
        else:
            api = AsyncSettler.from_cluster(urls[0], **opts)
            runner, close = api._runner, None
        runner.recheck_interval = 3600.0  # only the checks of primaries never read
        on_0, on_1 = _ops_on(0, namespace, 8, "a"), _ops_on(1, namespace, 8, "b")
        for first, second in zip(on_0[:2], on_1[:2], strict=True):  # each primary read once
            await api.reserve(first, REQ, principal=WHO)
            await api.reserve(second, REQ, principal=WHO)
        settled = _info_refused(cluster, user)
        for first, second in zip(on_0[2:], on_1[2:], strict=True):
            assert isinstance(await api.reserve(first, REQ, principal=WHO), Reserved)
            assert isinstance(await api.reserve(second, REQ, principal=WHO), Reserved)
        assert _info_refused(cluster, user) == settled  # no INFO asked again
        if close is not None:
            close()
        else:
            await api.aclose()
    finally:
        for node in cluster.nodes:
            with redis.Redis(port=node.port) as c:
                c.acl_deluser(user)


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_hung_primary_holds_the_check_of_a_new_primary_up_for_seconds_only(
    cluster: LocalCluster, namespace: str, flavour: str
) -> None:
    """Found in review: the first call on a primary the checks never read (a replica a
    failover promoted, a primary added) asks every other primary read before its role,
    through the cluster client: a hung one that redis-py still lists held that call up for
    the client's 30 s socket timeout and redis-py's retries on it. Each is asked in one try
    of at most 2 s; the hung one is read again before its own next call."""
    api, runner, close = _open(cluster, namespace, flavour)
    ops = _ops_on(1, namespace, 2, "op")
    try:
        for index in range(3):
            assert isinstance(
                await api.reserve(_ops_on(index, namespace, 1, "w")[0], REQ, principal=WHO),
                Reserved,
            )
        runner.recheck_interval = 3600.0
        port = cluster.nodes[1].port
        (name,) = [p.name for p in runner.client.get_primaries() if p.port == port]
        runner._checks.forget(name)  # a primary the checks never read, as an added one
        with frozen(cluster.nodes[2]):
            started = time.monotonic()
            assert isinstance(await api.reserve(ops[0], REQ, principal=WHO), Reserved)
            assert time.monotonic() - started < 10.0
    finally:
        await close()
