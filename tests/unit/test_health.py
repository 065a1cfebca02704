"""The deployment rules of ``settle._runtime.health`` on replies no test server can produce
(clocks that disagree, a denied INFO); the servers' own replies are judged in
tests/cli/test_doctor.py and tests/faults/test_faults_eviction.py."""

from __future__ import annotations

import pytest

from settle import ConfigurationError
from settle._runtime import health
from settle._runtime.health import Status
from tests.faults.test_faults_eviction import EVICTING


def test_clocks_that_disagree_between_nodes_fail_and_a_slow_round_trip_is_not_skew() -> None:
    now = 1_000_000
    far = health.clock_finding({"a": now, "b": now + 6_000}, now, 1)
    assert far.status is Status.FAIL
    assert "NTP" in far.fix
    near = health.clock_finding({"a": now, "b": now + 800}, now, 1)
    assert near.status is Status.WARN
    slow = health.clock_finding({"a": now, "b": now + 800}, now, 900)
    assert slow.status is Status.OK
    local = health.clock_finding({"a": now + 6_000}, now, 1)
    assert local.status is Status.WARN


def test_every_allkeys_and_volatile_policy_evicts_and_noeviction_does_not() -> None:
    for policy in EVICTING:
        assert health.is_evicting(policy)
        with pytest.raises(ConfigurationError, match=policy):
            health.check_eviction({"n": policy}, allow=False)
        assert health.check_eviction({"n": policy}, allow=True).allowed == (policy,)
    assert not health.is_evicting("noeviction")
    verdict = health.check_eviction({"n": "noeviction", "m": None}, allow=False)
    assert verdict == health.EvictionWarnings(allowed=(), unread=("m",))


def test_a_denied_info_is_a_warning_in_doctor() -> None:
    assert health.eviction_finding({"n": None}).status is Status.WARN
    assert health.persistence_finding({"n": {"aof_enabled": 0}}, {"n": None}).status is (
        Status.WARN
    )


def test_a_primary_whose_replication_is_unread_does_not_hide_a_failure_of_another() -> None:
    unread_and_short = {"a:1": None, "b:2": {"connected_slaves": 0}}
    assert health.replicas_finding(unread_and_short, 1).status is Status.FAIL
    unread_and_fine = {"a:1": None, "b:2": {"connected_slaves": 1}}
    finding = health.replicas_finding(unread_and_fine, 1)
    assert finding.status is Status.WARN
    assert "could not be read on a:1" in finding.detail


def test_a_replica_in_its_first_sync_is_judged_another_server_is_not() -> None:
    mine = {"role": "slave", "master_replid": "p" * 40, "master_link_status": "up"}
    syncing = {"role": "slave", "master_replid": "r" * 40, "master_link_status": "down"}
    others = {"role": "slave", "master_replid": "o" * 40, "master_link_status": "up"}
    assert health.replicates(mine, "p" * 40)
    assert health.replicates(syncing, "p" * 40)
    assert not health.replicates(others, "p" * 40)
    assert not health.replicates({"role": "master", "master_replid": "p" * 40}, "p" * 40)


def test_a_primary_down_says_what_to_do_about_it_and_the_rest_keeps_its_fix() -> None:
    every = {"a:1": [(0, 16383)]}
    down = health.slots_finding(every, {"a:1": "ok"}, ["b:2"])
    assert down.status is Status.FAIL
    assert "primary down (not answering, or flagged failing): b:2" in down.detail
    assert down.fix.startswith("bring the failing primary back, or fail over to its replica")
    unserved = health.slots_finding({"a:1": [(0, 100)]}, {"a:1": "fail"})
    assert unserved.fix.startswith("assign every slot")  # nothing down: not said
