"""Redis Sentinel (issue 20, item 6): ``from_sentinel`` connects to the primary a real Sentinel
names. With ``min_replicas=1`` a completed record survives the primary's SIGKILL and the
settler follows the promoted replica; with ``min_replicas=0`` a completion the replica had
not received is lost in the failover (the documented loss window, docs/operations.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from settle import (
    AsyncSettler,
    BackendError,
    DurabilityError,
    Replay,
    Reserved,
    Settler,
    State,
    Verdict,
)
from settle.cursor import CursorStore
from settle.embedded import EmbeddedRedis
from tests.cancelling import lost_cancellations
from tests.faults.sentinel_support import (
    SERVICE,
    SentinelDeployment,
    acknowledges,
    sentinel_deployment,
)

pytestmark = [pytest.mark.faults]

REQ = {"amount": 1000}
WHO = "tenant:acme"


class Deployment(SentinelDeployment):
    def fail_over(self) -> float:
        """SIGKILL the primary; seconds until the Sentinel names the replica."""
        self.primary.stop(kill=True)
        killed = time.monotonic()
        self.sentinel.wait(lambda: self.sentinel.switched_to(self.replica.port), "failover")
        with redis.Redis(port=self.replica.port) as c:
            deadline = time.monotonic() + 10
            while c.info("replication")["role"] != "master" and time.monotonic() < deadline:
                time.sleep(0.05)
        return time.monotonic() - killed


def _synced(primary: EmbeddedRedis) -> bool:
    return acknowledges(primary)


@pytest.fixture
def deployment() -> Iterator[Deployment]:
    with sentinel_deployment() as running:
        yield Deployment(running.primary, running.replica, running.sentinel, running.link)


def test_min_replicas_keeps_an_acknowledged_completion_across_a_sentinel_failover(
    deployment: Deployment, namespace: str, figures: dict[str, str]
) -> None:
    s = Settler.from_sentinel(
        deployment.sentinels, service_name=SERVICE, namespace=namespace, shards=4, min_replicas=1
    )
    r = s.reserve("op-1", REQ, principal=WHO)
    assert isinstance(r, Reserved)
    assert s.complete(r.reservation, {"charge": "ch_1"}).verdict is Verdict.ACCEPTED
    took = deployment.fail_over()
    figures["Sentinel failover (down-after 1 s): kill to promoted"] = f"{took:.1f} s"
    # The settler follows the promoted replica: the acknowledged completion is there.
    started = time.monotonic()
    record = None
    while record is None and time.monotonic() - started < 10:
        try:
            record = s.get("op-1")
        except BackendError:
            time.sleep(0.1)
    assert record is not None
    assert record.state is State.COMPLETED
    # The promoted node has no replica yet: a new transition is not acknowledged, and says so.
    with pytest.raises(DurabilityError):
        s.reserve("op-2", REQ, principal=WHO)
    # The killed primary comes back; Sentinel makes it the replica of the promoted one.
    deployment.primary.start()
    deployment.sentinel.wait(lambda: _synced(deployment.replica), "old primary rejoined")
    replay = s.reserve("op-1", REQ, principal=WHO)
    assert isinstance(replay, Replay)
    assert replay.value() == {"charge": "ch_1"}
    s.close()


def test_without_min_replicas_a_failover_can_lose_a_completion(
    deployment: Deployment, namespace: str, figures: dict[str, str]
) -> None:
    async def main() -> None:
        a = AsyncSettler.from_sentinel(
            deployment.sentinels, service_name=SERVICE, namespace=namespace, shards=4
        )
        safe = AsyncSettler.from_sentinel(
            deployment.sentinels,
            service_name=SERVICE,
            namespace=namespace,
            shards=4,
            min_replicas=1,
            replica_timeout=0.3,
        )
        await safe.check()
        # A short lease: once the completion is lost, the next retry takes the record over.
        held = {
            op: await a.reserve(op, REQ, principal=WHO, lease=1.0) for op in ("lost", "uncertain")
        }
        assert _synced(deployment.primary)
        deployment.link.close()  # the replica stops receiving writes
        lost, uncertain = held["lost"], held["uncertain"]
        assert isinstance(lost, Reserved)
        assert isinstance(uncertain, Reserved)
        # Acknowledged by the primary alone: the caller is told the charge is settled.
        assert (await a.complete(lost.reservation, {"charge": "ch_1"})).verdict is (
            Verdict.ACCEPTED
        )
        # With min_replicas=1 the same write is not acknowledged, and the caller knows it.
        with pytest.raises(DurabilityError):
            await safe.complete(uncertain.reservation, {"charge": "ch_2"})
        deployment.fail_over()
        started = time.monotonic()
        again = None
        while again is None and time.monotonic() - started < 10:
            try:
                again = await a.reserve("lost", REQ, principal=WHO)
            except BackendError:
                await asyncio.sleep(0.1)
        # The completion is gone (the replica had only the reservation): once its lease has
        # run out, a retry reserves again and would charge twice.
        assert isinstance(again, Reserved)
        assert again.takeover == "lease_expired"
        assert again.reservation.generation > lost.reservation.generation
        figures["Sentinel failover, min_replicas=0, replica behind"] = (
            "the accepted completion was lost (reserve again)"
        )
        await a.aclose()
        await safe.aclose()

    asyncio.run(main())


def test_every_facade_connects_through_sentinel(deployment: Deployment, namespace: str) -> None:
    with CursorStore.from_sentinel(
        deployment.sentinels, service_name=SERVICE, namespace=namespace, min_replicas=1
    ) as store:
        checkpoint = store.start("orders", b"c0")
        assert checkpoint.cursor == b"c0"
        port = store.client.connection_pool.get_master_address()[1]
        assert port == deployment.primary.port


def test_the_example_in_operations_md_connects(deployment: Deployment) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = text[text.index("### Redis Sentinel") :]
    start = section.index("```python\n") + len("```python\n")
    block = section[start : section.index("\n```", start)]
    given = 'sentinels = ["10.0.0.7:26379", "10.0.0.8:26379", "10.0.0.9:26379"]'
    assert given in block
    scope: dict[str, Any] = {}
    exec(block.replace(given, f"sentinels = {deployment.sentinels!r}"), scope)
    settler = scope["settler"]
    try:
        r = settler.reserve("doc-op", REQ, principal=WHO)
        assert isinstance(r, Reserved)
        assert settler.client.connection_pool.get_master_address()[1] == deployment.primary.port
    finally:
        settler.close()


def test_a_task_calling_a_sentinel_settler_stops_when_cancelled(
    deployment: Deployment, namespace: str
) -> None:
    """Python 3.11: redis-py's sends lost most cancellations (tests/integration/
    test_cancellation.py); the Sentinel-managed connections and the Sentinels' own clients
    keep them too."""

    async def main() -> None:
        a = AsyncSettler.from_sentinel(
            deployment.sentinels, service_name=SERVICE, namespace=namespace, shards=4
        )
        try:
            await a.get("cancel-warm")
            assert await lost_cancellations(lambda: a.get("cancel-op")) == 0
            # what each new connection asks the Sentinels first (after a failover, say)
            pool = a.client.connection_pool
            assert await lost_cancellations(pool.get_master_address) == 0
            assert await lost_cancellations(lambda: a.quarantine.list(limit=5)) == 0
        finally:
            await a.aclose()

    asyncio.run(main())
