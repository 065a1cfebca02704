"""``settle quarantine ls`` (and every command) against a redis-server stopped with SIGSTOP
(connections open, no answer, as in a network partition): it waited out redis-py's 30 s
socket timeout four times, over two minutes, before exit 3. ``--redis-timeout`` /
``SETTLE_REDIS_TIMEOUT`` (5 s by default) bounds each reply; the command then exits 3
promptly saying Redis cannot be reached, and works again after SIGCONT."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from settle import Settler
from settle._runtime._sync import client_from_url
from settle.cli._context import bounded
from settle.embedded import EmbeddedRedis
from tests.cli.conftest import cli_env, settle


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    s = EmbeddedRedis().start()
    try:
        with Settler.from_url(s.url, namespace="paused", shards=2) as writer:
            writer.check()
        yield s
    finally:
        if s.process is not None:
            os.kill(s.process.pid, signal.SIGCONT)
        s.close()


@pytest.mark.parametrize("how", ["option", "environment"])
def test_quarantine_ls_ends_promptly_while_redis_is_stopped(
    server: EmbeddedRedis, how: str
) -> None:
    assert server.process is not None
    env = cli_env(SETTLE_REDIS_URL=server.url, SETTLE_NAMESPACE="paused")
    args = ["quarantine", "ls"]
    if how == "option":
        args += ["--redis-timeout", "1"]
    else:
        env["SETTLE_REDIS_TIMEOUT"] = "1"
    # The same command against the running server: what starting the CLI and its answer
    # cost on this machine now (seconds under a loaded machine, not counted as waiting).
    started = time.monotonic()
    assert settle(*args, env=env, timeout=200).returncode == 0
    baseline = time.monotonic() - started
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        done = settle(*args, env=env, timeout=200)
        took = time.monotonic() - started
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    assert done.returncode == 3, done.stderr
    assert "cannot reach Redis" in done.stderr
    assert "Traceback" not in done.stderr
    # Settle tries its start-up check a few times: about 4 x the bound of 1 s, never minutes,
    # nor 4 x the default 5 s (the bound ignored), on top of what the command costs anyway.
    assert took < 8 + 2 * baseline, f"took {took:.1f} s (the command alone {baseline:.1f} s)"
    again = settle(*args, env=env)
    assert again.returncode == 0, again.stderr


def test_a_bad_redis_timeout_is_a_usage_error(server: EmbeddedRedis) -> None:
    env = cli_env(SETTLE_REDIS_URL=server.url, SETTLE_NAMESPACE="paused")
    for bad in ("0", "-1", "nan", "301", "soon"):
        done = settle("quarantine", "ls", "--redis-timeout", bad, env=env)
        assert done.returncode == 2, (bad, done.stderr)
        assert "--redis-timeout" in done.stderr


def test_a_timeout_in_the_url_wins_over_redis_timeout_for_that_value() -> None:
    """docs/cli.md: a ``?socket_timeout=`` or ``?socket_connect_timeout=`` in the URL wins
    over ``--redis-timeout`` for that value (untested: a mutant that always set the bound
    lived); redis-py's own retries are off either way (settle repeats its start-up check)."""
    for query, reply, connect in (
        ("", 1.5, 1.5),
        ("?socket_timeout=7", 7.0, 1.5),
        ("?socket_connect_timeout=9", 1.5, 9.0),
    ):
        url = f"redis://127.0.0.1:1/0{query}"
        client = bounded(client_from_url(url), url, 1.5)
        kwargs = client.connection_pool.connection_kwargs
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (reply, connect)
        assert client.get_retry().get_retries() == 0
        client.close()
