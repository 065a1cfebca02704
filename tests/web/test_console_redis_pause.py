"""The console when Redis stops answering: a redis-server of the test's own, paused with
SIGSTOP (connections open, no answer, as in a network partition) or pausing writes
(``CLIENT PAUSE ... WRITE``), then resumed. Every page answered after the client's socket
timeout and its retries, about 120 s, when the browser had long given up; each now answers
a 503 page within ``redis_timeout`` (its security headers, no traceback, the event
``settle.web.redis_timeout``), a resolve whose write was sent says its outcome is unknown,
and the console serves again once Redis is back."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import pytest_asyncio
from selenium import webdriver
from selenium.webdriver.common.by import By
from structlog.testing import capture_logs

from settle import AsyncSettler, Settler
from settle._core.keys import Keys
from settle._core.scripts import SCRIPTS
from settle.embedded import EmbeddedRedis
from settle.errors import InvalidInput
from settle.web import create_app, token_authorizer
from settle.web._security import CSP
from tests.cli.helpers import paused as stopped
from tests.faults.servers import proxy_to, script_needle
from tests.stopwatch import Stopwatch
from tests.web.conftest import TOKEN, client_for
from tests.web.evidence import conflicting
from tests.web.server import settle_web
from tests.web.test_browser import chromium
from tests.web.test_console_http import csrf_of

__all__ = ["chromium"]

#: The console's bound in these tests, and what a page may take beyond it.
BOUND = 1.0
SLACK = 2.0


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    s = EmbeddedRedis().start()
    try:
        yield s
    finally:
        if s.process is not None:
            os.kill(s.process.pid, signal.SIGCONT)  # never leave it stopped
        s.close()


@pytest.fixture
def writer(server: EmbeddedRedis) -> Iterator[Settler]:
    s = Settler.from_url(server.url, namespace="pause", shards=2)
    s.check()
    yield s
    s.close()


@pytest_asyncio.fixture
async def browser(server: EmbeddedRedis, writer: Settler) -> AsyncIterator[httpx.AsyncClient]:
    del writer
    reader = AsyncSettler.from_url(server.url, namespace="pause", shards=2)
    app = create_app(
        reader, authorize=token_authorizer(TOKEN, "alice@finance"), redis_timeout=BOUND
    )
    async with client_for(app) as client:
        yield client
    await reader.aclose()


async def _signed_in(browser: httpx.AsyncClient) -> None:
    form = await browser.get("/signin")
    done = await browser.post("/signin", data={"token": TOKEN, "csrf": csrf_of(form.text)})
    assert done.status_code == 303


async def _timed(
    browser: httpx.AsyncClient, method: str, path: str, **kw: object
) -> httpx.Response:
    clock = Stopwatch()  # in this thread: the app runs on this event loop
    response = await browser.request(method, path, timeout=60, **kw)  # type: ignore[arg-type]
    took = clock.unloaded()  # less the time a loaded worker held it off a CPU
    assert took < BOUND + SLACK, f"{method} {path} took {took:.1f} s"
    return response


def _is_the_503_page(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text[-500:]
    assert response.headers["content-security-policy"] == CSP
    assert "Traceback" not in response.text
    assert f"Redis did not answer within {BOUND:g} s" in response.text


@pytest.mark.asyncio
async def test_every_page_answers_503_promptly_while_redis_is_stopped(
    server: EmbeddedRedis, writer: Settler, browser: httpx.AsyncClient
) -> None:
    ref = conflicting(writer, "order-1")
    await _signed_in(browser)
    entry = await browser.get(f"/entry/{ref}")
    csrf = csrf_of(entry.text)
    with capture_logs() as logs, stopped(server):
        for path in ("/", "/quarantine", "/quarantine.jsonl", f"/entry/{ref}"):
            _is_the_503_page(await _timed(browser, "GET", path))
        refused = await _timed(
            browser, "POST", f"/entry/{ref}/resolve", data={"note": "refunded", "csrf": csrf}
        )
        assert refused.status_code == 503
        assert "Traceback" not in refused.text
        out = await _timed(browser, "POST", "/signout", data={"csrf": csrf})
        assert out.status_code == 503
        assert "Sign out again" in out.text
    assert any(e["event"] == "settle.web.redis_timeout" for e in logs)
    assert writer.quarantine.get(ref).resolution is None  # nothing was resolved
    # Back: the console serves again, on the same connections' pool.
    assert (await _timed(browser, "GET", "/quarantine")).status_code == 200
    assert (await _timed(browser, "GET", f"/entry/{ref}")).status_code == 200


@pytest.mark.asyncio
async def test_a_sign_in_while_redis_is_stopped_is_a_prompt_503(
    server: EmbeddedRedis, writer: Settler, browser: httpx.AsyncClient
) -> None:
    del writer
    form = await browser.get("/signin")
    with stopped(server):
        answer = await _timed(
            browser, "POST", "/signin", data={"token": TOKEN, "csrf": csrf_of(form.text)}
        )
    _is_the_503_page(answer)
    assert "alice@finance" not in answer.text  # not signed in
    # docs/console.md: a sign-in that timed out says it is not confirmed (its session may
    # have been written); it said "nothing was changed".
    assert "the sign-in is not confirmed" in answer.text
    assert "nothing was changed" not in answer.text


@pytest.mark.asyncio
async def test_a_resolve_whose_write_timed_out_says_its_outcome_is_unknown(
    server: EmbeddedRedis, writer: Settler
) -> None:
    """The resolve reaches Redis, which applies it; its reply never comes back (a proxy
    withholds it, as a partition would). Saying "failed" would be false: it stands."""
    ref = conflicting(writer, "order-2")
    proxy = proxy_to(server.url, SCRIPTS)
    reader = AsyncSettler.from_url(proxy.url, namespace="pause", shards=2)
    app = create_app(
        reader, authorize=token_authorizer(TOKEN, "alice@finance"), redis_timeout=BOUND
    )
    try:
        async with client_for(app) as browser:
            await _signed_in(browser)
            csrf = csrf_of((await browser.get(f"/entry/{ref}")).text)
            proxy.cut(script_needle(SCRIPTS, "quarantine_resolve"), "stall")
            with capture_logs() as logs:
                answer = await _timed(
                    browser,
                    "POST",
                    f"/entry/{ref}/resolve",
                    data={"note": "refunded", "csrf": csrf},
                )
    finally:
        await reader.aclose()
        proxy.close()
    _is_the_503_page(answer)
    assert "outcome of this resolve is unknown" in answer.text
    assert "may have been applied" in answer.text
    event = [e for e in logs if e["event"] == "settle.web.redis_timeout"]
    assert event
    assert event[0]["outcome_unknown"] is True
    resolution = writer.quarantine.get(ref).resolution  # it was applied, as the page allowed
    assert resolution is not None
    assert resolution.note == "[resolved by alice@finance] refunded"


@pytest.mark.asyncio
async def test_redis_timeout_is_checked_when_the_console_is_made(server: EmbeddedRedis) -> None:
    reader = AsyncSettler.from_url(server.url, namespace="pause", shards=2)
    try:
        for bad in (0, -1, float("nan"), "5", True, 301):
            with pytest.raises(InvalidInput, match="redis_timeout"):
                create_app(reader, redis_timeout=bad)  # type: ignore[arg-type]
    finally:
        await reader.aclose()


def test_a_page_of_settle_web_in_a_real_browser_while_redis_is_stopped(
    server: EmbeddedRedis, writer: Settler, chromium: webdriver.Chrome
) -> None:
    ref = conflicting(writer, "order-3")
    driver = chromium
    driver.set_page_load_timeout(60)
    with settle_web(
        "--redis-url", server.url, "--namespace", "pause", "--redis-timeout", str(BOUND)
    ) as url:
        driver.get(url + "/quarantine")
        assert driver.find_elements(By.LINK_TEXT, ref)
        with stopped(server):
            started = time.monotonic()
            driver.get(url + f"/entry/{ref}")
            took = time.monotonic() - started
            assert took < BOUND + SLACK
            assert driver.find_element(By.TAG_NAME, "h1").text == "503"
            assert "Redis did not answer" in driver.find_element(By.CSS_SELECTOR, ".notice").text
        driver.get(url + f"/entry/{ref}")
        assert driver.find_element(By.TAG_NAME, "h1").text != "503"


@pytest.mark.asyncio
async def test_a_slow_authorize_is_not_taken_for_a_silent_redis(
    server: EmbeddedRedis, writer: Settler
) -> None:
    """The service's authorize may ask an identity provider and take longer than
    ``redis_timeout``: that is no Redis call, and the sign-in goes through."""
    del writer

    async def slow(token: str) -> str | None:
        await asyncio.sleep(BOUND * 1.5)
        return "alice@finance" if token == TOKEN else None

    reader = AsyncSettler.from_url(server.url, namespace="pause", shards=2)
    try:
        async with client_for(create_app(reader, authorize=slow, redis_timeout=BOUND)) as browser:
            await _signed_in(browser)
            assert "alice@finance" in (await browser.get("/quarantine")).text
    finally:
        await reader.aclose()


def test_an_export_whose_later_page_gets_no_answer_ends_promptly(
    server: EmbeddedRedis, writer: Settler
) -> None:
    """Found in review, untested: the export's first page is bounded by the request's
    deadline, each later page by ``redis_timeout`` of its own. Redis stopped after the
    first page (500 entries), the download waited out the client's socket timeout and its
    retries; it ends early within the bound (the browser shows it failed)."""
    stream = Keys("pause", 2).quarantine(0)
    pipe = writer.client.pipeline(transaction=False)
    for i in range(600):  # marks (no kind): any entry the export writes will do
        pipe.xadd(stream, {"op": f"order-{i}"})
    pipe.execute()
    with settle_web(
        "--redis-url", server.url, "--namespace", "pause", "--redis-timeout", str(BOUND)
    ) as url:
        seen: list[float] = []  # when Redis was stopped, after the first line

        def read(download: httpx.Response) -> None:
            for _ in download.iter_lines():
                if not seen:
                    os.kill(server.process.pid, signal.SIGSTOP)  # type: ignore[union-attr]
                    seen.append(time.monotonic())

        with httpx.stream("GET", url + "/quarantine.jsonl", timeout=60) as download:
            assert download.status_code == 200
            with pytest.raises(httpx.HTTPError):
                read(download)
        took = time.monotonic() - seen[0]
        os.kill(server.process.pid, signal.SIGCONT)  # type: ignore[union-attr]
        assert took < BOUND + SLACK, f"the download held on {took:.1f} s"


@pytest.mark.asyncio
async def test_a_signed_in_page_waits_one_deadline_not_one_per_stage(
    server: EmbeddedRedis, writer: Settler
) -> None:
    """The sign-in check and the page's reads share one deadline (docs/console.md: the
    Redis calls of one request in all). Untested: a mutant giving each stage its own
    ``redis_timeout`` lived, and a signed-in page on a stopped Redis took twice the bound."""
    del writer
    bound = 2.0
    reader = AsyncSettler.from_url(server.url, namespace="pause", shards=2)
    app = create_app(
        reader, authorize=token_authorizer(TOKEN, "alice@finance"), redis_timeout=bound
    )
    try:
        async with client_for(app) as browser:
            await _signed_in(browser)
            with stopped(server):
                clock = Stopwatch()  # in this thread: the app runs on this event loop
                page = await browser.get("/quarantine", timeout=60)
                took = clock.unloaded()  # less the time a loaded worker held it off a CPU
    finally:
        await reader.aclose()
    assert page.status_code == 503
    assert took < 1.75 * bound, f"took {took:.1f} s: a deadline per stage"
