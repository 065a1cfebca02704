"""TRYAGAIN's one budget (settle._runtime.transient), which the durable path keeps itself and
redis-py's cluster client keeps on the other path: the same count of sends per try, the
same pauses, for the sync and the asyncio client alike."""

from __future__ import annotations

import pytest
import redis.asyncio.cluster
import redis.cluster

from settle._runtime.transient import TRYAGAIN_PAUSE, TRYAGAIN_SENDS, tryagain_pause


def test_the_budget_is_redis_pys_count_of_sends_for_both_clients() -> None:
    assert redis.cluster.RedisCluster.RedisClusterRequestTTL == TRYAGAIN_SENDS
    assert redis.asyncio.cluster.RedisCluster.RedisClusterRequestTTL == TRYAGAIN_SENDS


def test_a_try_pauses_after_each_refusal_of_its_second_half_then_ends() -> None:
    """redis-py's rule: after the n-th refused send, a pause when fewer than half of the
    sends are left (16 - n < 8), and the try ends after the 16th."""
    pauses = [tryagain_pause(sent) for sent in range(1, TRYAGAIN_SENDS + 1)]
    half = TRYAGAIN_SENDS // 2
    assert pauses == [0.0] * half + [TRYAGAIN_PAUSE] * (half - 1) + [None]


def test_a_try_spends_what_docs_operations_md_says() -> None:
    """redis-py sleeps a fixed 0.05 s (not a name it exports, so settle cannot read it):
    TRYAGAIN_PAUSE must be that, and a try of the durable path pauses 7 times, 0.35 s, so a
    call pauses at most 1.4 s in its 4 tries (docs/operations.md, "`min_replicas`")."""
    pauses = [tryagain_pause(sent) or 0.0 for sent in range(1, TRYAGAIN_SENDS + 1)]
    assert TRYAGAIN_PAUSE == 0.05
    assert sum(pauses) == pytest.approx(0.35)
