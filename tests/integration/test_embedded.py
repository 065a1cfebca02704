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


def test_a_server_loading_its_dataset_is_started_once_it_answers_commands(tmp_path) -> None:
    """A directory that holds a dump (a restart with persistence): start() returns once the
    server answers commands. It answers INFO while it still loads, and every command then
    fails with LOADING: the first command of its user failed."""
    keys = 10_000
    first = EmbeddedRedis(directory=str(tmp_path), extra_args=["--rdbcompression", "no"])
    with first, redis.Redis.from_url(first.url) as client:
        pipe = client.pipeline(transaction=False)
        for n in range(keys):
            pipe.set(f"k{n}", f"{n:0>1000}")
        pipe.execute()
        client.save()
    # About 10 MB, loaded 100 µs a key: a second in which the server answers LOADING.
    restarted = EmbeddedRedis(directory=str(tmp_path), extra_args=["--key-load-delay", "100"])
    with restarted, redis.Redis.from_url(restarted.url) as client:
        assert client.dbsize() == keys


def test_a_directory_whose_log_tells_of_a_taken_port_still_reports_its_own_error(
    tmp_path,
) -> None:
    """A directory given is reused, and its log grows: an earlier server's "Address already
    in use" in it is not this server's error. A server that cannot start is refused with
    its own error, not retried on other ports and refused as if every port were taken."""
    refused = "# Could not create server TCP listening socket *:6390: bind: Address already in use"
    (tmp_path / "redis.log").write_text(f"{refused}\n" * 4)  # refused its given port, 4 times
    server = EmbeddedRedis(directory=str(tmp_path), extra_args=["--dir", "/nonexistent-settle"])
    with pytest.raises(ConfigurationError, match="nonexistent-settle"):
        server.start()
    assert server.process is None
