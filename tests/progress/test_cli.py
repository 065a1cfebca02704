"""``progress show CONSUMER``: tables and --json, read from a real progress server."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from settle.cli.progress import progress
from settle.progress import DeliveryId, EmissionId, ProgressStore, ProviderScope
from tests.progress.harness import ROOT


def seed(url: str, consumer: str) -> ProviderScope:
    scope = ProviderScope("orders", "billing", "inc1")
    store = ProgressStore.from_url(url, consumer=consumer, namespace="t")
    for n in (1, 3, 4):
        store.apply(scope, DeliveryId(f"7-{n}"), EmissionId(f"e{n}"), lambda ctx: None)
    store.observe(
        scope,
        None,
        [DeliveryId(f"7-{n}") for n in (1, 2, 3, 4)],
        last_delivered=DeliveryId("7-4"),
        oldest_pending=DeliveryId("7-2"),
        pending=1,
    )
    store.close()
    return scope


def test_show_json(progress_server, names):
    seed(progress_server.url, names.consumer)
    result = CliRunner().invoke(
        progress,
        ["show", names.consumer, "--redis-url", progress_server.url, "--namespace", "t", "--json"],
    )
    assert result.exit_code == 0, result.output
    [p] = json.loads(result.output)
    assert p["floor"] == "7-1"
    assert p["applied_above_floor"] == ["7-3", "7-4"]
    assert p["gaps"] == ["7-2"]
    assert p["provider_floor"]["last_delivered"] == "7-4"
    assert p["provider_floor"]["oldest_pending"] == "7-2"
    assert p["replay_from"] == "7-1"
    assert [i["delivery"] for i in p["intents"]] == ["7-1", "7-3", "7-4"]


def test_show_tables_as_a_module(progress_server, names):
    seed(progress_server.url, names.consumer)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "settle.cli.progress",
            "show",
            names.consumer,
            "--redis-url",
            progress_server.url,
            "--namespace",
            "t",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    ).stdout
    assert "floor" in out
    assert "7-1" in out
    assert "gaps" in out
    assert "7-2" in out
    assert "provider floor" in out
    assert "last delivered 7-4" in out


def test_show_unknown_consumer_and_unreachable_server(progress_server):
    # The exit codes of the main settle CLI: 1 not found, 3 Redis unavailable.
    missing = CliRunner().invoke(progress, ["show", "nobody", "--redis-url", progress_server.url])
    assert missing.exit_code == 1
    assert "no progress recorded" in missing.output
    bad = CliRunner().invoke(progress, ["show", "x", "--redis-url", "redis://127.0.0.1:1/0"])
    assert bad.exit_code == 3
    assert "cannot reach Redis at redis://127.0.0.1:1/0 to read the progress of consumer 'x'" in (
        bad.output
    )
