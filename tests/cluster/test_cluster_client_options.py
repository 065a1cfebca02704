"""``from_cluster(..., client_options=...)`` that send reads to replicas.

settle's scripts always ran on primaries (EVALSHA and FCALL are no read commands to
redis-py), but ``read_from_replicas=True`` or a ``load_balancing_strategy`` sent its plain
reads to replicas: the ``EXISTS`` of a namespace's first start (the shards beyond the client's
count, which keep a client with fewer shards from re-creating lost metadata) went to replicas,
over 2,000 of them on a 2-primary cluster, and a replica behind its primary answers an older
state. The options were taken and half honoured; they are now refused with
``ConfigurationError`` before anything is built, in every part's ``from_cluster``."""

from __future__ import annotations

from typing import Any

import pytest
from redis.cluster import LoadBalancingStrategy

from settle import AsyncSettler, ConfigurationError, Settler
from settle.cursor import AsyncCursorStore, CursorStore
from tests.cluster.cluster_support import LocalCluster

pytestmark = [pytest.mark.cluster]

REPLICA_READS: list[dict[str, Any]] = [
    {"read_from_replicas": True},
    {"load_balancing_strategy": LoadBalancingStrategy.ROUND_ROBIN},
    {"load_balancing_strategy": LoadBalancingStrategy.RANDOM_REPLICA},
]


@pytest.mark.parametrize("options", REPLICA_READS, ids=lambda o: "-".join(map(str, o.values())))
@pytest.mark.parametrize("make", [Settler, AsyncSettler, CursorStore, AsyncCursorStore])
def test_from_cluster_refuses_options_that_read_from_replicas(
    cluster: LocalCluster, namespace: str, make: Any, options: dict[str, Any]
) -> None:
    with pytest.raises(ConfigurationError, match="primaries only") as raised:
        make.from_cluster(cluster.url, namespace=namespace, client_options=options)
    assert next(iter(options)) in str(raised.value)


@pytest.mark.parametrize(
    "options",
    [
        {"load_balancing_strategy": None},
        {"read_from_replicas": False},
        {"read_from_replicas": False, "load_balancing_strategy": None},
    ],
    ids=["strategy-none", "replicas-false", "both-off"],
)
def test_from_cluster_takes_reads_from_replicas_turned_off(
    cluster: LocalCluster, namespace: str, options: dict[str, Any]
) -> None:
    with Settler.from_cluster(cluster.url, namespace=namespace, client_options=options) as s:
        assert s.get("nothing-here") is None
