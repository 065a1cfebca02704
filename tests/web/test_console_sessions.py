"""Console sessions kept in Redis, so that they can end: sign-out, ending every session of
a principal, expiry, Redis unreachable; and the notices, notes and forms of a resolution.
Real apps (httpx ASGITransport) on real redis-servers, one of them stopped by the test."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import re
from collections.abc import AsyncIterator, Iterator

import httpx
import itsdangerous
import pytest
import pytest_asyncio
import redis
from structlog.testing import capture_logs

from settle import AsyncSettler, Settler
from settle._runtime.topology import has_functions
from settle.embedded import EmbeddedRedis
from settle.web import create_app
from settle.web._security import CSP
from settle.web.app import _console_key
from tests.cli.conftest import settle
from tests.web.conftest import TOKEN, client_for
from tests.web.evidence import conflicting, legacy_note, stale_settlement
from tests.web.server import settle_web
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


@pytest.mark.asyncio
async def test_a_copied_cookie_resolves_nothing_after_sign_out(
    writer: Settler, app: object, redis_url: str
) -> None:
    """The session was a signed cookie and nothing else: a copy of it (a shared machine, a
    proxy log, malware) kept resolving entries as the principal for 8 hours after sign-out.
    It names a session in Redis now, which sign-out deletes."""
    ref = stale_settlement(writer, "order-copied")
    async with signed_in(app) as browser:
        page = (await browser.get(f"/entry/{ref}")).text
        assert f"signed in as {PRINCIPAL}" in page
        csrf = csrf_of(page)
        async with copy_of(browser, app) as thief:
            assert (await browser.post("/signout", data={"csrf": csrf})).status_code == 303
            replay = await resolve(thief, ref, "refunded twice", csrf)
            assert replay.status_code == 403
            assert "Sign in to resolve" in replay.text
            assert writer.quarantine.get(ref).resolution is None
            shown = (await thief.get(f"/entry/{ref}")).text
            assert "signed in as" not in shown
            assert "<textarea" not in shown
            assert "Sign in" in shown


@pytest.mark.asyncio
async def test_the_session_in_redis_holds_digests_only_and_lasts_the_max_age(
    writer: Settler, reader: AsyncSettler, redis_url: str
) -> None:
    app = create_app(reader, authorize=people, session_max_age=600)
    ns = writer.config.namespace
    async with signed_in(app) as browser:
        page = (await browser.get("/")).text
        stored = session_of(browser)
        sid, csrf = stored["sid"], stored["csrf"]
        assert isinstance(sid, str)
        assert isinstance(csrf, str)
        assert "principal" not in stored  # who is signed in is Redis's to say
        with redis.Redis.from_url(redis_url) as raw:
            keys = [k.decode() for k in raw.scan_iter(match=f"settle:{{{ns}}}:console:*")]
            [key] = [k for k in keys if ":console:session:" in k]
            # Beside it, the principal's epoch: named by its digest, kept without expiry.
            assert sorted(keys) == sorted([key, f"settle:{{{ns}}}:console:epochs"])
            epochs = raw.hgetall(f"settle:{{{ns}}}:console:epochs")
            digest = hashlib.sha256(PRINCIPAL.encode()).hexdigest().encode()
            assert list(epochs) == [digest]
            assert len(epochs[digest]) == 32
            assert raw.ttl(f"settle:{{{ns}}}:console:epochs") == -1
            assert 0 < raw.ttl(key) <= 600
            blob = raw.get(key)
            assert blob is not None
            assert sid not in key
            assert sid.encode() not in blob
            assert csrf.encode() not in blob
            assert PRINCIPAL.encode() in blob  # whom the session resolves as
        assert (await browser.post("/signout", data={"csrf": csrf_of(page)})).status_code == 303
        with redis.Redis.from_url(redis_url) as raw:
            assert list(raw.scan_iter(match=f"settle:{{{ns}}}:console:session:*")) == []


@pytest.mark.asyncio
async def test_a_session_ends_when_its_max_age_passes_in_redis(
    writer: Settler, reader: AsyncSettler
) -> None:
    ref = stale_settlement(writer, "order-expired")
    app = create_app(reader, authorize=people, session_max_age=1)
    async with signed_in(app) as browser:
        page = (await browser.get(f"/entry/{ref}")).text
        assert "signed in as" in page
        await asyncio.sleep(1.5)
        async with copy_of(browser, app) as thief:
            refused = await resolve(thief, ref, "too late", csrf_of(page))
            assert refused.status_code == 403
    assert writer.quarantine.get(ref).resolution is None


@pytest.mark.asyncio
async def test_ending_every_session_of_a_principal(writer: Settler, reader: AsyncSettler) -> None:
    """After revoking alice's token, her sessions in every browser end at once; bob's do
    not."""
    from settle.web import end_sessions  # noqa: PLC0415  (new: the test fails without it)

    ref = stale_settlement(writer, "order-revoked")
    app = create_app(reader, authorize=people)
    async with (
        signed_in(app) as laptop,
        signed_in(app) as phone,
        signed_in(app, "bob-token-5e1") as bob,
    ):
        pages = [(await b.get(f"/entry/{ref}")).text for b in (laptop, phone, bob)]
        assert f"signed in as {PRINCIPAL}" in pages[0]
        assert f"signed in as {PRINCIPAL}" in pages[1]
        assert "signed in as bob@finance" in pages[2]
        await end_sessions(reader, PRINCIPAL)
        for browser, page in ((laptop, pages[0]), (phone, pages[1])):
            refused = await resolve(browser, ref, "refunded", csrf_of(page))
            assert refused.status_code == 403
            assert "signed in as" not in (await browser.get("/")).text
        assert writer.quarantine.get(ref).resolution is None
        # A sign-in after the end is a new session, as is bob's, untouched.
        assert "signed in as bob@finance" in (await bob.get("/")).text
        done = await resolve(bob, ref, "refunded ch_2", csrf_of(pages[2]))
        assert done.status_code == 303
    async with signed_in(app) as again:
        assert f"signed in as {PRINCIPAL}" in (await again.get("/")).text
    resolution = writer.quarantine.get(ref).resolution
    assert resolution is not None
    assert resolution.note == "[resolved by bob@finance] refunded ch_2"


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


def sign_out_again(response: httpx.Response) -> str:
    """The CSRF token of the page's own "Sign out again" button: a form of its main part
    (not the header's "Sign out", shown while the session still resolves) posting to
    /signout."""
    main = response.text.split("<main>", 1)[1].split("</main>", 1)[0]
    forms = [f for f in re.findall(r"<form\b.*?</form>", main, re.S) if "Sign out again" in f]
    assert len(forms) == 1, main
    assert 'method="post" action="/signout"' in forms[0]
    assert re.search(r'<button type="submit">\s*Sign out again\s*</button>', forms[0])
    return csrf_of(forms[0])


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


@pytest.mark.asyncio
async def test_with_redis_down_a_resolve_is_refused_with_the_error_page(
    doomed: EmbeddedRedis, doomed_reader: AsyncSettler
) -> None:
    """The session cannot be checked: the POST is refused (fail closed), and the page says
    why instead of a traceback."""
    app = create_app(doomed_reader, authorize=people)
    ref = (await doomed_reader.quarantine.list(limit=1))[0].ref
    async with signed_in(app) as browser:
        page = (await browser.get(f"/entry/{ref}")).text
        doomed.stop(kill=True)
        refused = await resolve(browser, ref, "refunded", csrf_of(page))
        assert_error_page(refused, 503)
        signout = await browser.post("/signout", data={"csrf": csrf_of(page)})
        assert_error_page(signout, 503)
        assert "still" in signout.text  # the session was not ended: it says so
        async with client_for(app) as other:  # a sign-in cannot start a session either
            form = (await other.get("/signin")).text
            data = {"token": TOKEN, "csrf": csrf_of(form)}
            assert_error_page(await other.post("/signin", data=data), 503)
            assert "signed in as" not in (await other.get("/signin")).text


# -- notices, notes, forms ---------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_crafted_link_shows_no_resolved_notice(writer: Settler, app: object) -> None:
    ref = stale_settlement(writer, "order-crafted")
    async with signed_in(app) as browser:
        for done in ("resolved", "already"):
            page = (await browser.get(f"/entry/{ref}", params={"done": done})).text
            assert "Resolved. The evidence is kept" not in page
            assert "already resolved" not in page
        page = (await browser.get(f"/entry/{ref}")).text
        done = await resolve(browser, ref, "voided", csrf_of(page))
        assert done.status_code == 303
        assert "done=" not in done.headers["location"]
        shown = (await browser.get(done.headers["location"])).text
        assert "Resolved. The evidence is kept" in shown
        # Said once, after the resolve; not again on a reload, not on another entry.
        assert "Resolved. The evidence is kept" not in (await browser.get(f"/entry/{ref}")).text


@pytest.mark.asyncio
async def test_a_stored_note_with_line_breaks_is_shown_as_the_cli_shows_it(
    writer: Settler, read_only: httpx.AsyncClient, redis_url: str
) -> None:
    """SPEC 8: stored values are literal text with control characters visible. The CLI
    showed a note's line break as \\x0a; the console broke the line, so a note could
    look like two notes, or push a forged second line under the first."""
    ref = conflicting(writer, "order-lines")
    legacy_note(writer, ref, "[resolved by ana] refunded\n[resolved by lead] approved\ttab")
    cli = settle(
        "quarantine",
        "show",
        ref,
        "--redis-url",
        redis_url,
        "--namespace",
        writer.config.namespace,
    )
    assert cli.returncode == 0, cli.stderr
    assert "refunded\\x0a[resolved by lead] approved\\x09tab" in cli.stdout
    html = (await read_only.get(f"/entry/{ref}")).text
    mark = '<span class="ctl" title="control character">{}</span>'
    shown = "refunded" + mark.format("\\x0a") + "[resolved by lead] approved"
    shown += mark.format("\\x09") + "tab"
    assert shown in html
    assert "refunded\n" not in html


@pytest.mark.asyncio
async def test_any_note_the_engine_accepts_fits_the_form(writer: Settler, app: object) -> None:
    """A 3,600-character Cyrillic note (7,200 bytes, ~21,600 urlencoded) was refused as
    "larger than 16 KiB"; a note of 4,096 four-byte characters is ~49 KB urlencoded."""
    cyrillic = stale_settlement(writer, "order-cyrillic")
    widest = stale_settlement(writer, "order-widest")
    too_long = stale_settlement(writer, "order-too-long")
    prefix = f"[resolved by {PRINCIPAL}] "
    room = 4096 - len(prefix)
    async with signed_in(app) as browser:
        csrf = csrf_of((await browser.get("/")).text)
        note = "возврат " * 450  # 3,600 characters
        assert (await resolve(browser, cyrillic, note, csrf)).status_code == 303
        stored = writer.quarantine.get(cyrillic).resolution
        assert stored is not None
        assert stored.note == prefix + note.strip()

        emoji = "\U0001f600" * room  # 4 bytes of UTF-8 each, 12 characters urlencoded
        assert (await resolve(browser, widest, emoji, csrf)).status_code == 303
        stored = writer.quarantine.get(widest).resolution
        assert stored is not None
        assert len(stored.note) == 4096

        refused = await resolve(browser, too_long, emoji + "\U0001f600", csrf)
        assert_error_page(refused, 400)
        assert f"at most {room} characters" in refused.text
        assert writer.quarantine.get(too_long).resolution is None


# -- settle web on a network address -----------------------------------------------------


def _served_stderr(*args: str) -> str:
    """Start ``settle web ARGS``, wait until it answers, stop it; its stderr."""
    stderr: list[str] = []
    with settle_web(*args, stderr=stderr):
        pass
    [err] = stderr
    return err


def test_settle_web_on_a_network_address_without_a_token_warns(
    redis_url: str, writer: Settler
) -> None:
    ns = writer.config.namespace
    err = _served_stderr("--redis-url", redis_url, "--namespace", ns, "--host", "0.0.0.0")
    assert "warning" in err
    assert "reachable from the network" in err
    assert "--allow-host" in err
    assert "SETTLE_WEB_TOKEN" in err
    quiet = _served_stderr("--redis-url", redis_url, "--namespace", ns)
    assert "warning" not in quiet


# -- review: sessions a sign-in replaces, end_sessions's arguments, the network warning ------


def _session_keys(redis_url: str, namespace: str) -> list[bytes]:
    with redis.Redis.from_url(redis_url) as raw:
        return list(raw.scan_iter(match=f"settle:{{{namespace}}}:console:session:*"))


@pytest.mark.asyncio
async def test_signing_in_again_ends_the_session_it_replaces(
    writer: Settler, app: object, redis_url: str
) -> None:
    """bob signs in on the browser alice left signed in (a shared machine): the browser is
    bob's, and alice's session must end with it. It lived on in Redis until its max age, so
    a copy of alice's cookie kept resolving entries as alice after the browser left her."""
    ref = stale_settlement(writer, "order-replaced")
    async with signed_in(app) as browser:
        page = (await browser.get(f"/entry/{ref}")).text
        assert f"signed in as {PRINCIPAL}" in page
        async with copy_of(browser, app) as thief:
            form = (await browser.get("/signin")).text
            data = {"token": "bob-token-5e1", "csrf": csrf_of(form)}
            assert (await browser.post("/signin", data=data)).status_code == 303
            assert "signed in as bob@finance" in (await browser.get("/")).text
            replay = await resolve(thief, ref, "refunded twice", csrf_of(page))
            assert replay.status_code == 403
            assert f"signed in as {PRINCIPAL}" not in (await thief.get("/")).text
        assert len(_session_keys(redis_url, writer.config.namespace)) == 1  # bob's alone
    assert writer.quarantine.get(ref).resolution is None


@pytest.mark.asyncio
async def test_a_refused_sign_in_leaves_the_session_signed_in(writer: Settler, app: object) -> None:
    """Only a sign-in that starts a session ends the one it replaces: a mistyped token on
    the sign-in page signs nobody out."""
    async with signed_in(app) as browser:
        form = (await browser.get("/signin")).text
        data = {"token": "mistyped", "csrf": csrf_of(form)}
        assert (await browser.post("/signin", data=data)).status_code == 403
        assert f"signed in as {PRINCIPAL}" in (await browser.get("/")).text


@pytest.mark.asyncio
async def test_end_sessions_refuses_a_sync_settler_before_writing(
    writer: Settler, redis_url: str
) -> None:
    """end_sessions(Settler) ran its INCR, then failed with "object int can't be used in
    'await' expression": the sessions had ended, but the caller saw a TypeError and could
    not tell. It refuses with a typed error saying what to pass, and writes nothing."""
    from settle.errors import InvalidInput  # noqa: PLC0415
    from settle.web import end_sessions  # noqa: PLC0415

    for settler, principal in ((writer, PRINCIPAL), (None, PRINCIPAL)):
        with pytest.raises(InvalidInput, match="AsyncSettler"):
            await end_sessions(settler, principal)  # type: ignore[arg-type]
    with redis.Redis.from_url(redis_url) as raw:
        ns = writer.config.namespace
        assert list(raw.scan_iter(match=f"settle:{{{ns}}}:console:*")) == []


@pytest.mark.asyncio
async def test_end_sessions_refuses_a_principal_no_sign_in_grants(
    reader: AsyncSettler, redis_url: str
) -> None:
    """A sign-in grants only a non-empty str; end_sessions(settler, "") or of None (a
    lookup that found nobody) ended nobody and said nothing."""
    from settle.errors import InvalidInput  # noqa: PLC0415
    from settle.web import end_sessions  # noqa: PLC0415

    for principal in ("", None, 42):
        with pytest.raises(InvalidInput, match="principal"):
            await end_sessions(reader, principal)  # type: ignore[arg-type]
    with redis.Redis.from_url(redis_url) as raw:
        ns = reader.config.namespace
        assert list(raw.scan_iter(match=f"settle:{{{ns}}}:console:*")) == []


def test_settle_web_on_a_network_address_with_a_token_warns_that_reading_is_open(
    redis_url: str, writer: Settler
) -> None:
    """A token guards resolving only; reading still needs no sign-in. With --token the
    network warning was left out (only the clear-text one was given), though the one who
    set a token is the one likely to think the console is closed."""
    ns = writer.config.namespace
    stderr: list[str] = []
    with settle_web(
        "--redis-url",
        redis_url,
        "--namespace",
        ns,
        "--host",
        "0.0.0.0",
        token=TOKEN,
        stderr=stderr,
    ):
        pass
    [err] = stderr
    assert "clear text" in err
    assert "reachable from the network" in err
    assert "reading needs no sign-in" in err


# -- review: what the mutants of the session code showed untested ------------------------


def _session_key(namespace: str, browser: httpx.AsyncClient) -> str:
    """The Redis key of ``browser``'s session (named by the SHA-256 of its id)."""
    sid = session_of(browser)["sid"]
    assert isinstance(sid, str)
    return f"settle:{{{namespace}}}:console:session:{hashlib.sha256(sid.encode()).hexdigest()}"


def _epochs_key(namespace: str) -> str:
    """The hash of the principals' epochs (a field per SHA-256 of a principal)."""
    return f"settle:{{{namespace}}}:console:epochs"


def _epoch_field(principal: str) -> str:
    return hashlib.sha256(principal.encode()).hexdigest()


def _holds_a_session(browser: httpx.AsyncClient) -> bool:
    cookies = [k for k in browser.cookies if k.startswith("settle_console_")]
    return bool(cookies) and "sid" in session_of(browser)


@pytest.mark.asyncio
async def test_an_epoch_settle_did_not_write_signs_out_and_refuses_sign_in(
    writer: Settler, app: object, redis_url: str
) -> None:
    """An epoch that is not one settle writes (written by something else) cannot say which
    sessions hold: every session of the principal is over and no new one starts (503 naming
    the key) until end_sessions replaces it."""
    ref = stale_settlement(writer, "order-garbled-count")
    ns = writer.config.namespace
    async with signed_in(app) as browser:
        page = (await browser.get(f"/entry/{ref}")).text
        with redis.Redis.from_url(redis_url) as raw:
            raw.hset(_epochs_key(ns), _epoch_field(PRINCIPAL), "garbled")
        assert "signed in as" not in (await browser.get("/")).text
        assert (await resolve(browser, ref, "refunded", csrf_of(page))).status_code == 403
        form = (await browser.get("/signin")).text
        refused = await browser.post("/signin", data={"token": TOKEN, "csrf": csrf_of(form)})
        assert_error_page(refused, 503)
        assert "console:epochs" in refused.text
        assert "signed in as" not in (await browser.get("/")).text
    assert writer.quarantine.get(ref).resolution is None


@pytest.mark.asyncio
async def test_a_lost_epoch_ends_the_sessions_started_under_it(
    writer: Settler, reader: AsyncSettler, app: object, redis_url: str
) -> None:
    """A session holds only while the principal's epoch is the one it started under: a
    lost one (HDEL, a failover) ends it as surely as a new one from end_sessions."""
    from settle.web import end_sessions  # noqa: PLC0415

    await end_sessions(reader, PRINCIPAL)
    await end_sessions(reader, PRINCIPAL)
    async with signed_in(app) as browser:  # started under the third epoch
        assert f"signed in as {PRINCIPAL}" in (await browser.get("/")).text
        with redis.Redis.from_url(redis_url) as raw:
            raw.hdel(_epochs_key(writer.config.namespace), _epoch_field(PRINCIPAL))
        assert "signed in as" not in (await browser.get("/")).text


@pytest.mark.asyncio
async def test_a_cookie_naming_a_session_with_another_csrf_token_resolves_nothing(
    writer: Settler, reader: AsyncSettler
) -> None:
    """The CSRF token is the session's own, its SHA-256 kept in Redis: a cookie that names
    a live session but carries another token (pieced together with a leaked secret_key)
    is no sign-in, though its form and cookie tokens agree."""
    ref = stale_settlement(writer, "order-pieced")
    secret = "a-secret-key-that-leaked"
    app = create_app(reader, authorize=people, secret_key=secret)
    async with signed_in(app) as browser:
        [(name, _)] = [(k, v) for k, v in browser.cookies.items() if k.startswith("settle_")]
        forged_csrf = "chosen-by-the-forger"
        forged = {**session_of(browser), "csrf": forged_csrf}
        signer = itsdangerous.TimestampSigner(_console_key(secret, writer.config.namespace))
        value = signer.sign(base64.b64encode(json.dumps(forged).encode())).decode()
        async with client_for(app) as forger:
            forger.cookies.set(name, value)
            assert "signed in as" not in (await forger.get("/")).text
            refused = await resolve(forger, ref, "refunded", forged_csrf)
            assert refused.status_code == 403
        assert f"signed in as {PRINCIPAL}" in (await browser.get("/")).text
    assert writer.quarantine.get(ref).resolution is None


@pytest.mark.asyncio
async def test_a_session_value_settle_did_not_write_is_no_sign_in(
    writer: Settler, app: object, redis_url: str
) -> None:
    """Whatever sits at a session's key that the console did not write (not JSON, other
    types) signs the browser out: no 500, no principal taken from it."""
    ns = writer.config.namespace
    async with signed_in(app) as browser:
        key = _session_key(ns, browser)
        csrf = session_of(browser)["csrf"]
        assert isinstance(csrf, str)
        digest = hashlib.sha256(csrf.encode()).hexdigest()
        blobs = [
            b"not json",
            b"[1, 2]",
            b'"a string"',
            json.dumps({"principal": PRINCIPAL, "csrf": digest}).encode(),
            json.dumps({"principal": [PRINCIPAL], "csrf": digest, "signouts": 0}).encode(),
            json.dumps({"principal": PRINCIPAL, "csrf": 7, "signouts": 0}).encode(),
        ]
        [cookie] = [c for c in browser.cookies.jar if c.name.startswith("settle_")]
        for blob in blobs:
            with redis.Redis.from_url(redis_url) as raw:
                raw.set(key, blob)
            browser.cookies.jar.set_cookie(cookie)  # the session's cookie, every time
            page = await browser.get("/")
            assert page.status_code == 200, (blob, page.text[:300])
            assert "signed in as" not in page.text, blob
            assert not _holds_a_session(browser), blob  # the cookie forgot it


@pytest.mark.asyncio
async def test_a_cookie_forgets_a_session_that_ended(
    writer: Settler, reader: AsyncSettler, app: object
) -> None:
    """After sign-out, and on the next page after end_sessions, the browser's cookie holds
    no session id (nor its CSRF token): nothing of the ended session is sent again."""
    from settle.web import end_sessions  # noqa: PLC0415

    async with signed_in(app) as browser:
        page = (await browser.get("/")).text
        assert _holds_a_session(browser)
        assert (await browser.post("/signout", data={"csrf": csrf_of(page)})).status_code == 303
        assert not _holds_a_session(browser)
    async with signed_in(app) as browser:
        assert _holds_a_session(browser)
        await end_sessions(reader, PRINCIPAL)
        assert "signed in as" not in (await browser.get("/")).text
        assert not _holds_a_session(browser)


@pytest.mark.asyncio
async def test_a_resolve_notice_does_not_outlive_the_sign_in(writer: Settler, app: object) -> None:
    """alice resolves and leaves before the entry shows again; bob signs in on the same
    browser and opens the entry: "Resolved. The evidence is kept with your note." is not
    his to read (a sign-in starts a session with nothing of the one before)."""
    ref = stale_settlement(writer, "order-left-behind")
    async with signed_in(app) as browser:
        page = (await browser.get(f"/entry/{ref}")).text
        done = await resolve(browser, ref, "voided", csrf_of(page))
        assert done.status_code == 303  # not followed: alice closed the tab
        form = (await browser.get("/signin")).text
        data = {"token": "bob-token-5e1", "csrf": csrf_of(form)}
        assert (await browser.post("/signin", data=data)).status_code == 303
        shown = (await browser.get(f"/entry/{ref}")).text
        assert "signed in as bob@finance" in shown
        assert "Resolved. The evidence is kept" not in shown


@pytest.mark.asyncio
async def test_a_form_larger_than_64_kib_is_refused_before_it_is_read_whole(
    writer: Settler, app: object
) -> None:
    """The form is read in chunks and refused (400) once past 64 KiB: a 16 MiB body sent
    in 16 KiB chunks is not read to its end, and nothing is resolved."""
    ref = stale_settlement(writer, "order-huge-form")
    pulled = 0

    async def body(csrf: str) -> AsyncIterator[bytes]:
        nonlocal pulled
        yield f"csrf={csrf}&note=".encode()
        for _ in range(1024):
            pulled += 1
            yield b"x" * 16 * 1024

    async with signed_in(app) as browser:
        csrf = csrf_of((await browser.get("/")).text)
        refused = await browser.post(
            f"/entry/{ref}/resolve",
            content=body(csrf),
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert_error_page(refused, 400)
        assert "larger than 64 KiB" in refused.text
        assert pulled <= 8, pulled
    assert writer.quarantine.get(ref).resolution is None


def _user_without(url: str, *refused: str) -> str:
    """The URL of a Redis user (made on ``url``'s server) allowed every command but
    ``refused`` (ACL rules such as ``-scan``)."""
    with redis.Redis.from_url(url) as raw:
        raw.acl_setuser(
            "console", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", *refused]
        )
    return url.replace("redis://", "redis://console:pw@", 1)


@pytest.mark.asyncio
async def test_with_scan_refused_the_overview_answers_503(
    doomed: EmbeddedRedis, namespace: str
) -> None:
    """A Redis error while walking the records (here an ACL user without SCAN, whose TIME
    and scripts work) is settle's BackendError and the error page with 503, not a 500."""
    url = _user_without(doomed.url, "-scan")
    with Settler.from_url(doomed.url, namespace=namespace, shards=4) as w:
        w.check()
        conflicting(w, "order-no-scan")
    settler = AsyncSettler.from_url(url, namespace=namespace, shards=4)
    try:
        async with client_for(create_app(settler)) as browser:
            assert (await browser.get("/quarantine")).status_code == 200  # no SCAN there
            page = await browser.get("/")
            assert_error_page(page, 503)
            assert "NOPERM" in page.text or "permission" in page.text.lower()
    finally:
        await settler.aclose()


# -- review: sessions fail closed, stale sign-out forms, the max age -----------------------


def _lose_what_ends_sessions(redis_url: str, namespace: str) -> None:
    """Every console key but the sessions themselves is lost (a DEL, a failover to a
    replica without it, an eviction): what records which sessions were ended."""
    with redis.Redis.from_url(redis_url) as raw:
        for key in raw.scan_iter(match=f"settle:{{{namespace}}}:console:*"):
            if b":console:session:" not in key:
                raw.delete(key)


@pytest.mark.asyncio
async def test_sessions_that_end_sessions_ended_stay_ended_when_redis_loses_its_record(
    writer: Settler, reader: AsyncSettler, app: object, redis_url: str
) -> None:
    """alice's token leaked and end_sessions ended her sessions; then the sign-out counter
    was lost (a DEL, a failover that lost the INCR, an eviction). The copy of her cookie
    resolved entries again: the session had recorded count 0, and a missing counter read
    as 0. A session now holds only under its principal's current epoch, and a lost epoch
    ends every session of the principal (fail closed); a sign-in after that works."""
    from settle.web import end_sessions  # noqa: PLC0415

    ref = stale_settlement(writer, "order-revived")
    ns = writer.config.namespace
    async with signed_in(app) as browser:
        page = (await browser.get(f"/entry/{ref}")).text
        assert f"signed in as {PRINCIPAL}" in page
        async with copy_of(browser, app) as thief:
            await end_sessions(reader, PRINCIPAL)
            async with copy_of(thief, app) as peek:  # the thief's own cookie unchanged
                assert "signed in as" not in (await peek.get("/")).text
            _lose_what_ends_sessions(redis_url, ns)
            assert _session_keys(redis_url, ns)  # the ended session itself is still there
            replay = await resolve(thief, ref, "refunded twice", csrf_of(page))
            assert replay.status_code == 403
            assert "signed in as" not in (await thief.get("/")).text
    assert writer.quarantine.get(ref).resolution is None
    async with signed_in(app) as again:  # a new epoch: signing in works as before
        page = (await again.get(f"/entry/{ref}")).text
        assert f"signed in as {PRINCIPAL}" in page
        assert (await resolve(again, ref, "refunded ch_9", csrf_of(page))).status_code == 303


@pytest.mark.asyncio
async def test_losing_the_record_of_ended_sessions_ends_every_session(
    writer: Settler, app: object, redis_url: str
) -> None:
    """Whether a session was ended cannot be told once Redis lost what records it, so every
    session of every principal is over (fail closed), not taken as never ended."""
    ns = writer.config.namespace
    async with signed_in(app) as alice, signed_in(app, "bob-token-5e1") as bob:
        assert f"signed in as {PRINCIPAL}" in (await alice.get("/")).text
        assert "signed in as bob@finance" in (await bob.get("/")).text
        _lose_what_ends_sessions(redis_url, ns)
        assert "signed in as" not in (await alice.get("/")).text
        assert "signed in as" not in (await bob.get("/")).text


@pytest.mark.asyncio
async def test_a_session_started_before_epochs_is_no_sign_in(
    writer: Settler, app: object, redis_url: str
) -> None:
    """The upgrade (CHANGELOG): a session stored before epochs, which recorded a sign-out
    count, is over: the browser shows the sign-in link and its cookie forgets it."""
    async with signed_in(app) as browser:
        csrf = session_of(browser)["csrf"]
        assert isinstance(csrf, str)
        digest = hashlib.sha256(csrf.encode()).hexdigest()
        old = {"principal": PRINCIPAL, "csrf": digest, "signouts": 0}
        with redis.Redis.from_url(redis_url) as raw:
            key = _session_key(writer.config.namespace, browser)
            raw.set(key, json.dumps(old), keepttl=True)
        assert "signed in as" not in (await browser.get("/")).text
        assert not _holds_a_session(browser)


async def _sign_out_form(browser: httpx.AsyncClient) -> str:
    """The CSRF token of the sign-out form of a page loaded now (a tab left open)."""
    page = (await browser.get("/")).text
    assert 'action="/signout"' in page
    return csrf_of(page)


@contextlib.asynccontextmanager
async def _a_page_of_a_brief_session(
    app: object,
) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """A browser signed in to ``app`` (1-second sessions) and the CSRF token of the sign-out
    form of a page it loaded while signed in. Under load (CI: -n 4 on 2 cores) the session,
    or its cookie in httpx's jar, which counts whole seconds, can be over before the page
    loads: then it signs in again, a few times at most."""
    for _ in range(10):
        async with signed_in(app) as browser:
            page = (await browser.get("/")).text
            if 'action="/signout"' in page:
                yield browser, csrf_of(page)
                return
    pytest.fail("no page of a 1-second session loaded while it lasted, 10 times")


@pytest.mark.asyncio
async def test_a_sign_out_form_of_a_session_that_is_over_signs_out(
    writer: Settler, reader: AsyncSettler
) -> None:
    """A sign-out form loaded before its session ended (signed out in another tab,
    end_sessions, expired) answered 403 "The form was stale": the user asked to sign out
    and was told to reload. Signing out of a dead session changes nothing, so it signs out:
    the cookie forgets the session and the signed-out page shows."""
    from settle.web import end_sessions  # noqa: PLC0415

    # Sessions of the default length where the session's end is not its expiry: a 1-second
    # cookie can lapse in httpx's jar before the next request (it counts whole seconds: one
    # set at 100.95 s is dropped at 101.0 s), so the form of a page loaded "now" was missing.
    app = create_app(reader, authorize=people)
    async with signed_in(app) as browser:  # another tab signed out first
        stale = await _sign_out_form(browser)
        assert (await browser.post("/signout", data={"csrf": stale})).status_code == 303
        done = await browser.post("/signout", data={"csrf": stale})
        assert done.status_code == 303, done.text[:300]
        assert done.headers["location"] == "/"
        assert not _holds_a_session(browser)
        assert "Sign in to resolve" in (await browser.get("/")).text
    async with signed_in(app) as browser:  # end_sessions ran
        stale = await _sign_out_form(browser)
        await end_sessions(reader, PRINCIPAL)
        done = await browser.post("/signout", data={"csrf": stale})
        assert done.status_code == 303, done.text[:300]
        assert not _holds_a_session(browser)
    brief = create_app(reader, authorize=people, session_max_age=1)
    async with _a_page_of_a_brief_session(brief) as (browser, stale):  # the session expired
        await asyncio.sleep(1.5)
        done = await browser.post("/signout", data={"csrf": stale})
        assert done.status_code == 303, done.text[:300]
        assert "Sign in to resolve" in (await browser.get(done.headers["location"])).text


@pytest.mark.asyncio
async def test_a_live_session_is_signed_out_only_with_its_csrf_token(
    writer: Settler, app: object, redis_url: str
) -> None:
    """A sign-out of a live session still needs the session's own CSRF token (a page of
    another site cannot sign the user out); a wrong one changes nothing."""
    async with signed_in(app) as browser:
        csrf = await _sign_out_form(browser)
        for forged in ({"csrf": "chosen-by-another-site"}, {}):
            refused = await browser.post("/signout", data=forged)
            assert_error_page(refused, 403)
            assert "stale" in refused.text
        assert f"signed in as {PRINCIPAL}" in (await browser.get("/")).text
        assert _session_keys(redis_url, writer.config.namespace)
        assert (await browser.post("/signout", data={"csrf": csrf})).status_code == 303
        assert _session_keys(redis_url, writer.config.namespace) == []


@pytest.mark.asyncio
@pytest.mark.parametrize("max_age", [0, -1, -3600, 1.5, "3600", True, None])
async def test_a_session_max_age_that_is_no_duration_is_refused_when_the_app_is_made(
    reader: AsyncSettler, max_age: object
) -> None:
    """session_max_age=0 (or less) was taken, and every sign-in then failed with a 503 that
    named no option (Redis refused the session's expiry). It is refused at create_app, with
    settle's InvalidInput naming the option, read-only or not."""
    from settle.errors import InvalidInput  # noqa: PLC0415

    for authorize in (people, None):
        with pytest.raises(InvalidInput, match="session_max_age"):
            create_app(reader, authorize=authorize, session_max_age=max_age)  # type: ignore[arg-type]


# -- review: what the mutants of the epochs change showed untested -----------------------


@pytest.mark.asyncio
async def test_a_session_a_lost_epoch_ended_stays_over_after_its_principal_signs_in_again(
    writer: Settler, app: object, redis_url: str
) -> None:
    """alice's epoch is lost (a DEL, a failover, an eviction), which ends a copy of her
    cookie; she signs in again, which makes her a new epoch. The copy must stay over: an
    epoch made again equal to the lost one (not random) would bring it back."""
    ref = stale_settlement(writer, "order-epoch-again")
    ns = writer.config.namespace
    async with signed_in(app) as browser:
        page = (await browser.get(f"/entry/{ref}")).text
        async with copy_of(browser, app) as thief:
            _lose_what_ends_sessions(redis_url, ns)
            async with signed_in(app) as again:
                assert f"signed in as {PRINCIPAL}" in (await again.get("/")).text
            assert "signed in as" not in (await thief.get("/")).text
            replay = await resolve(thief, ref, "refunded twice", csrf_of(page))
            assert replay.status_code == 403
    assert writer.quarantine.get(ref).resolution is None


@pytest.mark.asyncio
async def test_a_session_value_naming_another_principal_resolves_as_nobody(
    writer: Settler, reader: AsyncSettler, app: object, redis_url: str
) -> None:
    """A session value that pairs bob with alice's digest and current epoch (bob's own
    sessions were ended) does not resolve as bob; nor one whose empty epoch matches
    alice's lost one, nor one with fields of the wrong type (no 500): the browser is
    signed out."""
    from settle.web import end_sessions  # noqa: PLC0415

    ns = writer.config.namespace
    alice = _epoch_field(PRINCIPAL)
    async with signed_in(app) as browser:
        await end_sessions(reader, "bob@finance")
        csrf = session_of(browser)["csrf"]
        assert isinstance(csrf, str)
        digest = hashlib.sha256(csrf.encode()).hexdigest()
        key = _session_key(ns, browser)
        with redis.Redis.from_url(redis_url) as raw:
            epoch = raw.hget(_epochs_key(ns), alice)
        assert epoch is not None
        current = {"principal": PRINCIPAL, "pd": alice, "csrf": digest, "epoch": epoch.decode()}
        crafted = [
            ({**current, "principal": "bob@finance"}, False),
            ({**current, "epoch": ""}, True),  # alice's epoch lost: both "" if compared
            ({**current, "csrf": 7}, False),
            ({**current, "principal": [PRINCIPAL]}, False),
            ({**current, "epoch": 7}, False),
        ]
        [cookie] = [c for c in browser.cookies.jar if c.name.startswith("settle_")]
        for value, lose_epoch in crafted:
            with redis.Redis.from_url(redis_url) as raw:
                raw.set(key, json.dumps(value), ex=600)
                if lose_epoch:
                    raw.hdel(_epochs_key(ns), alice)
            browser.cookies.jar.set_cookie(cookie)  # the session's cookie, every time
            page = await browser.get("/")
            assert page.status_code == 200, (value, page.text[:300])
            assert "signed in as" not in page.text, value
            assert not _holds_a_session(browser), value


@pytest.mark.asyncio
async def test_every_epoch_that_is_not_32_lowercase_hex_digits_refuses_sign_in(
    writer: Settler, app: object, redis_url: str
) -> None:
    """docs/console.md: an epoch settle did not write (too short, too long, upper case,
    not hex, empty) starts no session: the sign-in answers 503 naming the key."""
    ns = writer.config.namespace
    for garbled in ("1", "0" * 31, "0" * 33, "A" * 32, "0" * 31 + "g", ""):
        with redis.Redis.from_url(redis_url) as raw:
            raw.hset(_epochs_key(ns), _epoch_field(PRINCIPAL), garbled)
        async with client_for(app) as browser:
            form = (await browser.get("/signin")).text
            data = {"token": TOKEN, "csrf": csrf_of(form)}
            refused = await browser.post("/signin", data=data)
            assert_error_page(refused, 503)
            assert "console:epochs" in refused.text, garbled
            assert "signed in as" not in (await browser.get("/")).text, garbled
    assert _session_keys(redis_url, ns) == []


@pytest.mark.asyncio
async def test_a_stale_sign_out_form_while_redis_is_down_says_redis_cannot_be_reached(
    doomed: EmbeddedRedis, doomed_reader: AsyncSettler
) -> None:
    """With Redis down, a sign-out form without the session's token answered 403 "The form
    was stale; reload and retry.": reloading shows the user signed out (Redis cannot say)
    and changes nothing. Whether the session is over cannot be told, so nothing is signed
    out (fail closed), and the page says why: Redis, 503, the session still signed in."""
    app = create_app(doomed_reader, authorize=people)
    async with signed_in(app) as browser:
        await _sign_out_form(browser)
        doomed.stop(kill=True)
        for stale in ({"csrf": "a-form-of-an-ended-session"}, {}):
            refused = await browser.post("/signout", data=stale)
            assert_error_page(refused, 503)
            assert "Redis cannot be reached" in refused.text
            assert "still signed in" in refused.text
            assert _holds_a_session(browser)  # kept, to sign out when Redis is back
            # the page's button signs this session out, with the session's own token
            assert sign_out_again(refused) == session_of(browser)["csrf"]


@pytest.mark.asyncio
async def test_a_session_redis_could_not_check_is_not_signed_out_without_its_token(
    doomed: EmbeddedRedis, namespace: str
) -> None:
    """The sign-out of a session that is over needs no CSRF token; one Redis could not
    check (here a user whose ACL refuses the check's script, as EVALSHA on Redis 6.2 and as
    FCALL on Redis 7+ / Valkey, but allows DEL) is not known to be over, so a form without
    its token deletes nothing: the session stays."""
    with redis.Redis.from_url(doomed.url) as raw:
        fcall = ("-fcall", "-fcall_ro") if has_functions(raw.info("server")) else ()
    url = _user_without(doomed.url, "-evalsha", "-eval", "-script", *fcall)
    full = AsyncSettler.from_url(doomed.url, namespace=namespace, shards=4)
    limited = AsyncSettler.from_url(url, namespace=namespace, shards=4)
    secret = "one-key-for-both-processes"
    try:
        async with signed_in(create_app(full, authorize=people, secret_key=secret)) as browser:
            crippled = create_app(limited, authorize=people, secret_key=secret)
            async with copy_of(browser, crippled) as other:
                refused = await other.post("/signout", data={"csrf": "not-the-session's"})
                assert_error_page(refused, 503)
                assert "still signed in" in refused.text
            assert _session_keys(doomed.url, namespace)
            assert f"signed in as {PRINCIPAL}" in (await browser.get("/")).text
    finally:
        await limited.aclose()
        await full.aclose()


@pytest.mark.asyncio
async def test_sessions_hold_after_script_flush_and_for_a_principal_of_any_text(
    writer: Settler, reader: AsyncSettler, redis_url: str
) -> None:
    """The session scripts are loaded again when Redis forgot them (SCRIPT FLUSH, a restart,
    a failover: NOSCRIPT); a principal with quotes, slashes, control characters and
    non-ASCII text round-trips through the session's JSON, and end_sessions ends it."""
    from settle.web import end_sessions  # noqa: PLC0415

    odd = 'ana/ops "lead" \\ ✓ \U0001f600\x00\x7f'
    tokens = {TOKEN: odd}
    app = create_app(reader, authorize=tokens.get)
    async with signed_in(app) as browser:
        with redis.Redis.from_url(redis_url) as raw:
            raw.script_flush()
        page = await browser.get("/")
        assert page.status_code == 200
        assert "signed in as ana/ops &#34;lead&#34;" in page.text
        with redis.Redis.from_url(redis_url) as raw:
            raw.script_flush()
        async with signed_in(app) as other:  # a sign-in after the flush
            assert "signed in as ana/ops" in (await other.get("/")).text
            await end_sessions(reader, odd)
            assert "signed in as" not in (await other.get("/")).text
        assert "signed in as" not in (await browser.get("/")).text


@pytest.mark.asyncio
async def test_a_sign_out_of_a_session_that_is_over_is_logged_not_refused(
    writer: Settler, reader: AsyncSettler, app: object
) -> None:
    """docs/console.md's logs: the sign-out of a session already over logs
    settle.web.signed_out_already, not a refusal."""
    from settle.web import end_sessions  # noqa: PLC0415

    async with signed_in(app) as browser:
        stale = await _sign_out_form(browser)
        await end_sessions(reader, PRINCIPAL)
        with capture_logs() as logs:
            done = await browser.post("/signout", data={"csrf": stale})
        assert done.status_code == 303
        events = [e["event"] for e in logs]
        assert "settle.web.signed_out_already" in events
        assert "settle.web.refused" not in events
