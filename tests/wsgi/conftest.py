"""Fixtures of the WSGI tests: the Django and the Flask shop under a real gunicorn."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.wsgi.servers import Gunicorn

#: Short, so that a crashed attempt is taken over within the test.
LEASE = 2.0


@pytest.fixture(params=["django", "flask"])
def shop(
    request: pytest.FixtureRequest, redis_url: str, namespace: str, tmp_path: Path
) -> Iterator[Gunicorn]:
    log = tmp_path / "gunicorn.log"
    server = Gunicorn(request.param, redis_url, namespace, LEASE, log).start()
    yield server
    server.stop()
