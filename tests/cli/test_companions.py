"""The companion parts' commands hang from the same ``settle`` console script."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def _bad_inputs(command: tuple[str, ...], name: str, redis_url: str) -> list[tuple[str, ...]]:
    return [
        (*command, "", "--redis-url", redis_url),  # an empty name
        (*command, name, "--redis-url", redis_url, "--namespace", "a b"),
        (*command, name, "--redis-url", "redis://127.0.0.1:notaport/0"),
    ]


@pytest.mark.parametrize(
    ("command", "name", "asked"),
    [
        (("cursor", "show"), "orders", "to read the checkpoint of stream 'orders'"),
        (("cursor", "witnesses"), "orders", "to read the witnesses of stream 'orders'"),
        (("progress", "show"), "billing", "to read the progress of consumer 'billing'"),
    ],
)
def test_bad_input_is_a_usage_error_not_a_missing_stream(
    settle_bin: Path, redis_url: str, command: tuple[str, ...], name: str, asked: str
) -> None:
    # Each exited 1 ("no such stream") instead of 2 (usage), as docs/cursor-checkpoints.md
    # and docs/cli.md promise.
    del settle_bin
    for args in _bad_inputs(command, name, redis_url):
        done = settle(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.startswith("settle: "), done.stderr
        assert len(done.stderr.splitlines()) == 1, done.stderr
    unreachable = settle(*command, name, "--redis-url", "redis://127.0.0.1:1/0")
    assert unreachable.returncode == 3, unreachable.stderr
    # It said "Redis failed during witnesses" (the script) for `cursor show`.
    assert unreachable.stderr.startswith(
        f"settle: cannot reach Redis at redis://127.0.0.1:1/0 {asked} (ConnectionError"
    ), unreachable.stderr
