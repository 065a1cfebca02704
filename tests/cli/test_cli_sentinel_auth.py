"""Sentinels that require a password (``requirepass`` / the default user's ACL password, an
ACL user of their own): the CLI asked every Sentinel without one, and such a deployment
could not be reached at all (exit 2 for the query parameter it did not know, or 3 with
each Sentinel's ``NOAUTH``). ``?sentinel_password=`` (and ``?sentinel_username=``) now go
to the Sentinels, the URL's userinfo still to the primary; the secret is never printed.
``cursor`` and ``progress`` take the Sentinel URL too, on the same client."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from settle import Settler
from settle.cli._context import Connection, errors_as_exit_codes
from settle.cli._sentinel import parse as parse_sentinel_url
from settle.errors import BackendError
from tests.cli.conftest import settle
from tests.faults.sentinel_support import SERVICE, SentinelDeployment, sentinel_deployment

pytestmark = pytest.mark.faults

SENTINEL_SECRET = "s3ntinel-Pass"
OPS_SECRET = "0ps-Pass"


@pytest.fixture(scope="module")
def deployment() -> Iterator[SentinelDeployment]:
    with sentinel_deployment() as d:
        with Settler.from_url(d.primary.url, namespace="guarded", shards=2) as s:
            s.check()
        with redis.Redis(port=d.sentinel.port) as c:
            c.execute_command("ACL", "SETUSER", "ops", "on", f">{OPS_SECRET}", "+@all", "~*")
            c.execute_command("ACL", "SETUSER", "default", "resetpass", f">{SENTINEL_SECRET}")
        yield d


def _url(d: SentinelDeployment, query: str = "") -> str:
    return f"redis+sentinel://{d.sentinels[0]}/{SERVICE}{query}"


def test_a_password_protected_sentinel_is_reached_with_sentinel_password(
    deployment: SentinelDeployment,
) -> None:
    url = _url(deployment, f"?sentinel_password={SENTINEL_SECRET}")
    for command in (("stats",), ("quarantine", "ls"), ("doctor",)):
        done = settle(*command, "--redis-url", url, "--namespace", "guarded", timeout=60)
        assert done.returncode == 0, (command, done.stderr)
        assert SENTINEL_SECRET not in done.stdout + done.stderr
    done = settle("doctor", "--redis-url", url, "--namespace", "guarded", timeout=60)
    assert f"127.0.0.1:{deployment.primary.port}" in done.stdout  # the primary it asked


def test_an_acl_user_of_the_sentinels_is_named_with_sentinel_username(
    deployment: SentinelDeployment,
) -> None:
    url = _url(deployment, f"?sentinel_username=ops&sentinel_password={OPS_SECRET}")
    done = settle("stats", "--redis-url", url, "--namespace", "guarded", timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("query", ["", "?sentinel_password=not-it"])
def test_a_sentinel_that_refuses_is_exit_3_naming_it_and_never_the_password(
    deployment: SentinelDeployment, query: str
) -> None:
    done = settle(
        "stats", "--redis-url", _url(deployment, query), "--namespace", "guarded", timeout=60
    )
    assert done.returncode == 3, done.stderr
    assert f"named the primary of service {SERVICE!r}" in done.stderr
    assert f"{deployment.sentinels[0]}: AuthenticationError" in done.stderr
    assert "requires a password takes ?sentinel_password=" in done.stderr  # what to give it
    assert "not-it" not in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("group", ["cursor", "progress"])
def test_cursor_and_progress_take_a_sentinel_url(
    deployment: SentinelDeployment, group: str
) -> None:
    """They refused it (exit 2, "takes no Sentinel URL"); they now read the primary the
    Sentinels name: here nothing is stored, which is their exit 1."""
    url = _url(deployment, f"?sentinel_password={SENTINEL_SECRET}")
    done = settle(group, "show", "payments", "--redis-url", url, "--namespace", "guarded")
    assert done.returncode == 1, done.stderr
    assert "takes no Sentinel URL" not in done.stderr
    assert SENTINEL_SECRET not in done.stderr


@pytest.mark.parametrize(
    "query",
    ["?sentinel_ssl=maybe", "?sentinel_ssl=yes", "?sentinel_pasword=x"],
)
def test_a_bad_sentinel_option_is_a_usage_error(query: str) -> None:
    done = settle("stats", "--redis-url", f"redis+sentinel://127.0.0.1:1/svc{query}")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr


def test_tls_asked_of_plain_sentinels_names_sentinel_ssl_no(
    deployment: SentinelDeployment,
) -> None:
    """``rediss+sentinel://`` is TLS to the Sentinels now: Sentinels on plain TCP fail the
    handshake, and the message names the option that asks them over plain TCP."""
    url = f"rediss+sentinel://{deployment.sentinels[0]}/{SERVICE}"
    done = settle("stats", "--redis-url", url, "--namespace", "guarded", timeout=60)
    assert done.returncode == 3, done.stderr
    assert "?sentinel_ssl=no" in done.stderr


def test_sentinels_out_of_reach_are_never_called_a_node_of_a_cluster(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Behind Sentinel a connection error can name a Sentinel (redis-py's
    ``MasterNotFoundError`` quotes each one's): that is no cluster node behind the primary,
    and the message names the primary in use, never "a node of the cluster"."""
    target = parse_sentinel_url("redis+sentinel://127.0.0.1:1/svc")
    conn = Connection(target.given, "ns", None, sentinel=target, primary=("127.0.0.1", 6390))
    cause = redis.ConnectionError(
        "No master found for 'svc' : Redis<ConnectionPool<Connection<host=127.0.0.1,port=1>>>"
        " - ConnectionError('Error 111 connecting to 127.0.0.1:1. Connection refused.')"
    )
    with pytest.raises(SystemExit) as exited, errors_as_exit_codes(conn):
        raise BackendError(f"ConnectionError: {cause}") from cause
    assert exited.value.code == 3
    said = capsys.readouterr().err
    assert "cluster" not in said
    assert said.startswith("settle: cannot reach Redis at redis://127.0.0.1:6390/0 (")
