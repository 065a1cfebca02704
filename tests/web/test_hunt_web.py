"""What a hostile acceptance tester found in the console: filters that listed another
operation's evidence, responses without the security headers, forms and filters whose
bytes were altered before use, and a note box that cut what was typed. Real apps (httpx
ASGITransport and ``settle web`` under uvicorn) on the session's redis-server."""

from __future__ import annotations

import json
import re

import httpx
import pytest
import redis
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from settle import AsyncSettler, Settler
from settle.embedded import EmbeddedRedis
from settle.errors import InvalidInput
from settle.web import create_app, token_authorizer
from settle.web._security import CSP
from tests.web import test_browser, test_console_sessions
from tests.web.conftest import TOKEN
from tests.web.evidence import conflicting
from tests.web.server import settle_web
from tests.web.test_console_http import csrf_of

#: The browser tests' headless Chromium, as a fixture of this module too.
chromium = test_browser.chromium
#: A redis-server of the test's own (which the test may stop or turn into a replica).
doomed = test_console_sessions.doomed

#: What docs/console.md says every response of the console carries.
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


def refs_in(html: str) -> list[str]:
    return re.findall(r'<td class="mono nowrap"><a href="/entry/(\d+/\d+-\d+)">', html)


@pytest.mark.asyncio
async def test_an_operation_filter_lists_that_operation_spaces_and_all(
    writer: Settler, read_only: httpx.AsyncClient
) -> None:
    """An operation id may start or end with a space (settle takes any printable text).
    The filter stripped it: ``?operation=%20order-1%20`` listed, and exported, the entries
    of ``order-1``, another operation's evidence, under the filter of this one."""
    spaced = conflicting(writer, " order-1 ")
    plain = conflicting(writer, "order-1")
    listed = await read_only.get("/quarantine?operation=%20order-1%20")
    assert listed.status_code == 200
    assert refs_in(listed.text) == [spaced]
    assert 'name="operation" value=" order-1 "' in listed.text  # the filter as typed
    assert refs_in((await read_only.get("/quarantine?operation=order-1")).text) == [plain]
    exported = await read_only.get("/quarantine.jsonl?operation=+order-1+")
    lines = [json.loads(line) for line in exported.text.splitlines()]
    assert [(line["ref"], line["operation_id"]) for line in lines] == [(spaced, " order-1 ")]
    # The export link of the page keeps the operation as it is too.
    link = re.search(r'href="(/quarantine\.jsonl\?[^"]*)"', listed.text)
    assert link is not None
    again = await read_only.get(link.group(1).replace("&amp;", "&"))
    assert [json.loads(line)["ref"] for line in again.text.splitlines()] == [spaced]
    # A stray space that matches nothing is pointed out, not silently an empty page.
    stray = await read_only.get("/quarantine?operation=order-1%20")
    assert refs_in(stray.text) == []
    assert "starts or ends with a space" in stray.text
    assert "starts or ends with a space" not in listed.text  # it matched: no hint


def test_a_refused_host_gets_the_security_headers_too(redis_url: str, writer: Settler) -> None:
    """docs/console.md: every response carries the CSP, X-Frame-Options, nosniff,
    Referrer-Policy and no-store. The 400 of a ``Host`` the console does not serve (DNS
    rebinding) carried none of them: the host check ran before the headers were added."""
    ns = writer.config.namespace
    with settle_web("--redis-url", redis_url, "--namespace", ns) as url:
        for host in ("rebound.example", "127.0.0.1.", "localhost:80@evil"):
            refused = httpx.get(url + "/quarantine", headers={"host": host})
            assert refused.status_code == 400, host
            for name, value in SECURITY_HEADERS.items():
                assert refused.headers.get(name) == value, (host, name)
        served = httpx.get(url + "/quarantine")
        assert served.status_code == 200
        for name, value in SECURITY_HEADERS.items():
            assert served.headers[name] == value


@pytest.mark.asyncio
async def test_a_note_or_filter_that_is_not_utf8_is_refused_not_altered(
    writer: Settler, reader: AsyncSettler
) -> None:
    """A form's body was checked for UTF-8, but not what its percent escapes spell:
    ``note=refunded%FF`` resolved the entry with the note ``refunded\\ufffd``, a note
    nobody sent, and ``?operation=order-7%FF`` listed the entries of another operation id
    (``order-7\\ufffd``). Both are a 400 now, and nothing is resolved."""
    ref = conflicting(writer, "order-7")
    conflicting(writer, "order-7\ufffd")
    app = create_app(reader, authorize=token_authorizer(TOKEN, "alice@finance"))
    async with test_console_sessions.signed_in(app) as browser:
        csrf = csrf_of((await browser.get(f"/entry/{ref}")).text)
        for body in (f"note=refunded%FF&csrf={csrf}", f"csrf={csrf}&note=%C3%28"):
            refused = await browser.post(
                f"/entry/{ref}/resolve",
                content=body.encode(),
                headers={"content-type": "application/x-www-form-urlencoded"},
            )
            assert refused.status_code == 400, refused.text
            assert "not UTF-8" in refused.text
        assert writer.quarantine.get(ref).resolution is None
        for query in ("operation=order-7%FF", "since=1h%FF", "operation=%C3%28"):
            listed = await browser.get("/quarantine?" + query)
            assert listed.status_code == 400, query
            assert "not UTF-8" in listed.text


def test_the_note_box_takes_every_note_that_fits(
    redis_url: str, writer: Settler, chromium: webdriver.Chrome
) -> None:
    """docs/console.md: the note box takes what fits in a note (4,096 characters with the
    ``[resolved by ...]`` prefix). It had ``maxlength="3800"``: typing stopped there, and a
    pasted note lost its end without a word, so the resolution recorded another note than
    the one written. The server refuses a note too long, saying how many characters fit."""
    ref = conflicting(writer, "order-long-note")
    principal = "ops"
    room = 4096 - len(f"[resolved by {principal}] ")
    note = ("refund ch_2 " * 400)[: room - 6] + " done."  # 4,076 characters
    assert len(note) == room
    ns = writer.config.namespace
    driver = chromium
    with settle_web(
        "--redis-url", redis_url, "--namespace", ns, "--principal", principal, token=TOKEN
    ) as url:
        driver.get(f"{url}/signin?next=/entry/{ref}")
        password = driver.find_element(By.CSS_SELECTOR, "input[type=password]")
        password.send_keys(TOKEN)
        password.submit()
        WebDriverWait(driver, 15).until(lambda d: d.find_elements(By.ID, "note"))
        box = driver.find_element(By.ID, "note")
        box.send_keys(note)
        assert box.get_property("value") == note  # the box took all of it
        driver.find_element(By.CSS_SELECTOR, "form.resolve button").click()
        WebDriverWait(driver, 15).until(lambda d: d.find_elements(By.CSS_SELECTOR, "pre.note"))
    resolution = writer.quarantine.get(ref).resolution
    assert resolution is not None
    assert resolution.note == f"[resolved by {principal}] {note}"


#: Ways a Redis that answers refuses a sign-out: the command that makes it refuse, the one
#: that undoes it, and a word of its answer the page shows.
REFUSALS = {
    # A replica of a primary that is not there.
    "a replica": (("REPLICAOF", "127.0.0.1", "1"), ("REPLICAOF", "NO", "ONE"), "replica"),
    "a refused write": (
        ("CONFIG", "SET", "min-replicas-to-write", "1"),  # and no replica: NOREPLICAS
        ("CONFIG", "SET", "min-replicas-to-write", "0"),
        "NOREPLICAS",
    ),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("refusal", sorted(REFUSALS))
async def test_a_sign_out_a_server_refused_says_what_it_answered_not_that_it_is_unreachable(
    doomed: EmbeddedRedis, namespace: str, refusal: str
) -> None:
    """The console's Redis became a replica (a failover, a REPLICAOF) while a user was
    signed in: the sign-out answered 503 "Redis cannot be reached", sending the operator
    to look for a network fault while the server answered, and refused, as a replica. The
    page says what Redis said now, and that the session is still signed in. A write the
    server refused (NOREPLICAS here; OOM and MISCONF alike) still said "cannot be
    reached" after that fix: found in review."""
    refuse, undo, answered = REFUSALS[refusal]
    with Settler.from_url(doomed.url, namespace=namespace, shards=2) as w:
        w.check()
    reader = AsyncSettler.from_url(doomed.url, namespace=namespace, shards=2)
    try:
        app = create_app(reader, authorize=token_authorizer(TOKEN, "alice@finance"))
        async with test_console_sessions.signed_in(app) as browser:
            csrf = csrf_of((await browser.get("/")).text)
            with redis.Redis.from_url(doomed.url) as raw:
                raw.execute_command(*refuse)
                refused = await browser.post("/signout", data={"csrf": csrf})
                assert refused.status_code == 503
                assert "cannot be reached" not in refused.text
                assert answered in refused.text
                assert "still signed in" in refused.text
                raw.execute_command(*undo)
            # It was: the session holds, and signs out once the server writes again.
            done = await browser.post("/signout", data={"csrf": csrf})
            assert done.status_code == 303
    finally:
        await reader.aclose()


@pytest.mark.asyncio
async def test_a_host_the_console_does_not_serve_is_refused_not_redirected(
    reader: AsyncSettler,
) -> None:
    """docs/console.md: any ``Host`` the console does not serve gets 400. With
    ``www.console.example`` allowed, ``console.example`` was redirected (307) there by
    Starlette's ``www_redirect``, to ``http://`` whatever the proxy's scheme: a page the
    console never served answered, on a name nobody allowed."""
    app = create_app(reader, allowed_hosts=["www.console.example"])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="https://console.example") as c:
        refused = await c.get("/quarantine")
        assert refused.status_code == 400
        assert "location" not in refused.headers
        assert refused.headers["content-security-policy"] == CSP
    async with httpx.AsyncClient(transport=transport, base_url="https://www.console.example") as c:
        assert (await c.get("/quarantine")).status_code == 200


@pytest.mark.asyncio
@pytest.mark.parametrize("option", ["record_limit", "overview_limit"])
@pytest.mark.parametrize("value", [0, -1, 1.5, "100", True, None])
async def test_an_overview_limit_that_is_no_count_is_refused_when_the_app_is_made(
    reader: AsyncSettler, option: str, value: object
) -> None:
    """``session_max_age`` was checked when the app was made, the overview's limits not:
    ``record_limit="100"`` made a console whose overview was a bare 500 (a str compared
    with an int), ``overview_limit=0`` one whose overview was a 400 blaming the reader's
    filter. Both are refused by ``create_app`` now, naming the option."""
    with pytest.raises(InvalidInput, match=option):
        create_app(reader, **{option: value})
    assert create_app(reader, **{option: 1}) is not None
