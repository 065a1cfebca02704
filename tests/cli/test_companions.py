"""The companion parts' commands hang from the same ``settle`` console script."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import settle


def test_cursor_and_progress_are_settle_subcommands(settle_bin: Path) -> None:
    del settle_bin
    done = settle("--help")
    assert done.returncode == 0
    assert "cursor" in done.stdout
    assert "progress" in done.stdout


def test_cursor_show_reports_an_unknown_stream(
    settle_bin: Path, redis_url: str, namespace: str
) -> None:
    del settle_bin
    done = settle("cursor", "show", "orders", "--redis-url", redis_url, "--namespace", namespace)
    assert done.returncode == 1
    assert "orders" in done.stderr


def test_progress_show_reports_an_unknown_consumer(
    settle_bin: Path, redis_url: str, namespace: str
) -> None:
    del settle_bin
    done = settle("progress", "show", "billing", "--redis-url", redis_url, "--namespace", namespace)
    assert done.returncode == 1
    assert "billing" in done.stderr
