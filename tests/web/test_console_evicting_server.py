"""``settle web`` on a server whose ``maxmemory-policy`` evicts (issue 20): without a token
the console only reads, so it serves there, as the CLI's read commands read there, and
writes nothing; with one (resolving writes) it is refused, as every settler is before its
first write. The console without a token was refused: the operator the policy puts the
quarantine's evidence at risk for could not open it."""

from __future__ import annotations

import httpx
import pytest
import redis
from structlog.testing import capture_logs

from settle import Reserved, Settler
from settle._core.keys import Keys, shard_of
from settle.embedded import EmbeddedRedis
from tests.cli.conftest import cli_env, settle
from tests.cli.helpers import stale_settlement
from tests.web.server import free_port, settle_web


def _keyspace(client: redis.Redis) -> dict[bytes, bytes | None]:
    return {key: client.dump(key) for key in client.keys("*")}


def _on_shard(shard: int, shards: int) -> str:
    return next(f"op-{i}" for i in range(1000) if shard_of(f"op-{i}", shards) == shard)


@pytest.mark.parametrize("policy", ["allkeys-lru", "noeviction"])
def test_the_read_only_console_reads_and_writes_nothing_where_a_shard_state_was_lost(
    policy: str,
) -> None:
    """Its pages load and the keyspace is the same after them; the shard state the server
    lost stays lost, so the application's next write on that shard still logs
    ``settle.namespace.state_lost`` (a console that claimed the shards on its first page
    made the state again and hid the loss). On an evicting server the pages say the
    policy puts the evidence at risk."""
    with (
        EmbeddedRedis(extra_args=["--maxmemory-policy", policy]) as server,
        Settler.from_url(server.url, namespace="ev", shards=2, allow_eviction=True) as app,
        redis.Redis.from_url(server.url) as client,
    ):
        ref = stale_settlement(app, "order-1")
        lost = 1 - shard_of("order-1", 2)
        assert client.delete(Keys("ev", 2).generation(lost)) == 1  # evicted
        before = _keyspace(client)
        with settle_web("--redis-url", server.url, "--namespace", "ev") as url:
            pages = {
                path: httpx.get(url + path, timeout=30)
                for path in ("/", "/quarantine", f"/entry/{ref}", "/quarantine.jsonl")
            }
        for path, page in pages.items():
            assert page.status_code == 200, (path, page.text)
        assert ref.split("/")[1] in pages["/quarantine"].text
        assert "order-1" in pages[f"/entry/{ref}"].text
        assert ref in pages["/quarantine.jsonl"].text
        for path in ("/", "/quarantine", f"/entry/{ref}"):
            banner = "maxmemory-policy" in pages[path].text  # no banner naming noeviction
            assert banner == (policy == "allkeys-lru"), (path, pages[path].text)
            if banner:
                assert "maxmemory-policy allkeys-lru evicts" in pages[path].text
                assert "noeviction" in pages[path].text
        assert _keyspace(client) == before
        with capture_logs() as logs:
            done = app.reserve(_on_shard(lost, 2), {"amount": 1}, principal="p")
        assert isinstance(done, Reserved)
        events = [e for e in logs if e["event"] == "settle.namespace.state_lost"]
        assert len(events) == 1, logs
        assert events[0]["state_key"] == Keys("ev", 2).generation(lost)


def test_a_console_that_resolves_is_refused_on_an_evicting_server() -> None:
    """With a token, signing in writes a session and resolving writes the entry's
    resolution: refused before serving (exit 3, the policy named), nothing written."""
    with EmbeddedRedis(extra_args=["--maxmemory-policy", "allkeys-lru"]) as server:
        with Settler.from_url(server.url, namespace="ev", shards=2, allow_eviction=True) as app:
            stale_settlement(app, "order-1")
        with redis.Redis.from_url(server.url) as client:
            before = _keyspace(client)
            where = ("--redis-url", server.url, "--namespace", "ev", "--port", str(free_port()))
            done = settle("web", *where, env=cli_env(SETTLE_WEB_TOKEN="t0ken-for-ops"))
            assert done.returncode == 3, (done.stdout, done.stderr)
            assert "allkeys-lru" in done.stderr
            assert _keyspace(client) == before


@pytest.mark.parametrize("policy", ["allkeys-lru", "noeviction"])
def test_the_read_only_console_says_a_lost_metadata_and_writes_nothing(policy: str) -> None:
    """The namespace's metadata lost (evicted, deleted) after the console started, its
    entries and shard states still there: the first page is a 503 saying the metadata is
    missing, and the metadata is not made again (a console that claimed the shards on its
    first page recreated it, hiding from the application and from ``settle doctor`` that
    Redis lost it; a check that skipped the metadata served the pages as if nothing were
    lost)."""
    with EmbeddedRedis(extra_args=["--maxmemory-policy", policy]) as server:
        with Settler.from_url(server.url, namespace="ev", shards=2, allow_eviction=True) as app:
            ref = stale_settlement(app, "order-1")
        with (
            redis.Redis.from_url(server.url) as client,
            settle_web("--redis-url", server.url, "--namespace", "ev") as url,
        ):
            assert client.delete(Keys("ev", 2).meta) == 1  # lost
            before = _keyspace(client)
            page = httpx.get(url + "/quarantine", timeout=30)
            entry = httpx.get(url + f"/entry/{ref}", timeout=30)
            assert _keyspace(client) == before
        for answer in (page, entry):
            assert answer.status_code == 503, answer.text
            assert "metadata is missing" in answer.text


@pytest.mark.asyncio
async def test_the_banner_stays_when_a_later_read_of_the_policy_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The banner of an evicting server is read again every few seconds; a read that fails
    (INFO denied since, Redis failing for a moment) keeps the policy read last: the banner
    disappeared, and the page read as if the server were safe."""
    import asyncio  # noqa: PLC0415

    from settle import AsyncSettler  # noqa: PLC0415
    from settle.web import _policy, create_app  # noqa: PLC0415
    from tests.web.conftest import client_for  # noqa: PLC0415

    monkeypatch.setattr(_policy, "READ_EVERY", 0.0)  # a read due before every page
    with (
        EmbeddedRedis(extra_args=["--maxmemory-policy", "allkeys-lru"]) as server,
        Settler.from_url(server.url, namespace="ev", shards=2, allow_eviction=True) as app,
        redis.Redis.from_url(server.url) as admin,
    ):
        ref = stale_settlement(app, "order-1")
        admin.execute_command("ACL", "SETUSER", "console", "on", ">pw", "~*", "&*", "+@all")
        url = server.url.replace("redis://", "redis://console:pw@", 1)
        reader = AsyncSettler.from_url(url, namespace="ev", shards=2, allow_eviction=True)
        try:
            async with client_for(create_app(reader._reading())) as browser:
                first = await browser.get(f"/entry/{ref}")
                assert "allkeys-lru" in first.text, first.text
                admin.execute_command("ACL", "SETUSER", "console", "-info")
                pages = []
                for _ in range(3):
                    pages.append(await browser.get(f"/entry/{ref}"))
                    await asyncio.sleep(0.3)  # the read this page started has failed
            assert [p.status_code for p in pages] == [200, 200, 200]
            assert all("allkeys-lru" in p.text for p in pages), pages[-1].text
        finally:
            await reader.aclose()


@pytest.mark.asyncio
@pytest.mark.parametrize("policy", ["allkeys-lru", "noeviction"])
async def test_a_policy_never_read_is_said_until_a_read_of_it_succeeds(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """INFO denied to the console's user from the start: every page says the policy could
    not be read, so a dispute handler knows the evidence may be evicted without a word (the
    pages said nothing, as on a server that keeps everything). Once INFO is allowed, the
    next read replaces it: the evicting banner, or none on a server that does not evict."""
    import asyncio  # noqa: PLC0415

    from settle import AsyncSettler  # noqa: PLC0415
    from settle.web import _policy, create_app  # noqa: PLC0415
    from tests.acl import app_user  # noqa: PLC0415
    from tests.web.conftest import client_for  # noqa: PLC0415

    monkeypatch.setattr(_policy, "READ_EVERY", 0.0)  # a read due before every page
    unread = "could not read the maxmemory-policy of this Redis"
    with (
        EmbeddedRedis(extra_args=["--maxmemory-policy", policy]) as server,
        Settler.from_url(server.url, namespace="ev", shards=2, allow_eviction=True) as app,
    ):
        ref = stale_settlement(app, "order-1")
        url = app_user(server, "+@all", "-info", name="console")
        reader = AsyncSettler.from_url(url, namespace="ev", shards=2, allow_eviction=True)
        try:
            async with client_for(create_app(reader._reading())) as browser:
                denied = [await browser.get(path) for path in ("/", "/quarantine")]
                denied.append(await browser.get(f"/entry/{ref}"))
                app_user(server, "+@all", name="console")  # INFO allowed from now
                for _ in range(2):  # the read in flight (denied), then one sent after
                    await browser.get("/quarantine")
                    await asyncio.sleep(0.3)
                read = [await browser.get(f"/entry/{ref}"), await browser.get("/")]
        finally:
            await reader.aclose()
    for page in denied:
        assert page.status_code == 200, page.text
        assert unread in page.text, page.text
        assert "evicts:" not in page.text
    for page in read:
        assert page.status_code == 200, page.text
        assert unread not in page.text
        evicting = f"maxmemory-policy {policy} evicts" in page.text
        assert evicting == (policy == "allkeys-lru"), page.text


@pytest.mark.asyncio
@pytest.mark.parametrize("policy", ["allkeys-lru", "noeviction"])
async def test_a_policy_read_once_stands_when_info_is_denied_later(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/console.md: a primary read once keeps the policy read last if INFO is denied
    there later. The pages go on saying what was read (the evicting banner, or none on a
    server that keeps everything), never that the policy could not be read: both banners
    at once contradicted each other, and a false one on a safe server taught a dispute
    handler to ignore it."""
    import asyncio  # noqa: PLC0415

    from settle import AsyncSettler  # noqa: PLC0415
    from settle.web import _policy, create_app  # noqa: PLC0415
    from tests.acl import app_user  # noqa: PLC0415
    from tests.web.conftest import client_for  # noqa: PLC0415

    monkeypatch.setattr(_policy, "READ_EVERY", 0.0)  # a read due before every page
    with (
        EmbeddedRedis(extra_args=["--maxmemory-policy", policy]) as server,
        Settler.from_url(server.url, namespace="ev", shards=2, allow_eviction=True) as app,
    ):
        ref = stale_settlement(app, "order-1")
        url = app_user(server, "+@all", name="console")
        reader = AsyncSettler.from_url(url, namespace="ev", shards=2, allow_eviction=True)
        try:
            async with client_for(create_app(reader._reading())) as browser:
                first = await browser.get(f"/entry/{ref}")
                app_user(server, "+@all", "-info", name="console")  # INFO denied from now
                pages = []
                for _ in range(3):
                    pages.append(await browser.get(f"/entry/{ref}"))
                    await asyncio.sleep(0.3)  # the read this page started was denied
        finally:
            await reader.aclose()
    for page in [first, *pages]:
        assert page.status_code == 200, page.text
        assert "could not read the maxmemory-policy" not in page.text, page.text
        evicting = f"maxmemory-policy {policy} evicts" in page.text
        assert evicting == (policy == "allkeys-lru"), page.text
