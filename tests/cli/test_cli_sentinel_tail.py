"""``settle quarantine tail`` behind Sentinel follows a failover: it asked the Sentinels
once, kept the primary named at start, and when that one was killed it ended with exit 3
(or waited on it), so a watcher saw none of the entries written on the promoted replica.
It now runs on the Sentinel-following client: it says on stderr that it lost the primary,
and goes on from where it was once the Sentinels name the new one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from settle import Settler
from tests.cli.helpers import stale_settlement
from tests.cli.test_quarantine_live import _tail
from tests.faults.sentinel_support import SERVICE, sentinel_deployment
from tests.web.test_console_sentinel import fail_over, replicated

pytestmark = pytest.mark.faults


def test_tail_follows_the_quarantine_across_a_failover(settle_bin: Path, namespace: str) -> None:
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
            fail_over(d, "kill")
            with Settler.from_url(d.replica.url, namespace=namespace, shards=2) as promoted:
                after = stale_settlement(promoted, "order-after")
            entry = json.loads(tail.out.get(timeout=60))
            assert entry["ref"] == after
            assert entry["operation_id"] == "order-after"
