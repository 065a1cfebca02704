"""The periodic eviction recheck on a Redis Cluster reads the policy of the primary that
holds a call's key, not of every primary: a hung primary (SIGSTOP, as a GC-paused VM or a
partition hangs it) used to fail every call that made the recheck, once per interval, after
the socket timeout of each try, even calls whose keys live on a healthy primary; and an
evicting policy set at runtime on a primary is still refused before a call writes there."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
from redis.crc import key_slot

from settle import AsyncSettler, BackendError, ConfigurationError, Reserved, Settler, State
from settle._core.keys import Keys
from tests.cluster.cluster_support import SLOTS
from tests.cluster.split_cluster import PRIMARIES, SHARDS, SplitCluster, split_cluster
from tests.integration.conftest import Awaitable

pytestmark = [pytest.mark.cluster, pytest.mark.faults, pytest.mark.asyncio]

#: Short, so a call to the frozen primary fails in seconds (4 tries of 1 s).
_CLIENT = {"socket_timeout": 1.0, "socket_connect_timeout": 1.0}


@pytest.fixture
def split() -> Iterator[SplitCluster]:
    with split_cluster() as running:
        yield running


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest_asyncio.fixture
async def settled(split: SplitCluster, flavour: str) -> AsyncIterator[tuple[Any, Any]]:
    """The settler under test (its methods awaitable) and its runner (white box: the tests
    make the recheck due)."""
    opts: dict[str, Any] = {"namespace": split.namespace, "shards": SHARDS}
    if flavour == "sync":
        s = Settler.from_cluster(split.seeds, client_options=_CLIENT, **opts)
        s.check()  # the start-up checks read every primary: before one is frozen
        yield Awaitable(s), s._runner
        s.close()
    else:
        a = AsyncSettler.from_cluster(split.seeds, client_options=_CLIENT, **opts)
        await a.check()
        yield a, a._runner
        await a.aclose()


def _info_calls(split: SplitCluster, index: int) -> int:
    with split.cluster.client(index) as c:
        stats = c.info("commandstats").get("cmdstat_info", {})
    return int(stats.get("calls", 0))


async def test_a_hung_primary_does_not_fail_the_recheck_of_calls_on_the_others(
    split: SplitCluster, settled: tuple[Any, Any]
) -> None:
    api, runner = settled
    runner.recheck_interval = 0.0  # the interval has passed: every call rechecks
    split.freeze()
    try:
        r = await api.reserve(split.healthy_op, {"n": 1}, principal="p")
        assert isinstance(r, Reserved)
        await api.complete(r.reservation, {"ok": True})
        # A call whose key is on the frozen primary fails (its timeouts are evidence that
        # a server may have restarted: every primary's recheck is due again)...
        with pytest.raises(BackendError):
            await api.get(split.frozen_op)
        # ...and the healthy primary's calls are still served.
        record = await api.get(split.healthy_op)
        assert record is not None
        assert record.state is State.COMPLETED
    finally:
        split.thaw()
    assert await api.get(split.frozen_op) is None


async def test_an_evicting_policy_set_at_runtime_is_refused_on_its_primary_only(
    split: SplitCluster, settled: tuple[Any, Any]
) -> None:
    api, runner = settled
    port = split.cluster.nodes[1].port
    with split.cluster.client(1) as c:  # the primary of healthy_op
        c.config_set("maxmemory-policy", "allkeys-lru")
    runner.recheck_interval = 0.0
    with pytest.raises(ConfigurationError, match=f"allkeys-lru on 127.0.0.1:{port}"):
        await api.reserve(split.healthy_op, {"n": 1}, principal="p")
    with split.cluster.client(1) as c:  # refused before anything was written
        assert c.exists(Keys(split.namespace, SHARDS).record(split.healthy_op)) == 0
    r = await api.reserve(split.frozen_op, {"n": 1}, principal="p")  # primary 0: noeviction
    assert isinstance(r, Reserved)


async def test_a_primary_is_read_once_per_interval_and_the_others_not_at_all(
    split: SplitCluster, settled: tuple[Any, Any]
) -> None:
    api, runner = settled
    runner.recheck_interval = 3600.0
    runner._checks.checked_at -= 3600.0  # the start-up check is an interval old
    before = [_info_calls(split, i) for i in range(3)]
    for _ in range(3):
        await api.get(split.healthy_op)
    # Each node's count also holds the INFO that read ``before``.
    assert [_info_calls(split, i) - before[i] - 1 for i in range(3)] == [0, 1, 0]
    assert runner._due()  # primaries 0 and 2 are still due
    for op in (split.frozen_op, _op_on(split, 2), split.frozen_op, split.healthy_op):
        await api.get(op)
    assert [_info_calls(split, i) - before[i] - 2 for i in range(3)] == [1, 1, 1]
    # Every primary passed: no call looks its primary up again until the oldest recheck
    # is an interval old.
    assert not runner._due()


def _op_on(split: SplitCluster, primary: int) -> str:
    """An operation id of the namespace whose record lives on ``primary``."""
    keys = Keys(split.namespace, SHARDS)
    for i in range(10_000):
        op = f"elsewhere-{i}"
        slot = key_slot(keys.record(op).encode())
        if min(slot // (SLOTS // PRIMARIES), PRIMARIES - 1) == primary:
            return op
    raise AssertionError(f"no operation id on primary {primary}")


def _age(runner: Any, seconds: float) -> None:
    """Every primary's last recheck ``seconds`` older (white box: time passing)."""
    with runner._checks.lock:
        for name, (evidence, at) in list(runner._checks.nodes.items()):
            runner._checks.nodes[name] = (evidence, at - seconds)


def _set_policy(split: SplitCluster, index: int, policy: str) -> None:
    with split.cluster.client(index) as c:
        c.config_set("maxmemory-policy", policy)


async def test_a_primary_that_passed_is_read_again_once_its_recheck_is_an_interval_old(
    split: SplitCluster, settled: tuple[Any, Any]
) -> None:
    """A primary's policy changed to an evicting one after its last recheck is refused by
    the first call there once that recheck is ``recheck_interval`` old, as on a single
    server: a primary that passed once is not exempt from the periodic recheck."""
    api, runner = settled
    runner.recheck_interval = 3600.0
    runner._checks.checked_at -= 3600.0
    await api.get(split.healthy_op)  # primary 1 passes its recheck
    _set_policy(split, 1, "allkeys-lru")
    _age(runner, 3600.0)  # an interval later
    with pytest.raises(ConfigurationError, match="allkeys-lru"):
        await api.reserve(split.healthy_op, {"n": 1}, principal="p")


async def test_evidence_of_a_restart_rechecks_a_primary_that_passed_within_the_interval(
    split: SplitCluster, settled: tuple[Any, Any]
) -> None:
    """A dropped connection is evidence that a server may have restarted (with another
    configuration): the primary's policy is read again before anything more is sent there
    (docs/operations.md), even when it passed a recheck moments before."""
    api, runner = settled
    runner.recheck_interval = 3600.0
    runner._checks.checked_at -= 3600.0
    await api.get(split.healthy_op)  # primary 1 passes its recheck
    _set_policy(split, 1, "allkeys-lru")  # it restarted as a cache
    runner.dropped()  # what a ConnectionError on the way reports
    with pytest.raises(ConfigurationError, match="allkeys-lru"):
        await api.reserve(split.healthy_op, {"n": 1}, principal="p")


async def test_once_every_primary_passed_the_oldest_recheck_sets_when_the_next_is_due(
    split: SplitCluster, settled: tuple[Any, Any]
) -> None:
    """Primaries rechecked at different times: the checks are due again when the oldest
    recheck is an interval old, not the newest (a primary would go unread for up to two
    intervals)."""
    api, runner = settled
    runner.recheck_interval = 3600.0
    runner._checks.checked_at -= 3600.0
    await api.get(split.frozen_op)  # primary 0 first...
    _age(runner, 3599.0)  # ...3599 s ago
    await api.get(_op_on(split, 2))
    await api.get(split.healthy_op)  # every primary passed
    _set_policy(split, 0, "allkeys-lru")
    await asyncio.sleep(1.1)  # primary 0's recheck is an interval old
    with pytest.raises(ConfigurationError, match="allkeys-lru"):
        await api.reserve(split.frozen_op, {"n": 1}, principal="p")
