"""What a review of the console's acceptance fixes found: query parameters that still
escaped the UTF-8 rule (the sign-in's next, the page size and cursor, the overview's
window, the query of every page's own URL), rules no test held (the last of a repeated
parameter, the overview limits' bounds), a truncated payload still shown as JSON, and
that the refused sign-out's page, which now shows what Redis answered, shows no secret.
Real apps on real redis-servers."""

from __future__ import annotations

import re
import secrets
from typing import Any

import httpx
import pytest
import redis

from settle import AsyncSettler, Settler
from settle._runtime.topology import has_functions
from settle.embedded import EmbeddedRedis
from settle.errors import InvalidInput
from settle.web import create_app, token_authorizer
from tests.web import test_console_sessions
from tests.web.conftest import TOKEN
from tests.web.evidence import conflicting
from tests.web.test_console_http import csrf_of
from tests.web.test_console_sessions import session_of

#: A redis-server of the test's own (which the test reconfigures).
doomed = test_console_sessions.doomed

pytestmark = pytest.mark.asyncio


def refs_in(html: str) -> list[str]:
    return re.findall(r'<td class="mono nowrap"><a href="/entry/(\d+/\d+-\d+)">', html)


async def test_a_sign_in_whose_next_is_not_utf8_is_refused_not_sent_elsewhere(
    writer: Settler, reader: AsyncSettler
) -> None:
    """The filter refused a percent escape that spells no UTF-8, but the sign-in's ``next``
    still read it as U+FFFD: ``/signin?next=/quarantine?operation=order-7%FF`` signed in and
    went on to the entries of operation ``order-7\\ufffd``, another one. It is a 400 now, as
    is every other parameter the console reads (page size, cursor, overview window)."""
    conflicting(writer, "order-7\ufffd")
    app = create_app(reader, authorize=token_authorizer(TOKEN, "alice@finance"))
    async with test_console_sessions.signed_in(app) as browser:
        refused = await browser.get("/signin?next=/quarantine?operation=order-7%FF")
        assert refused.status_code == 400, refused.text[:300]
        assert "not UTF-8" in refused.text
        for query in ("/quarantine?size=50%FF", "/quarantine?after=%FF", "/?window=24h%FF"):
            refused = await browser.get(query)
            assert refused.status_code == 400, query
            assert "not UTF-8" in refused.text, query
        # A next that is text still leads where it says.
        form = (await browser.get("/signin?next=/quarantine?operation=order-7")).text
        assert "next=/quarantine%3Foperation%3Dorder-7" in form


async def _asgi_get(app: Any, path: str, query: bytes) -> tuple[int, str]:
    """GET ``path?query`` with ``query`` as raw bytes, as an ASGI server passes on a
    request target a client sent unescaped (httpx escapes it before the app sees it)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query,
        "headers": [(b"host", b"localhost")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body.decode()


async def test_raw_utf8_in_a_query_is_read_as_utf8_and_other_bytes_refused(
    writer: Settler, reader: AsyncSettler
) -> None:
    """A query whose bytes came unescaped (an ASGI server passes them as sent) is read as
    UTF-8: ``operation=café`` lists the entries of ``café``, where Starlette's reader
    (Latin-1) looked for ``cafÃ©``; bytes that are no UTF-8 are refused, as their
    percent escapes are (every page was a bare 500 with them: Starlette's ``request.url``,
    which the pages read their path from, decodes the query as UTF-8)."""
    ref = conflicting(writer, "café")
    app = create_app(reader)
    status, html = await _asgi_get(app, "/quarantine", "operation=café".encode())
    assert status == 200
    assert refs_in(html) == [ref]
    status, html = await _asgi_get(app, "/quarantine", b"operation=caf\xe9")
    assert status == 400  # was a bare 500: Starlette's request.url decodes the query
    assert "not UTF-8" in html
    # A page that reads no parameter is served whatever its query holds.
    status, html = await _asgi_get(app, f"/entry/{ref}", b"from=\xff")
    assert status == 200
    assert "café" in html


async def test_a_repeated_query_parameter_is_read_as_its_last_value(
    writer: Settler, read_only: httpx.AsyncClient
) -> None:
    """The console reads the last of a repeated parameter, as Starlette did before its own
    reader (and as it still reads ``size``): a link that adds ``&operation=...`` to a
    filtered page lists the operation added, and exports it."""
    first = conflicting(writer, "order-first")
    last = conflicting(writer, "order-last")
    query = "operation=order-first&size=10&operation=order-last&size=25"
    listed = await read_only.get("/quarantine?" + query)
    assert listed.status_code == 200
    assert refs_in(listed.text) == [last]
    assert 'name="operation" value="order-last"' in listed.text
    assert re.search(r"<option selected>25</option>", listed.text)
    exported = await read_only.get("/quarantine.jsonl?" + query)
    assert first not in exported.text
    assert [line for line in exported.text.splitlines() if last in line]


async def test_the_overview_limits_take_every_count_the_docs_allow(reader: AsyncSettler) -> None:
    """docs/console.md: ``record_limit`` and ``overview_limit`` are whole numbers above 0,
    ``overview_limit`` at most 100 000 (what one quarantine read returns). The refusals
    were held by a test, the bounds not: 100 000 must be taken, 100 001 refused, and a
    ``record_limit`` has no upper bound."""
    assert create_app(reader, overview_limit=100_000) is not None
    with pytest.raises(InvalidInput, match=r"overview_limit .* from 1 to 100000"):
        create_app(reader, overview_limit=100_001)
    assert create_app(reader, record_limit=10**9) is not None


async def test_a_refused_sign_out_shows_no_password_nor_session_id(
    doomed: EmbeddedRedis, namespace: str
) -> None:
    """The refused sign-out's page shows what Redis answered: a user its ACL refuses the
    session scripts gets a page naming the refusal, never the password in the settler's
    URL nor the session's id (a bearer token, only in the browser's cookie)."""
    password = secrets.token_hex(16)
    with redis.Redis.from_url(doomed.url) as raw:
        fcall = ("-fcall", "-fcall_ro") if has_functions(raw.info("server")) else ()
        raw.acl_setuser(
            "console",
            enabled=True,
            passwords=[f"+{password}"],
            keys=["*"],
            commands=["+@all", "-evalsha", "-eval", "-script", *fcall],
        )
    url = doomed.url.replace("redis://", f"redis://console:{password}@", 1)
    with Settler.from_url(doomed.url, namespace=namespace, shards=2) as w:
        w.check()
    full = AsyncSettler.from_url(doomed.url, namespace=namespace, shards=2)
    limited = AsyncSettler.from_url(url, namespace=namespace, shards=2)
    key = "one-key-for-both-processes"
    authorize = token_authorizer(TOKEN, "alice@finance")
    try:
        async with test_console_sessions.signed_in(
            create_app(full, authorize=authorize, secret_key=key)
        ) as browser:
            sid = session_of(browser)["sid"]
            csrf = csrf_of((await browser.get("/")).text)
            crippled = create_app(limited, authorize=authorize, secret_key=key)
            async with test_console_sessions.copy_of(browser, crippled) as other:
                refused = await other.post("/signout", data={"csrf": csrf})
            assert refused.status_code == 503
            assert "still signed in" in refused.text
            assert "cannot be reached" not in refused.text
            assert isinstance(sid, str)
            for secret in (password, sid, TOKEN):
                assert secret not in refused.text
    finally:
        await limited.aclose()
        await full.aclose()


@pytest.mark.parametrize("kept", [b'{"a": 1}', b"null"])
async def test_a_truncated_payload_is_shown_as_text_whatever_its_kept_bytes_read_as(
    writer: Settler, read_only: httpx.AsyncClient, kept: bytes
) -> None:
    """A truncated payload is no JSON, whatever its kept bytes read as (``payload.json`` is
    null since the review of the CLI's export). The entry page still took kept bytes that
    read ``null`` (and spaces up to the cut) for JSON: labelled ``json``, re-indented to
    ``null`` and said to differ only in whitespace, of a payload that was not ``null``."""
    payload = kept + b" " * 300 + b"and more"
    ref = conflicting(writer, f"order-cut-{kept[0]}", payload)
    page = await read_only.get(f"/entry/{ref}")
    assert page.status_code == 200
    section = page.text.split("<h2>Payload ", 1)[1].split("<h2>", 1)[0]
    assert section.startswith("<small>text</small></h2>")
    assert "Re-indented" not in section
    assert "truncated: 256 of" in section
