"""The CLI behind Redis Sentinel: ``--redis-url redis+sentinel://HOST:PORT/SERVICE`` (settle's
library connects through Sentinel, the CLI refused the URL as "an unknown scheme" and an
operator had to look the primary up by hand). The commands with the connection options ask
the Sentinels for the primary when they start, ``cursor`` and ``progress`` too."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from settle import Settler
from settle.cursor import CursorStore
from settle.embedded import EmbeddedRedis
from settle.progress import DeliveryId, EmissionId, ProgressStore, ProviderScope
from tests.cli.conftest import cli_env, settle
from tests.faults.sentinel_support import (
    DOWN_AFTER_MS,
    SERVICE,
    LocalSentinel,
    SentinelDeployment,
    sentinel_deployment,
)

pytestmark = pytest.mark.faults


@pytest.fixture(scope="module")
def deployment() -> Iterator[SentinelDeployment]:
    with sentinel_deployment() as d:
        with Settler.from_url(d.primary.url, namespace="sen", shards=2) as s:
            s.check()
        yield d


def test_the_read_commands_and_doctor_take_a_sentinel_url(deployment: SentinelDeployment) -> None:
    url = f"redis+sentinel://{deployment.sentinels[0]}/{SERVICE}"
    for command in (("stats",), ("quarantine", "ls"), ("doctor",)):
        done = settle(*command, "--redis-url", url, "--namespace", "sen", timeout=60)
        assert done.returncode == 0, (command, done.stderr)
    done = settle("doctor", "--redis-url", url, "--namespace", "sen", timeout=60)
    assert f"127.0.0.1:{deployment.primary.port}" in done.stdout  # the primary it asked
    env = cli_env(SETTLE_REDIS_URL=url, SETTLE_NAMESPACE="sen")
    assert settle("stats", env=env, timeout=60).returncode == 0


def test_a_service_no_sentinel_names_is_exit_3_naming_it(deployment: SentinelDeployment) -> None:
    url = f"redis+sentinel://{deployment.sentinels[0]},127.0.0.1:1/nope"
    done = settle("stats", "--redis-url", url, "--namespace", "sen", timeout=60)
    assert done.returncode == 3, done.stderr
    assert "named the primary of service 'nope'" in done.stderr
    assert "127.0.0.1:1: ConnectionError" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://127.0.0.1/svc",
        "redis+sentinel://127.0.0.1:26379/",
        "redis+sentinel://127.0.0.1:26379/a/0/x",
    ],
)
def test_a_malformed_sentinel_url_is_a_usage_error(url: str) -> None:
    done = settle("stats", "--redis-url", url, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "redis+sentinel://[USER:PASSWORD@]HOST:PORT" in done.stderr


def _stored_through_the_primary(d: SentinelDeployment, group: str) -> str:
    """A checkpoint (cursor) or an applied delivery (progress) written on the primary: the
    name ``settle GROUP show`` is given."""
    if group == "cursor":
        cursors = CursorStore.from_url(d.primary.url, namespace="sen")
        try:
            cursors.start("ledger", b"c0")
        finally:
            cursors.close()
        return "ledger"
    scope = ProviderScope("orders", "billing", "orders@1")
    progress = ProgressStore.from_url(d.primary.url, consumer="billing", namespace="sen")
    try:
        progress.apply(scope, DeliveryId("1796479646423-1"), EmissionId("e1"), lambda ctx: None)
    finally:
        progress.close()
    return "billing"


@pytest.mark.parametrize("group", ["cursor", "progress"])
def test_the_companion_commands_read_through_a_sentinel_url(
    deployment: SentinelDeployment, group: str
) -> None:
    """Changed on purpose: ``cursor`` and ``progress`` refused a Sentinel URL (exit 2,
    "takes no Sentinel URL", naming the primary's URL to pass instead); they now ask the
    Sentinels as every command does and read what is stored on the primary they name."""
    name = _stored_through_the_primary(deployment, group)
    url = f"redis+sentinel://{deployment.sentinels[0]}/{SERVICE}"
    done = settle(group, "show", name, "--json", "--redis-url", url, "--namespace", "sen")
    assert done.returncode == 0, done.stderr
    assert name in done.stdout
    assert "takes no Sentinel URL" not in done.stderr


@pytest.mark.parametrize("command", [("stats",), ("doctor",)])
def test_the_password_goes_to_the_primary_and_is_never_printed(
    deployment: SentinelDeployment, command: tuple[str, ...]
) -> None:
    """The URL's credentials are the primary's: a wrong one is refused by the primary (exit
    3, its address named), where a URL that lost them on the way connected as the default
    user; the password is in neither output."""
    secret = "n0t-the-Passw0rd"
    url = f"redis+sentinel://app:{secret}@{deployment.sentinels[0]}/{SERVICE}"
    done = settle(*command, "--redis-url", url, "--namespace", "sen", timeout=60)
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert "refused settle's credentials" in done.stderr
    assert f"redis://app:***@127.0.0.1:{deployment.primary.port}/0" in done.stderr
    assert secret not in done.stdout + done.stderr


def test_a_primary_the_sentinels_name_by_an_ipv6_address_is_reached() -> None:
    """A Sentinel names an IPv6 primary bare (``::1``): the CLI wrote
    ``redis://::1:PORT/0``, which is no URL, and refused its own lookup as malformed."""
    with EmbeddedRedis(extra_args=["--bind", "127.0.0.1", "::1"]) as primary:
        with Settler.from_url(primary.url, namespace="six", shards=1) as s:
            s.check()
        sentinel = LocalSentinel(primary.port)
        conf = sentinel._conf
        # The Sentinel reaches its primary over IPv6 (bound to ::1 first: its connections
        # leave from its first address), and answers the CLI on 127.0.0.1.
        conf.write_text(
            conf.read_text()
            .replace("bind 127.0.0.1\n", "bind ::1 127.0.0.1\n")
            .replace(f"127.0.0.1 {primary.port}", f"::1 {primary.port}")
        )
        with sentinel.start():
            url = f"redis+sentinel://127.0.0.1:{sentinel.port}/{SERVICE}"
            done = settle("stats", "--redis-url", url, "--namespace", "six", timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_companion_command_behind_sentinel_names_the_primary_it_lost() -> None:
    """Found in review: the Sentinels still naming a primary that was just killed, ``cursor``
    and ``progress`` said "cannot reach Redis node HOST:PORT, a node of the cluster at
    redis+sentinel://..." (there is no cluster: the node is the primary), where the other
    commands say they cannot reach Redis at the primary's URL. (The Sentinel waits a minute
    before it flags the primary down: it names the killed one throughout.)"""
    primary = EmbeddedRedis().start()
    try:
        sentinel = LocalSentinel(primary.port)
        conf = sentinel._conf
        conf.write_text(
            conf.read_text().replace(
                f"down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n",
                f"down-after-milliseconds {SERVICE} 60000\n",
            )
        )
        with sentinel.start():
            url = f"redis+sentinel://127.0.0.1:{sentinel.port}/{SERVICE}"
            primary.stop(kill=True)
            for group, name in (("cursor", "ledger"), ("progress", "billing")):
                done = settle(group, "show", name, "--redis-url", url, "--namespace", "sen")
                assert done.returncode == 3, done.stderr
                assert "cluster" not in done.stderr
                assert done.stderr.startswith(
                    f"settle: cannot reach Redis at redis://127.0.0.1:{primary.port}/0 "
                ), done.stderr
    finally:
        primary.close()
