"""What a hunt of the console as its users and as an attacker found: stored values settle
no longer writes (an operation id with a line break or a bidi override, written by an
earlier version or another program) shown and resolvable as the CLI shows and resolves
them; a resolve form of a principal no note can hold; a note refused without saying why; a
sign-in that lost the filter; a shell command with an unquoted id. Real apps (httpx
ASGITransport, and settle web with headless Chromium) on the session's redis-server."""

from __future__ import annotations

import asyncio
import html
import re
import shlex

import httpx
import pytest
import redis
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from settle import AsyncSettler, Reserved, Settler
from settle._core.keys import Keys
from settle.embedded import EmbeddedRedis
from settle.web import create_app, token_authorizer
from tests.web import test_browser
from tests.web.conftest import TOKEN, client_for
from tests.web.evidence import conflicting
from tests.web.server import settle_web
from tests.web.test_browser import _loaded
from tests.web.test_console_http import csrf_of
from tests.web.test_hunt_web import SECURITY_HEADERS

#: The browser tests' headless Chromium, as a fixture of this module too.
chromium = test_browser.chromium


#: Operation ids settle refuses today but an earlier version or another program stored.
LEGACY_IDS = {
    "line break": "order-\n<b>7</b>\x1b[2J",
    "bidi override": "order-\u202egnp.exe",
    "too long": "order-" + "L" * 300,
}


def legacy_entry(writer: Settler, redis_url: str, operation_id: str) -> str:
    """A quarantine entry like one settle writes, but of ``operation_id``, which settle's
    API refuses (a copy of a real entry with its ``op`` field replaced)."""
    ref = conflicting(writer, "order-template")
    shard, entry_id = ref.split("/")
    stream = Keys(writer.config.namespace, writer.config.shards).quarantine(int(shard))
    with redis.Redis.from_url(redis_url) as raw:
        [(_, fields)] = raw.xrange(stream, entry_id, entry_id)
        copy = {**fields, b"op": operation_id.encode("utf-8")}
        return f"{shard}/{raw.xadd(stream, copy).decode()}"  # type: ignore[arg-type]


@pytest.mark.asyncio
@pytest.mark.parametrize("name", list(LEGACY_IDS))
async def test_an_entry_of_an_operation_id_settle_refuses_today_is_shown_and_resolved(
    writer: Settler, guarded: httpx.AsyncClient, redis_url: str, name: str
) -> None:
    """The entry page read the operation's record with the stored id, which settle's API
    refuses, and answered 400 "operation id must not contain control characters": a
    finance user could neither see the evidence (the CLI's ``quarantine show`` shows it)
    nor resolve it. The page shows the entry, says why there is no record, and resolves."""
    operation_id = LEGACY_IDS[name]
    ref = legacy_entry(writer, redis_url, operation_id)
    page = await guarded.get(f"/entry/{ref}")
    assert page.status_code == 200, page.text
    assert "operation id must" not in page.text
    assert "no record or attempt log can be read" in page.text
    assert "<b>7</b>" not in page.text  # stored text, never markup
    form = (await guarded.get("/signin")).text
    signed = await guarded.post("/signin", data={"token": TOKEN, "csrf": csrf_of(form)})
    assert signed.status_code == 303
    page = await guarded.get(f"/entry/{ref}")
    assert page.status_code == 200
    resolved = await guarded.post(
        f"/entry/{ref}/resolve", data={"csrf": csrf_of(page.text), "note": "harmless"}
    )
    assert resolved.status_code == 303, resolved.text
    after = await guarded.get(resolved.headers["location"])
    assert after.status_code == 200
    assert "[resolved by alice@finance] harmless" in after.text
    entry = writer.quarantine.get(ref)
    assert entry.resolution is not None
    assert entry.resolution.note == "[resolved by alice@finance] harmless"
    assert entry.operation_id == operation_id  # the evidence unchanged


@pytest.mark.asyncio
async def test_an_unexpected_failure_is_an_error_page_with_the_security_headers(
    reader: AsyncSettler,
) -> None:
    """docs/console.md: every response carries the CSP, X-Frame-Options, nosniff,
    Referrer-Policy and no-store. An exception settle does not raise (here the service's
    own ``authorize`` failing: its directory down) answered Starlette's bare "Internal
    Server Error" in plain text without any of them. It is the console's error page, with
    the headers, naming the exception's type and never its text (which may hold a secret)."""

    def authorize(token: str) -> str | None:
        raise RuntimeError(f"directory down while checking {token}")

    app = create_app(reader, authorize=authorize)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        form = (await client.get("/signin")).text
        failed = await client.post("/signin", data={"token": "t0ken-typed", "csrf": csrf_of(form)})
    assert failed.status_code == 500
    for name, value in SECURITY_HEADERS.items():
        assert failed.headers.get(name) == value, name
    assert failed.headers["content-type"].startswith("text/html")
    assert "RuntimeError" in failed.text
    assert "t0ken-typed" not in failed.text  # the exception's text is not shown
    assert "Back to the quarantine" in failed.text


@pytest.mark.asyncio
@pytest.mark.parametrize("granted", ["ana\nbob", "a" * 5000])
async def test_a_principal_no_note_can_hold_gets_no_resolve_form_but_what_to_change(
    writer: Settler, reader: AsyncSettler, granted: str
) -> None:
    """A service's ``authorize`` that grants a principal the console cannot write into a
    resolution note (a line break, longer than a note) signed the user in and showed the
    resolve form; the user typed a note, and only then learnt (a 400) that nothing could
    be resolved as that principal. The entry page says so instead of the form, and what
    must change; a POST is still refused with 400 naming the principal, nothing resolved."""
    ref = conflicting(writer, "order-principal")
    app = create_app(reader, authorize=lambda token: granted if token == TOKEN else None)
    async with client_for(app) as client:
        form = (await client.get("/signin")).text
        signed = await client.post("/signin", data={"token": TOKEN, "csrf": csrf_of(form)})
        assert signed.status_code == 303
        page = await client.get(f"/entry/{ref}")
        assert "which no resolution note can name" in page.text
        assert "authorize must grant another principal" in page.text
        assert 'name="note"' not in page.text  # no resolve form
        refused = await client.post(
            f"/entry/{ref}/resolve", data={"csrf": csrf_of(page.text), "note": "refunded"}
        )
        assert refused.status_code == 400, refused.text
        assert "cannot resolve as the principal you are signed in as" in refused.text
        assert "principal must be" in refused.text
    assert writer.quarantine.get(ref).resolution is None


async def _sign_in_by_the_link(client: httpx.AsyncClient, page: str) -> httpx.Response:
    """Follow ``page``'s "Sign in" link and sign in there, as a user does: the answer (303)."""
    link = re.search(r'href="(/signin\?next=[^"]*)"', page)
    assert link is not None
    form = await client.get(html.unescape(link.group(1)))
    action = re.search(r'<form method="post" action="([^"]*)"', form.text)
    assert action is not None
    signed = await client.post(
        html.unescape(action.group(1)), data={"token": TOKEN, "csrf": csrf_of(form.text)}
    )
    assert signed.status_code == 303
    return signed


@pytest.mark.asyncio
async def test_signing_in_from_a_filtered_list_returns_to_that_filter(
    writer: Settler, guarded: httpx.AsyncClient
) -> None:
    """ "Sign in to resolve" on a filtered list (the unresolved entries of one kind, an
    operation) came back to the whole quarantine, unfiltered: the link's ``next`` was the
    page's path without its query. It is the page as it was, filter included."""
    ref = conflicting(writer, "order-filtered")
    here = "/quarantine?kind=conflicting_settlement&operation=order-filtered&status=unresolved"
    page = await guarded.get(here)
    signed = await _sign_in_by_the_link(guarded, page.text)
    assert signed.headers["location"] == here
    back = await guarded.get(signed.headers["location"])
    assert ref in back.text
    assert "signed in as alice@finance" in back.text
    # A query that is no UTF-8 is not carried into the link (its page is a 400).
    bad = await guarded.get("/quarantine?operation=order-7%FF")
    assert bad.status_code == 400
    assert "%FF" not in bad.text
    assert "%25FF" not in bad.text


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("note", "named"),
    [
        # Persian spelling: the non-joiner between the two parts of a word.
        (
            "refund sent \u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",
            "U+200C ZERO WIDTH NON-JOINER",
        ),
        ("checked with \u202eevil", "U+202E RIGHT-TO-LEFT OVERRIDE"),
        ("family \U0001f468\u200d\U0001f469", "U+200D ZERO WIDTH JOINER"),
    ],
)
async def test_a_note_settle_refuses_is_refused_naming_the_character(
    writer: Settler, guarded: httpx.AsyncClient, note: str, named: str
) -> None:
    """A note with an invisible formatting character (the zero-width non-joiner of Persian
    spelling, an emoji's joiner, a bidi override) is refused, as settle refuses it in every
    note, but the 400 said "must not contain control characters or line breaks" of a note
    that, as typed, holds neither: the user could not tell what to change. It names the
    character and where it is; nothing is resolved."""
    ref = conflicting(writer, "order-note")
    form = (await guarded.get("/signin")).text
    await guarded.post("/signin", data={"token": TOKEN, "csrf": csrf_of(form)})
    page = await guarded.get(f"/entry/{ref}")
    refused = await guarded.post(
        f"/entry/{ref}/resolve", data={"csrf": csrf_of(page.text), "note": note}
    )
    assert refused.status_code == 400
    text = html.unescape(refused.text)
    assert named in text
    assert "nothing was resolved" in text
    assert writer.quarantine.get(ref).resolution is None


async def _inspect_command(writer: Settler, read_only: httpx.AsyncClient, operation_id: str) -> str:
    """The ``settle inspect`` command the entry page of an operation whose stored result is
    past what a view shows suggests, as the reader copies it."""
    r = writer.reserve(operation_id, {"amount": 1}, principal="tenant:acme", lease=5)
    assert isinstance(r, Reserved)
    writer.complete(r.reservation, {"blob": "z" * (300 * 1024)})  # past VIEW_LIMIT
    late = writer.complete(r.reservation, {"charge_id": "ch_2"})
    assert late.quarantine_id is not None
    page = (await read_only.get(f"/entry/{late.quarantine_id}")).text
    shown = re.search(r"<code>(settle inspect .*?)</code> shows all", page)
    assert shown is not None
    return html.unescape(re.sub(r"<[^>]+>", "", shown.group(1)))


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "operation_id",
    ["order-$(touch /tmp/settle-pwned) `id`; echo 'x' \\ done", "--redis-url=redis://elsewhere"],
)
async def test_the_inspect_command_an_entry_suggests_runs_on_that_operation_only(
    writer: Settler, read_only: httpx.AsyncClient, operation_id: str
) -> None:
    """A stored result past what a view shows ends in "settle inspect OPERATION_ID --json
    shows all", for the reader to paste into a shell. The operation id, which comes from
    outside (a client's idempotency key), was written in unquoted: pasted, an id such as
    ``order-$(touch /tmp/x); id`` ran its commands, and one such as ``--redis-url=...``
    was read as an option. The id is quoted for a POSIX shell, after ``--``, so the
    command is settle inspect of that one operation."""
    command = await _inspect_command(writer, read_only, operation_id)
    assert shlex.split(command) == ["settle", "inspect", "--json", "--", operation_id]


def test_in_a_real_browser_sign_in_keeps_the_filter_and_a_legacy_entry_resolves(
    redis_url: str, writer: Settler, chromium: webdriver.Chrome
) -> None:
    """``settle web`` and headless Chromium: "Sign in to resolve" on the unresolved
    entries of one kind comes back to that list, and the entry of an operation id settle
    refuses today (a line break and markup in it: another program's) opens, shows the id
    marked, and resolves."""
    legacy = legacy_entry(writer, redis_url, LEGACY_IDS["line break"])
    ns = writer.config.namespace
    driver = chromium
    with settle_web(
        "--redis-url", redis_url, "--namespace", ns, "--principal", "ana@support", token=TOKEN
    ) as url:
        listing = url + "/quarantine?kind=conflicting_settlement&status=unresolved"
        driver.get(listing)
        driver.find_element(By.LINK_TEXT, "Sign in to resolve").click()
        _loaded(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "input[type=password]"))
        password = driver.find_element(By.CSS_SELECTOR, "input[type=password]")
        password.send_keys(TOKEN)
        password.submit()
        _loaded(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".badge.signed"))
        assert driver.current_url == listing
        assert Select(driver.find_element(By.NAME, "status")).first_selected_option.text == (
            "unresolved"
        )

        driver.find_element(By.XPATH, f"//a[text()='{legacy}']").click()
        _loaded(driver, lambda d: d.find_elements(By.ID, "note"))
        title = driver.find_element(By.CSS_SELECTOR, "h1 .op-title").text
        assert title == "order-\\x0a<b>7</b>\\x1b[2J"
        assert "no record or attempt log can be read" in driver.page_source
        driver.find_element(By.ID, "note").send_keys("written by the old importer; harmless")
        driver.find_element(By.CSS_SELECTOR, "form.resolve button").click()
        _loaded(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".notice.ok"))
        shown = driver.find_element(By.CSS_SELECTOR, "pre.note").text
        assert shown == "[resolved by ana@support] written by the old importer; harmless"
        test_browser.no_script_ran(driver)
        logs = driver.get_log("browser")
    assert [e["message"] for e in logs if e["level"] == "SEVERE"] == []
    resolution = writer.quarantine.get(legacy).resolution
    assert resolution is not None


def test_settle_web_on_an_ipv6_address_prints_a_url_a_browser_opens(
    redis_url: str, writer: Settler
) -> None:
    """``settle web --host ::1`` printed ``http://::1:PORT/``, which no browser or terminal
    takes for a URL (the address's colons run into the port's). It prints
    ``http://[::1]:PORT/``, and the console answers there."""
    stderr: list[str] = []
    where = ["--redis-url", redis_url, "--namespace", writer.config.namespace]
    with settle_web(*where, host="::1", stderr=stderr) as url:
        assert url.startswith("http://[::1]:")
        assert httpx.get(url + "/", timeout=10).status_code == 200
    assert f"on {url}/ " in stderr[0], stderr[0]


@pytest.mark.asyncio
async def test_a_resolve_too_few_replicas_confirmed_says_to_reload_to_see_if_it_stands(
    redis_url: str, namespace: str, writer: Settler
) -> None:
    """With ``min_replicas`` and no replica to confirm, a resolve is written on the primary
    and unconfirmed. The page said "quarantine_resolve: 0 of 1 replicas acknowledged ...;
    read the record back", words for a program, where docs/console.md promises "a
    resolution may or may not stand, reload to see". It says that (503), and that
    resolving again with the same note is safe."""
    ref = conflicting(writer, "order-unconfirmed")
    plain = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
    durable = AsyncSettler.from_url(
        redis_url, namespace=namespace, shards=4, min_replicas=1, replica_timeout=0.2
    )
    authorize = token_authorizer(TOKEN, "alice@finance")
    try:
        # Signed in on a console without min_replicas (a sign-in waits for the replicas
        # too); the same session resolves on one with it (same key and namespace).
        signing = create_app(plain, authorize=authorize, secret_key="shared")
        resolving = create_app(durable, authorize=authorize, secret_key="shared")
        async with client_for(signing) as first:
            form = (await first.get("/signin")).text
            await first.post("/signin", data={"token": TOKEN, "csrf": csrf_of(form)})
            cookies = first.cookies
        async with client_for(resolving) as second:
            second.cookies = cookies
            page = await second.get(f"/entry/{ref}")
            refused = await second.post(
                f"/entry/{ref}/resolve", data={"csrf": csrf_of(page.text), "note": "refunded"}
            )
    finally:
        await plain.aclose()
        await durable.aclose()
    assert refused.status_code == 503
    text = html.unescape(refused.text)
    assert "may or may not stand" in text
    assert "reload the entry to see" in text
    assert "0 of 1 replicas acknowledged" in text  # what Redis answered, still said
    resolution = writer.quarantine.get(ref).resolution  # the primary has it
    assert resolution is not None


@pytest.mark.asyncio
async def test_a_refused_note_names_where_each_character_is_in_the_note_as_typed(
    writer: Settler, guarded: httpx.AsyncClient
) -> None:
    """The 400 of a note with an invisible character says where it is, counted in the box
    as the user typed it (a line break one character): the position was counted in the note
    after its line breaks and runs of spaces were folded, so past a line break (or leading
    spaces) it pointed at another character. Each character is named once, at its first place."""
    ref = conflicting(writer, "order-where")
    form = (await guarded.get("/signin")).text
    await guarded.post("/signin", data={"token": TOKEN, "csrf": csrf_of(form)})
    page = await guarded.get(f"/entry/{ref}")
    # A browser sends the box's line breaks as CRLF: each is one character in the box.
    typed = "  ok\r\n\r\nab\u200ccd\u202eef\u200cgh"  # U+200C is character 9, U+202E 12
    refused = await guarded.post(
        f"/entry/{ref}/resolve", data={"csrf": csrf_of(page.text), "note": typed}
    )
    assert refused.status_code == 400
    text = html.unescape(refused.text)
    assert "U+200C ZERO WIDTH NON-JOINER (character 9)" in text
    assert "U+202E RIGHT-TO-LEFT OVERRIDE (character 12)" in text
    assert text.count("U+200C") == 1
    assert writer.quarantine.get(ref).resolution is None


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "operation_id",
    ["order-\ue000", "order-\U0003fffe 50%\\n 'x'", "-\U000f0000$(id)"],
)
async def test_the_inspect_command_names_an_id_the_page_marks_as_it_is_stored(
    writer: Settler, read_only: httpx.AsyncClient, operation_id: str
) -> None:
    """An operation id settle takes may hold a character the page marks rather than shows
    (private use, unassigned: ``\\ue000``). The suggested ``settle inspect`` command wrote
    the id quoted but marked: pasted, it inspected ``order-\\ue000`` as typed, another
    operation. Run by a POSIX shell (dash), the command gives settle the stored id."""
    command = await _inspect_command(writer, read_only, operation_id)
    # The shell runs the pasted command with a printf in place of settle that writes each
    # argument it gets.
    shell = await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        "printf '%s\\0' " + command.removeprefix("settle "),
        stdout=asyncio.subprocess.PIPE,
    )
    argv, _ = await shell.communicate()
    assert shell.returncode == 0
    assert argv.split(b"\0")[:-1] == [b"inspect", b"--json", b"--", operation_id.encode()]


@pytest.mark.asyncio
async def test_a_resolve_during_which_redis_failed_says_to_reload_to_see_if_it_stands(
    namespace: str,
) -> None:
    """A resolve during which Redis failed (here: out of memory, so the write is refused
    while the session's read still answers) may stand or not, as an unconfirmed one: the
    page says so (503), and that resolving again with the same note is safe, not only the
    library's words."""
    with EmbeddedRedis().start() as server:
        with Settler.from_url(server.url, namespace=namespace, shards=4) as writer:
            ref = conflicting(writer, "order-paused")
        settler = AsyncSettler.from_url(server.url, namespace=namespace, shards=4)
        try:
            app = create_app(settler, authorize=token_authorizer(TOKEN, "alice@finance"))
            async with client_for(app) as client:
                form = (await client.get("/signin")).text
                await client.post("/signin", data={"token": TOKEN, "csrf": csrf_of(form)})
                page = await client.get(f"/entry/{ref}")
                with redis.Redis.from_url(server.url) as raw:
                    raw.config_set("maxmemory", 1)  # noeviction: every write refused
                    try:
                        failed = await client.post(
                            f"/entry/{ref}/resolve",
                            data={"csrf": csrf_of(page.text), "note": "refunded"},
                        )
                    finally:
                        raw.config_set("maxmemory", 0)
        finally:
            await settler.aclose()
    assert failed.status_code == 503, failed.text[:400]
    text = html.unescape(failed.text)
    assert "may or may not stand" in text
    assert "Resolving again with the same note is safe" in text


@pytest.mark.asyncio
async def test_signing_in_from_a_refused_resolve_returns_to_the_entry(
    writer: Settler, guarded: httpx.AsyncClient
) -> None:
    """A resolve whose session was over (expired, signed out in another tab) is refused,
    and its page offers "Sign in to resolve". That link's ``next`` was the address the
    form posted to, ``/entry/REF/resolve``, which only takes a POST: after signing in the
    user got a bare 405, not the entry. It returns to the entry, its resolve form there."""
    ref = conflicting(writer, "order-expired")
    refused = await guarded.post(f"/entry/{ref}/resolve", data={"csrf": "old", "note": "x"})
    assert refused.status_code == 403
    signed = await _sign_in_by_the_link(guarded, refused.text)
    assert signed.headers["location"] == f"/entry/{ref}"
    back = await guarded.get(signed.headers["location"])
    assert back.status_code == 200
    assert 'name="note"' in back.text


@pytest.mark.asyncio
async def test_the_entry_of_an_id_settle_refuses_never_says_its_record_does_not_exist(
    writer: Settler, read_only: httpx.AsyncClient, redis_url: str
) -> None:
    """The entry of an operation id settle refuses today says no record or attempt log can
    be read for it, but its record and attempt sections said "No record: it never existed
    or its retention passed" and "the record expired or never existed": evidence a reader
    takes as fact, of a record settle did not look for (the program that wrote the id may
    well hold one). They say it was not read, and why."""
    ref = legacy_entry(writer, redis_url, LEGACY_IDS["bidi override"])
    page = (await read_only.get(f"/entry/{ref}")).text
    assert "never existed" not in page
    assert "expired" not in page
    assert page.count("not read: settle does not accept this operation id") == 3
