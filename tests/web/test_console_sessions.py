"""Console sessions kept in Redis, so that they can end: sign-out, ending every session of
a principal, expiry, Redis unreachable; and the notices, notes and forms of a resolution.
Real apps (httpx ASGITransport) on real redis-servers, one of them stopped by the test."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import pytest_asyncio

from settle import AsyncSettler, Settler
from settle.embedded import EmbeddedRedis
from settle.web import create_app
from settle.web._security import CSP
from tests.web.conftest import TOKEN, client_for
from tests.web.evidence import conflicting
from tests.web.test_console_http import csrf_of

PRINCIPAL = "alice@finance"
#: Two people, two tokens: ending one's sessions leaves the other's.
PEOPLE = {TOKEN: PRINCIPAL, "bob-token-5e1": "bob@finance"}


def people(token: str) -> str | None:
    return PEOPLE.get(token)


def session_of(client: httpx.AsyncClient) -> dict[str, object]:
    """What the signed session cookie holds (itsdangerous: base64 JSON, timestamp, MAC)."""
    [value] = [v for k, v in client.cookies.items() if k.startswith("settle_console_")]
    data = value.split(".")[0]
    decoded: dict[str, object] = json.loads(base64.b64decode(data + "=" * (-len(data) % 4)))
    return decoded


@contextlib.asynccontextmanager
async def signed_in(app: object, token: str = TOKEN) -> AsyncIterator[httpx.AsyncClient]:
    """A browser signed in to ``app``."""
    async with client_for(app) as browser:
        form = (await browser.get("/signin")).text
        done = await browser.post("/signin", data={"token": token, "csrf": csrf_of(form)})
        assert done.status_code == 303
        yield browser


def copy_of(browser: httpx.AsyncClient, app: object) -> httpx.AsyncClient:
    """Another client holding a copy of ``browser``'s cookie (a cookie taken from it)."""
    thief = client_for(app)
    for name, value in browser.cookies.items():
        thief.cookies.set(name, value)
    return thief


async def resolve(browser: httpx.AsyncClient, ref: str, note: str, csrf: str) -> httpx.Response:
    return await browser.post(f"/entry/{ref}/resolve", data={"note": note, "csrf": csrf})


@pytest_asyncio.fixture
async def app(reader: AsyncSettler) -> object:
    return create_app(reader, authorize=people)


# -- Redis unreachable -------------------------------------------------------------------


@pytest.fixture
def doomed() -> Iterator[EmbeddedRedis]:
    """A redis-server of this test's own, which the test kills."""
    server = EmbeddedRedis().start()
    try:
        yield server
    finally:
        server.close()


@pytest_asyncio.fixture
async def doomed_reader(doomed: EmbeddedRedis, namespace: str) -> AsyncIterator[AsyncSettler]:
    with Settler.from_url(doomed.url, namespace=namespace, shards=4) as w:
        w.check()
        conflicting(w, "order-doomed")
    s = AsyncSettler.from_url(doomed.url, namespace=namespace, shards=4)
    yield s
    await s.aclose()


def assert_error_page(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text[:400]
    assert response.headers["content-security-policy"] == CSP  # the console's own page
    assert '<p class="notice error">' in response.text


@pytest.mark.asyncio
async def test_with_redis_down_the_overview_and_duration_filters_answer_503(
    doomed: EmbeddedRedis, doomed_reader: AsyncSettler
) -> None:
    """A bare 500 before: the server's clock (TIME) and the record count (SCAN) were read
    with redis-py's own errors, which the console did not know."""
    async with client_for(create_app(doomed_reader)) as browser:
        assert (await browser.get("/")).status_code == 200
        doomed.stop(kill=True)
        for path in ("/", "/?window=7d", "/quarantine?since=1h", "/quarantine.jsonl?until=2h"):
            assert_error_page(await browser.get(path), 503)
