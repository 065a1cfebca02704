"""The embedded redis-server (``settle demo``, and every server this suite starts) answers on
its own port: a port another process takes between being found free and the server's bind
(parallel test workers, anything else on the machine) is never mistaken for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from settle.embedded import EmbeddedRedis
from settle.errors import ConfigurationError


def _pid_behind(url: str) -> int:
    with redis.Redis.from_url(url) as client:
        return int(client.info("server")["process_id"])


@pytest.fixture
def other() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as server:
        yield server


def test_a_port_taken_since_it_was_chosen_is_chosen_again(other: EmbeddedRedis) -> None:
    mine = EmbeddedRedis()
    mine.port = other.port  # as if another process took the port it had found free
    with mine:
        assert mine.port != other.port
        assert mine.process is not None
        assert _pid_behind(mine.url) == mine.process.pid
    assert other.process is not None
    assert _pid_behind(other.url) == other.process.pid  # the other server is untouched


def test_a_port_given_that_is_taken_is_refused_not_shared(other: EmbeddedRedis) -> None:
    mine = EmbeddedRedis(port=other.port)
    with pytest.raises(ConfigurationError, match="Address already in use"):
        mine.start()
    mine.close()
    assert other.process is not None
    assert _pid_behind(other.url) == other.process.pid
