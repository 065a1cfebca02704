"""What a review of the console's acceptance fixes checked: the refused sign-out's page,
which now shows what Redis answered, shows no secret. Real apps on real redis-servers."""

from __future__ import annotations

import secrets

import pytest
import redis

from settle import AsyncSettler, Settler
from settle._runtime.topology import has_functions
from settle.embedded import EmbeddedRedis
from settle.web import create_app, token_authorizer
from tests.web import test_console_sessions
from tests.web.conftest import TOKEN
from tests.web.test_console_http import csrf_of
from tests.web.test_console_sessions import session_of

#: A redis-server of the test's own (which the test reconfigures).
doomed = test_console_sessions.doomed

pytestmark = pytest.mark.asyncio


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
