"""``settle quarantine tail`` behind Sentinel follows a failover: it asked the Sentinels
once, kept the primary named at start, and when that one was killed it ended with exit 3
(or waited on it), so a watcher saw none of the entries written on the promoted replica.
It now runs on the Sentinel-following client: it says on stderr that it lost the primary,
and goes on from where it was once the Sentinels name the new one."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from settle import Settler
from settle.embedded import EmbeddedRedis
from tests.cli.conftest import cli_env
from tests.cli.helpers import stale_settlement
from tests.cli.test_quarantine_live import _tail
from tests.faults.sentinel_support import SERVICE, sentinel_deployment
from tests.web.test_console_sentinel import fail_over, replicated

pytestmark = pytest.mark.faults


@pytest.mark.parametrize("how", ["kill", "sentinel-failover"])
def test_tail_follows_the_quarantine_across_a_failover(
    settle_bin: Path, namespace: str, how: str
) -> None:
    """The primary the tail reads is killed, or demoted by ``SENTINEL FAILOVER`` (it stays
    up, a replica of the promoted one): an entry written on the promoted replica is
    printed."""
    with (
        sentinel_deployment() as d,
        Settler.from_url(d.primary.url, namespace=namespace, shards=2) as writer,
    ):
        writer.check()
        url = f"redis+sentinel://{d.sentinels[0]}/{SERVICE}"
        with _tail(settle_bin, url, namespace, "--json") as tail:
            before = stale_settlement(writer, "order-before")
            assert json.loads(tail.out.get(timeout=30))["ref"] == before
            replicated(d)
            fail_over(d, how)
            with Settler.from_url(d.replica.url, namespace=namespace, shards=2) as promoted:
                after = stale_settlement(promoted, "order-after")
            entry = json.loads(tail.out.get(timeout=60))
            assert entry["ref"] == after
            assert entry["operation_id"] == "order-after"
    if how == "kill":
        # What it said on stderr: the primary it lost, and the one it follows again.
        lost, _, again = tail.said.partition("settle: following again on ")
        assert f"settle: lost the primary at redis://127.0.0.1:{d.primary.port}/0 (" in lost
        assert again.startswith(f"redis://127.0.0.1:{d.replica.port}/0\n"), tail.said


def test_tail_of_one_server_that_is_killed_ends_with_exit_3(
    settle_bin: Path, namespace: str
) -> None:
    """Without Sentinel nothing names another primary: a tail that lost its server ends
    with exit 3 as it always did, never waiting (for Sentinels there are none of)."""
    with EmbeddedRedis() as server:
        with Settler.from_url(server.url, namespace=namespace, shards=2) as writer:
            writer.check()
        proc = subprocess.Popen(
            [str(settle_bin), "quarantine", "tail", "--interval", "0.1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(SETTLE_REDIS_URL=server.url, SETTLE_NAMESPACE=namespace),
        )
        try:
            assert proc.stderr is not None
            assert proc.stderr.readline().startswith("following the quarantine of ")
            server.stop(kill=True)
            _, said = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 3, said
    assert said.startswith(f"settle: cannot reach Redis at {server.url} "), said
    assert "waiting for the Sentinels" not in said
