"""``settle cursor`` and ``settle progress`` against a redis-server stopped with SIGSTOP: they
had no ``--redis-timeout`` and kept the library's 30 s socket timeout, tried four times, so
each waited about two minutes before exit 3. They take ``--redis-timeout`` /
``SETTLE_REDIS_TIMEOUT`` as every other command does."""

from __future__ import annotations

import time

import pytest

from settle.embedded import EmbeddedRedis
from tests.cli.conftest import cli_env, settle
from tests.cli.helpers import paused


@pytest.mark.parametrize(
    "command",
    [("cursor", "show", "c"), ("cursor", "witnesses", "c"), ("progress", "show", "c")],
)
def test_a_companion_command_ends_promptly_while_redis_is_stopped(
    command: tuple[str, ...],
) -> None:
    with EmbeddedRedis() as server:
        env = cli_env(SETTLE_REDIS_TIMEOUT="0.5")
        with paused(server):
            started = time.monotonic()
            done = settle(*command, "--redis-url", server.url, env=env, timeout=200)
            took = time.monotonic() - started
        assert done.returncode == 3, done.stderr
        assert "cannot reach Redis" in done.stderr
        assert "TimeoutError" in done.stderr
        # a few tries of the bound (the start-up check's), never the library's 30 s each
        assert took < 25, f"took {took:.1f} s"
        again = settle(*command, "--redis-url", server.url, "--redis-timeout", "1", env=env)
        assert again.returncode == 1, again.stderr  # nothing recorded: not found
