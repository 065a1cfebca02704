"""``settle quarantine trim``: explicit retention through the console script. Resolved entries
go; unresolved evidence stays unless --include-unresolved (with --before) says otherwise."""

from __future__ import annotations

import time
from pathlib import Path

from settle import Settler
from tests.cli.conftest import cli_env, settle, settle_json
from tests.cli.helpers import stale_settlement


def test_trim_removes_resolved_entries_and_keeps_unresolved_evidence(
    settle_bin: Path, cli_settler: Settler, redis_url: str, namespace: str
) -> None:
    del settle_bin
    env = cli_env(SETTLE_REDIS_URL=redis_url, SETTLE_NAMESPACE=namespace)
    resolved = stale_settlement(cli_settler, "order-resolved")
    kept = stale_settlement(cli_settler, "order-kept")
    cli_settler.quarantine.resolve(resolved, note="refunded")

    refused = settle("quarantine", "trim", env=env)
    assert refused.returncode == 2
    assert "--resolved" in refused.stderr
    refused = settle("quarantine", "trim", "--include-unresolved", env=env)
    assert refused.returncode == 2
    assert "--before" in refused.stderr

    # Nothing is old enough yet: nothing goes.
    assert settle_json("quarantine", "trim", "--resolved", "--before", "1d", env=env) == {
        "removed": 0,
        "unresolved": 0,
    }
    done = settle("quarantine", "trim", "--resolved", env=env)
    assert done.returncode == 0, done.stderr
    assert "deleted 1 entries (0 of them unresolved)" in done.stdout
    left = settle_json("quarantine", "ls", env=env)
    assert [e["id"] for e in left] == [kept.rpartition("/")[2]]
    time.sleep(1.1)  # the kept entry is now older than 1s
    # Unresolved evidence goes only when the operator says so, past a horizon.
    assert settle_json("quarantine", "trim", "--before", "1s", "--include-unresolved", env=env) == {
        "removed": 1,
        "unresolved": 1,
    }
    assert settle_json("quarantine", "ls", env=env) == []
