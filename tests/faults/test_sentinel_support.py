"""The suite's Sentinel (:class:`LocalSentinel`) starts on its own port: a port another
process takes between being found free and the sentinel's bind (the other test workers, the
other leg of ``.ci/run``) is chosen again, as the embedded server's is
(tests/integration/test_embedded.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from settle.embedded import EmbeddedRedis
from tests.faults.sentinel_support import LocalSentinel


@pytest.fixture
def primary() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as server:
        yield server


def _answers_as_sentinel(sentinel: LocalSentinel, primary: EmbeddedRedis) -> None:
    assert sentinel.process is not None
    assert sentinel._answering_pid() == sentinel.process.pid
    assert sentinel.primary() == primary.port


def test_a_port_a_server_took_since_it_was_chosen_is_chosen_again(
    primary: EmbeddedRedis,
) -> None:
    with EmbeddedRedis() as other:
        sentinel = LocalSentinel(primary.port)
        sentinel.port = other.port  # as if another process took the port it had found free
        try:
            sentinel.start()
            assert sentinel.port != other.port
            _answers_as_sentinel(sentinel, primary)
        finally:
            sentinel.close()
        assert other.process is not None
        assert other._answering_pid() == other.process.pid  # the other server is untouched


def test_a_port_any_listener_took_is_chosen_again(primary: EmbeddedRedis) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        sentinel = LocalSentinel(primary.port)
        sentinel.port = taken.getsockname()[1]
        try:
            sentinel.start()
            assert sentinel.port != taken.getsockname()[1]
            _answers_as_sentinel(sentinel, primary)
        finally:
            sentinel.close()
