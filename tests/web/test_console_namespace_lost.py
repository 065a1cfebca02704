"""The console after Redis lost the namespace's data (a restart without persistence, a
FLUSHALL) while it was serving: its pages showed an empty quarantine, which a dispute
settler reads as "all clear", where ``settle quarantine ls`` says the namespace is missing
(exit 3). Each page now says so, 503 (docs/console.md). A real redis-server of the test's
own, killed and started again empty."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import pytest_asyncio

from settle import AsyncSettler, Settler
from settle.embedded import EmbeddedRedis
from settle.web import create_app
from settle.web._security import CSP
from tests.web.conftest import client_for
from tests.web.evidence import conflicting

pytestmark = pytest.mark.asyncio

_PAGES = ("/", "/quarantine", "/quarantine?status=unresolved", "/quarantine.jsonl")


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as s:  # persistence off: a restart comes back empty
        yield s


@pytest.fixture
def writer(server: EmbeddedRedis) -> Iterator[Settler]:
    s = Settler.from_url(server.url, namespace="lost", shards=2)
    s.check()
    yield s
    s.close()


@pytest_asyncio.fixture
async def console(server: EmbeddedRedis, writer: Settler) -> AsyncIterator[httpx.AsyncClient]:
    del writer
    reader = AsyncSettler.from_url(server.url, namespace="lost", shards=2)
    async with client_for(create_app(reader)) as client:
        yield client
    await reader.aclose()


def _restart_empty(server: EmbeddedRedis) -> None:
    port = server.port
    server.stop(kill=True)
    server.start()
    assert server.port == port  # the console's client reconnects to the same server


def _says_missing(response: httpx.Response, path: str) -> None:
    assert response.status_code == 503, (path, response.text[-600:])
    assert response.headers["content-security-policy"] == CSP, path
    assert "namespace &#39;lost&#39; does not exist" in response.text, path
    assert "lost its data" in response.text, path


async def test_a_restart_that_lost_the_data_is_said_not_an_empty_quarantine(
    server: EmbeddedRedis, writer: Settler, console: httpx.AsyncClient
) -> None:
    ref = conflicting(writer, "order-1")
    for path in _PAGES:
        assert (await console.get(path)).status_code == 200, path
    assert ref in (await console.get("/quarantine")).text
    _restart_empty(server)
    for path in (*_PAGES, f"/entry/{ref}"):
        _says_missing(await console.get(path), path)
    # The console's reads created nothing: the namespace is still missing, as the CLI says.
    for path in _PAGES:
        _says_missing(await console.get(path), path)


async def test_a_namespace_with_an_empty_quarantine_is_still_an_empty_list(
    writer: Settler, console: httpx.AsyncClient
) -> None:
    """The check costs nothing where the namespace exists: an empty quarantine of a
    namespace in use is an empty list, as before."""
    del writer
    for path in _PAGES:
        assert (await console.get(path)).status_code == 200, path
    assert "No quarantine entries match" in (await console.get("/quarantine")).text
