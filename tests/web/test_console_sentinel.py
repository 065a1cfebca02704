"""``settle web`` behind Redis Sentinel follows a failover: the console is a long-running
server, and it asked the Sentinels for the primary once, when it started. After the primary
was killed (or demoted by ``SENTINEL FAILOVER``) it kept talking to the old one: every page
failed, or a resolve was refused, until someone restarted it. It is now built on the
Sentinel-following client (``AsyncSettler.from_sentinel``): once the replica is promoted,
pages load and a resolve is written to the new primary, with no restart."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from settle import AsyncSettler, Settler
from settle.web import create_app, token_authorizer
from tests.faults.sentinel_support import SERVICE, SentinelDeployment, sentinel_deployment
from tests.web.conftest import client_for
from tests.web.evidence import conflicting
from tests.web.server import settle_web
from tests.web.test_console_http import csrf_of

pytestmark = pytest.mark.faults

TOKEN = "sentinel-console-token"


@pytest.fixture
def deployment() -> Iterator[SentinelDeployment]:
    with sentinel_deployment() as d:
        yield d


def replicated(d: SentinelDeployment) -> None:
    """Every write of the primary is on the replica (the evidence survives the failover)."""
    with redis.Redis(port=d.primary.port, socket_timeout=5) as c:
        assert c.execute_command("WAIT", 1, 5000) >= 1


def fail_over(d: SentinelDeployment, how: str) -> None:
    if how == "kill":
        d.primary.stop(kill=True)
    else:  # the old primary stays up, a replica of the promoted one
        with d.sentinel.client() as c:
            c.execute_command("SENTINEL", "FAILOVER", SERVICE)
    d.sentinel.wait(lambda: d.sentinel.switched_to(d.replica.port), "failover")
    with redis.Redis(port=d.replica.port, socket_timeout=5) as c:
        deadline = time.monotonic() + 20
        while c.info("replication")["role"] != "master":
            assert time.monotonic() < deadline, "the replica was never promoted"
            time.sleep(0.05)


def _page_again(browser: httpx.Client, path: str, within: float = 30.0) -> httpx.Response:
    """The page, once it loads again (a 503 while the failover is under way is fine)."""
    deadline = time.monotonic() + within
    seen: list[int] = []
    while time.monotonic() < deadline:
        try:
            page = browser.get(path, timeout=15)
        except httpx.TransportError as exc:
            seen.append(-1)
            last = repr(exc)
        else:
            if page.status_code == 200:
                return page
            seen.append(page.status_code)
            last = page.text[:300]
        time.sleep(0.3)
    raise AssertionError(f"{path} never loaded again after the failover: {seen[-5:]} {last}")


@pytest.mark.parametrize("how", ["kill", "sentinel-failover"])
def test_settle_web_follows_a_failover_and_resolves_on_the_new_primary(
    deployment: SentinelDeployment, namespace: str, how: str
) -> None:
    with Settler.from_url(deployment.primary.url, namespace=namespace, shards=2) as writer:
        before = conflicting(writer, "order-before-failover")
        after = conflicting(writer, "order-after-failover")
    url = f"redis+sentinel://{deployment.sentinels[0]}/{SERVICE}"
    stderr: list[str] = []
    with (
        settle_web(
            "--redis-url",
            url,
            "--namespace",
            namespace,
            "--principal",
            "ops-ann",
            token=TOKEN,
            stderr=stderr,
        ) as base,
        httpx.Client(base_url=base) as browser,
    ):
        form = browser.get("/signin").text
        signed = browser.post("/signin", data={"token": TOKEN, "csrf": csrf_of(form)})
        assert signed.status_code == 303
        page = browser.get(f"/entry/{before}")
        assert page.status_code == 200
        done = browser.post(
            f"/entry/{before}/resolve", data={"note": "refunded", "csrf": csrf_of(page.text)}
        )
        assert done.status_code == 303
        replicated(deployment)  # the entries, the session and the first resolution

        fail_over(deployment, how)

        overview = _page_again(browser, "/")
        assert "conflicting_settlement" in overview.text
        page = _page_again(browser, f"/entry/{after}")
        assert "order-after-failover" in page.text
        done = browser.post(
            f"/entry/{after}/resolve",
            data={"note": "reconciled after the failover", "csrf": csrf_of(page.text)},
        )
        assert done.status_code == 303, done.text[:500]
        assert "signed in as ops-ann" in browser.get(f"/entry/{after}").text
    # Written to the promoted replica, the primary the Sentinels name now.
    with Settler.from_url(deployment.replica.url, namespace=namespace, shards=2) as reader:
        resolution = reader.quarantine.get(after).resolution
        assert resolution is not None
        assert resolution.note == "[resolved by ops-ann] reconciled after the failover"
        first = reader.quarantine.get(before).resolution
        assert first is not None
        assert first.note == "[resolved by ops-ann] refunded"
    assert "Traceback" not in stderr[0]


@pytest.mark.asyncio
async def test_a_mounted_console_leaves_a_demoted_primary_another_connection_learned_of(
    deployment: SentinelDeployment, namespace: str
) -> None:
    """Found in review: before each page the console compared the Sentinels' answer with the
    primary its pool knew last, and closed the connections the runner keeps only when they
    differed. Any new connection of the settler asks the Sentinels too (redis-py's Sentinel
    connection does when it connects: the service's own calls on the same settler) and
    updates the pool first: the next page saw no change, and its resolve went on a
    connection kept to the demoted primary, still writable for seconds: a 303, and the
    resolution lost with the old primary's data."""
    with Settler.from_url(deployment.primary.url, namespace=namespace, shards=2) as writer:
        before = conflicting(writer, "order-before-failover")
        after = conflicting(writer, "order-after-failover")
    settler = AsyncSettler.from_sentinel(
        deployment.sentinels, service_name=SERVICE, namespace=namespace, shards=2
    )
    try:
        app = create_app(settler, authorize=token_authorizer(TOKEN, "ops-ann"))
        async with client_for(app) as browser:
            form = (await browser.get("/signin")).text
            await browser.post("/signin", data={"token": TOKEN, "csrf": csrf_of(form)})
            page = await browser.get(f"/entry/{before}")
            done = await browser.post(
                f"/entry/{before}/resolve", data={"note": "refunded", "csrf": csrf_of(page.text)}
            )
            assert done.status_code == 303  # on a connection the runner keeps
            replicated(deployment)

            fail_over(deployment, "sentinel-failover")
            # Another connection of the settler asks the Sentinels first.
            await settler.client.connection_pool.get_master_address()

            page = await browser.get(f"/entry/{after}")
            done = await browser.post(
                f"/entry/{after}/resolve",
                data={"note": "reconciled", "csrf": csrf_of(page.text)},
            )
            assert done.status_code == 303, done.text[:500]
    finally:
        await settler.aclose()
    with Settler.from_url(deployment.replica.url, namespace=namespace, shards=2) as reader:
        resolution = reader.quarantine.get(after).resolution
        assert resolution is not None, "the resolve was written on the demoted primary"
        assert resolution.note == "[resolved by ops-ann] reconciled"
