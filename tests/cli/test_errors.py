"""Bad arguments, an unreachable Redis and a wrong namespace: one clear line on stderr and
a documented exit code (2 usage, 3 Redis or namespace, 1 not found)."""

from __future__ import annotations

import json
import socket

import pytest

from settle import Reserved, Settler
from settle._runtime.urls import redacted
from settle.errors import InvalidInput
from tests.cli.conftest import cli_env, settle

#: What every command says of a namespace settle does not take: in words, not pydantic's
#: regex ("String should match pattern '^[A-Za-z0-9_.\\-]{1,64}$'").
BAD_NAMESPACE = "settle: bad --namespace: must be 1 to 64 characters of A-Z a-z 0-9 _ . -\n"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("quarantine", "ls", "--kind", "bogus"), "Invalid value for '--kind'"),
        (("quarantine", "ls", "--since", "yesterday"), "neither an ISO 8601 time"),
        (("quarantine", "ls", "--limit", "0"), "Invalid value for '--limit'"),
        (("inspect",), "Missing argument 'OPERATION_ID'"),
        (("demo", "--ops", "1"), "Invalid value for '--ops'"),
        (("demo", "--workers", "0"), "Invalid value for '--workers'"),
        (("demo", "--lease", "nan"), "Invalid value for '--lease': nan is not in the range"),
        (("quarantine", "tail", "--interval", "nan"), "Invalid value for '--interval': nan"),
        (("stats", "--shards", "0"), "Invalid value for '--shards'"),
        (("nosuchcommand",), "No such command"),
        (("stats", "--namespace", "bad ns"), BAD_NAMESPACE),
        (("demo", "--namespace", "bad ns"), BAD_NAMESPACE),
        (("inspect", "order-1", "--namespace", "n" * 65), BAD_NAMESPACE),
        (("quarantine", "ls", "--namespace", "ns\n"), BAD_NAMESPACE),
        (("web", "--namespace", "né"), BAD_NAMESPACE),
        (("cursor", "show", "s", "--namespace", "bad ns"), BAD_NAMESPACE),
        (("progress", "show", "c", "--namespace", "bad ns"), BAD_NAMESPACE),
    ],
)
def test_bad_arguments_exit_2(args: tuple[str, ...], message: str) -> None:
    done = settle(*args, "--redis-url", f"redis://127.0.0.1:{_closed_port()}/0")
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_a_bad_settle_namespace_in_the_environment_is_said_in_words() -> None:
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    done = settle("stats", env=cli_env(SETTLE_REDIS_URL=url, SETTLE_NAMESPACE="tenant:acme"))
    assert done.returncode == 2, done.stderr
    assert done.stderr == BAD_NAMESPACE


@pytest.mark.parametrize(
    "args",
    [
        ("stats",),
        ("inspect", "order-1"),
        ("quarantine", "ls"),
        ("quarantine", "show", "0/1-0"),
        ("quarantine", "tail"),
        ("quarantine", "export"),
        ("quarantine", "resolve", "0/1-0", "--note", "n"),
    ],
)
def test_unreachable_redis_exits_3_with_one_line(args: tuple[str, ...]) -> None:
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    done = settle(*args, env=cli_env(SETTLE_REDIS_URL=url))
    assert done.returncode == 3
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"settle: cannot reach Redis at {url} (ConnectionError")
    assert done.stdout == ""


def test_malformed_url_is_a_usage_error() -> None:
    done = settle("stats", "--redis-url", "http://example.invalid/")
    assert done.returncode == 2
    assert done.stderr.startswith("settle: bad --redis-url http://example.invalid/")


@pytest.mark.parametrize(
    "command",
    [("stats",), ("doctor",), ("cursor", "show", "s"), ("progress", "show", "c"), ("web",)],
)
@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:x/0?password=s3cret",  # a port that is not a number
        "redis://127.0.0.1:1/0?password=s3cret&socket_timout=1",  # an option nothing takes
        "redis://127.0.0.1:1/0?password=s3cret&ssl_password=k",  # a TLS option without TLS
    ],
)
def test_a_malformed_url_is_one_usage_line_in_every_command(
    command: tuple[str, ...], url: str
) -> None:
    # An unknown query parameter was a TypeError traceback at the first command (redis-py
    # passes it on to the connection), and doctor printed a traceback for any bad URL.
    done = settle(*command, "--redis-url", url)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("settle: bad --redis-url redis://127.0.0.1:"), done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "s3cret" not in done.stderr


@pytest.mark.parametrize(
    "command",
    [("stats",), ("doctor",), ("cursor", "show", "s"), ("progress", "show", "c"), ("web",)],
)
@pytest.mark.parametrize(
    ("url", "secret", "problem"),
    [
        # A '?', '#' or '/' typed unencoded in a password: redis-py reads the password's
        # start as the port, and its message quoted it ("... as 'pa'").
        ("redis://app:pa?ss-s3cret@127.0.0.1:6379/0", "pa", "the port is not a number"),
        ("redis://app:s3cret#tail@127.0.0.1:6379/0", "s3cret", "the port is not a number"),
        ("redis://app:s3cret/tail@127.0.0.1:6379/0", "s3cret", "the port is not a number"),
        ("redis:/app:s3cret@127.0.0.1:6379/0", "s3cret", "an unknown scheme"),  # one slash
        # urllib's message quoted the whole netloc, password and all
        ("redis://app:s3cret\uff03@127.0.0.1:6379/0", "s3cret", "characters no host"),
    ],
)
def test_a_malformed_url_never_prints_its_password(
    command: tuple[str, ...], url: str, secret: str, problem: str
) -> None:
    done = settle(*command, "--redis-url", url)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert secret not in done.stderr.replace("redis://app:***@", ""), done.stderr
    assert problem in done.stderr


def test_a_query_value_a_connection_refuses_is_a_usage_error() -> None:
    # A RedisError from the connection's constructor: a traceback in every command.
    for url, problem in [
        ("redis://127.0.0.1:1/0?protocol=9", "'protocol' is not 2 or 3"),
        ("rediss://127.0.0.1:1/0?ssl_cert_reqs=bogus", "'ssl_cert_reqs' is not valid"),
    ]:
        done = settle("stats", "--redis-url", url)
        assert done.returncode == 2, done.stderr
        assert (
            done.stderr
            == f"settle: bad --redis-url {url}: the value of the query parameter {problem}\n"
        )


def test_password_is_not_echoed(redis_url: str) -> None:
    port = _closed_port()
    done = settle("stats", "--redis-url", f"redis://app:s3cret@127.0.0.1:{port}/0")
    assert done.returncode == 3
    assert "s3cret" not in done.stderr
    assert f"redis://app:***@127.0.0.1:{port}/0" in done.stderr


def test_a_password_in_the_url_query_is_not_echoed() -> None:
    # redis-py takes ?password= (and ?ssl_password=) like the userinfo password.
    port = _closed_port()
    url = f"redis://127.0.0.1:{port}/0?db=0&password=s3cret-q"
    done = settle("stats", "--redis-url", url)
    assert done.returncode == 3
    assert "s3cret" not in done.stderr
    assert f"redis://127.0.0.1:{port}/0?db=0&password=*** " in done.stderr
    malformed = settle("stats", "--redis-url", "redis://127.0.0.1:x/0?password=s3cret-q")
    assert malformed.returncode == 2
    assert "s3cret" not in malformed.stderr


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://h/0?password=p%40ss#w0rd", "redis://h/0?password=***#***"),
        ("redis://h/0?password=p@ss", "redis://h/0?password=***"),
        ("redis://:pa/ss@h/0", "redis://:***@h/0"),
        ("unix://:pw@/run/redis.sock?db=1", "unix://:***@/run/redis.sock?db=1"),
        ("redis://app@h/0?PassWord=p", "redis://app@h/0?PassWord=***"),
        ("rediss://h/0?ssl_password=k3y&db=2", "rediss://h/0?ssl_password=***&db=2"),
        ("redis://h/0?pass%77ord=k3y", "redis://h/0?pass%77ord=***"),  # percent-encoded
        # The userinfo runs to the last '@': a '?', '#' or '/' in the password stays in it.
        ("redis://app:pa?ss-s3cret@127.0.0.1:6379/0", "redis://app:***@127.0.0.1:6379/0"),
        ("redis://app:s3cret#tail@h:6379/0", "redis://app:***@h:6379/0"),
        ("redis://app:s3cret/tail@h:6379/0?db=1", "redis://app:***@h:6379/0?db=1"),
        ("redis://app:a@b@h/0", "redis://app:***@h/0"),
        # ... unless that '@' may be in a password query value, or in the user: only the
        # scheme is shown, as it is when the URL has no scheme://.
        ("redis://h:6379/0?password=a@c", "redis://***"),
        ("redis://h:6379/0?pass%77ord=a@c", "redis://***"),
        ("redis://h:6379/0?password=a#b@c", "redis://***"),
        ("redis://h/0?password=a:b@c", "redis://***"),
        # ... or in any other query value, before a password parameter the '@' would move
        ("redis://h:6379/0?username=a@c&password=k3y", "redis://***"),
        ("redis://:pw@h:6379/0?client_name=a@c", "redis://***"),
        ("redis:/app:s3cret@h:6379/0", "redis:***"),
        ("redis:app:s3cret@h", "redis:***"),
        ("app:s3cret@h:6379", "app:***"),
        ("//app:s3cret@h:6379", "***"),
        ("http://example.invalid/", "http://example.invalid/"),
    ],
)
def test_every_password_in_a_url_is_redacted(url: str, shown: str) -> None:
    assert redacted(url) == shown


def test_missing_namespace_exits_3_and_creates_nothing(redis_url: str, namespace: str) -> None:
    done = settle("stats", "--redis-url", redis_url, "--namespace", namespace)
    assert done.returncode == 3
    assert done.stderr.strip() == (
        f"settle: namespace {namespace!r} does not exist at {redis_url} (nothing was ever "
        "written to it); check --namespace / SETTLE_NAMESPACE"
    )
    again = settle("stats", "--redis-url", redis_url, "--namespace", namespace)
    assert again.returncode == 3  # the read did not create the namespace


def test_a_database_the_server_does_not_have_is_said_for_a_standalone_server(
    redis_url: str, namespace: str
) -> None:
    """``/99`` on a standalone server: its message spoke of a Redis Cluster node alone."""
    base = redis_url.rsplit("/", 1)[0] if redis_url.count("/") > 2 else redis_url
    done = settle("stats", "--redis-url", f"{base}/99", "--namespace", namespace)
    assert done.returncode == 3
    assert "the database in the URL does not exist on the server" in done.stderr
    assert "16 by default, numbered from 0" in done.stderr


def test_shard_count_mismatch_exits_3(settler: Settler, redis_url: str, namespace: str) -> None:
    settler.check()  # the namespace exists with 4 shards
    args = ("--redis-url", redis_url, "--namespace", namespace)
    wrong = settle("stats", *args, "--shards", "16")
    assert wrong.returncode == 3
    assert wrong.stderr.strip() == (
        f"settle: namespace {namespace!r} has 4 shards, but --shards is 16; drop --shards "
        "or pass --shards 4"
    )
    assert settle("stats", *args, "--shards", "4").returncode == 0
    assert settle("stats", *args).returncode == 0  # the stored count is used
    env = cli_env(SETTLE_REDIS_URL=redis_url, SETTLE_NAMESPACE=namespace, SETTLE_SHARDS="8")
    assert settle("stats", env=env).returncode == 3


def test_configured_from_the_environment(settler: Settler, redis_url: str, namespace: str) -> None:
    r = settler.reserve("order-env", {"a": 1}, principal="tenant:x")
    assert isinstance(r, Reserved)
    settler.complete(r.reservation, {"ok": True})
    env = cli_env(SETTLE_REDIS_URL=redis_url, SETTLE_NAMESPACE=namespace)
    done = settle("inspect", "order-env", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert '"result_json": {\n      "ok": true\n    }' in done.stdout
    # a flag wins over the environment
    other = settle("inspect", "order-env", "--namespace", "elsewhere", env=env)
    assert other.returncode == 3


def test_version_and_help() -> None:
    assert settle("--version").stdout.strip() == "settle, version 0.1.0"
    helped = settle("--help")
    for command in ("demo", "inspect", "quarantine", "stats"):
        assert command in helped.stdout


def test_demo_adopts_an_existing_namespace_shard_count(
    settler: Settler, redis_url: str, namespace: str
) -> None:
    settler.check()  # 4 shards
    args = ("--redis-url", redis_url, "--namespace", namespace, "--ops", "6", "--json")
    wrong = settle("demo", *args, "--shards", "8")
    assert wrong.returncode == 3
    assert "has 4 shards, but --shards is 8" in wrong.stderr
    done = settle("demo", *args)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["shards"] == 4
    assert report["duplicate_effects"] == 0


@pytest.mark.parametrize(
    "command",
    [
        ("stats",),
        ("doctor",),
        ("inspect", "op"),
        ("cursor", "show", "s"),
        ("progress", "show", "c"),
    ],
)
@pytest.mark.parametrize(
    ("template", "code"),
    [
        ("redis://:123/rest@127.0.0.1:{port}/0", 2),
        ("redis://app:123/rest@127.0.0.1:{port}/0", 2),
        ("redis://:123?rest@127.0.0.1:{port}/0", 2),
        ("redis://:123#rest@127.0.0.1:{port}/0", 2),
        # the query's password is read whole by redis-py: tried, at a closed port (exit 3)
        ("redis://127.0.0.1:{closed}/0?password=123/rest", 3),
    ],
)
def test_a_password_with_a_slash_is_never_shown_as_the_port(
    redis_url: str, command: tuple[str, ...], template: str, code: int
) -> None:
    """redis-py ends the host part at the password's '/' and connected to port 123 without
    a password: "cannot reach Redis at redis://:***@127.0.0.1:6379/0 (ConnectionError:
    Error 111 connecting to localhost:123...)" showed the password's start as the port (and a
    user name as the host). Now it is refused before anything connects, naming the host and
    port the URL means and none of the password."""
    port = (
        redis_url.rsplit(":", 1)[1].split("/", maxsplit=1)[0] if code == 2 else str(_closed_port())
    )
    url = template.format(port=port, closed=port)
    done = settle(*command, "--redis-url", url)
    assert done.returncode == code, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert f"@127.0.0.1:{port}/0" in done.stderr or f"//127.0.0.1:{port}/0?" in done.stderr
    shown = done.stderr.replace(f"127.0.0.1:{port}", "HOST")
    assert "123" not in shown, done.stderr
    assert "rest" not in shown, done.stderr
    assert "localhost" not in shown, done.stderr
    if code == 2:
        assert "percent-encode it (%2F, %3F, %23)" in done.stderr


def test_an_at_sign_in_a_query_value_is_not_the_end_of_a_password(
    settler: Settler, redis_url: str, namespace: str
) -> None:
    """The userinfo was read up to the last '@', wherever it stood: a valid URL with a
    client name or an ACL user name holding an '@' in its query (``?client_name=billing@eu1``)
    was refused by every command as "the password holds a '/'..." although it has no
    password, and the refusal showed the query's ``password=`` after the '@' in clear."""
    r = settler.reserve("order-at", {"a": 1}, principal="tenant:x")
    assert isinstance(r, Reserved)
    url = f"{redis_url}?client_name=billing@eu1"
    done = settle("inspect", "order-at", "--json", "--namespace", namespace, "--redis-url", url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["operation_id"] == "order-at"
    # a user the server does not know: refused by Redis (exit 3), the password never shown
    port = redis_url.rsplit(":", 1)[1].split("/", maxsplit=1)[0]
    url = f"redis://127.0.0.1:{port}/0?username=alice@corp.example&password=s3cret-q"
    denied = settle("stats", "--namespace", namespace, "--redis-url", url)
    assert denied.returncode == 3, denied.stderr
    assert "s3cret" not in denied.stderr, denied.stderr


@pytest.mark.parametrize(
    "command",
    [("stats",), ("doctor",), ("cursor", "show", "s"), ("progress", "show", "c"), ("web",)],
)
def test_a_url_that_is_not_utf8_is_a_usage_error(command: tuple[str, ...], redis_url: str) -> None:
    # A byte of another encoding in the password (a Latin-1 terminal, a copied secret):
    # redis-py failed to send it to the server it reached, a UnicodeEncodeError traceback.
    server = redis_url.removeprefix("redis://").rsplit("/", 1)[0]
    url = f"redis://app:s3cr\xe9t@{server}/0".encode("latin-1")
    done = settle(*command, "--redis-url", url)  # type: ignore[arg-type]
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"settle: bad --redis-url redis://app:***@{server}/0: "
        "it holds bytes that are not UTF-8 text\n"
    )


@pytest.mark.parametrize("path", ["/O", "/db0", "/1/2", "/0x"])
def test_a_url_path_that_is_no_database_number_is_a_usage_error(
    settler: Settler, redis_url: str, namespace: str, path: str
) -> None:
    # redis-py ignores a path that is not a number (/O, a typo of /0, read database 0) and
    # drops the slashes of another (/1/2 is database 12): a command read another database
    # than the one typed, or said the namespace did not exist there.
    settler.check()  # the namespace exists, in database 0
    base = redis_url.rsplit("/", 1)[0]
    done = settle("stats", "--redis-url", base + path, "--namespace", namespace)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"settle: bad --redis-url {base}{path}: the path is not a database number "
        "(redis://host:port/0 is database 0)\n"
    )
    with pytest.raises(InvalidInput, match="the path is not a database number"):
        Settler.from_url(base + path, namespace=namespace)
    for fine in ("/0", "/", "", "/0 "):  # redis-py reads "0 " as 0 (int() strips it)
        done = settle("stats", "--redis-url", base + fine, "--namespace", namespace)
        assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "query",
    [
        "socket_timeout=-1",
        "socket_timeout=nan",
        "socket_timeout=inf",
        "socket_timeout=0",
        "socket_connect_timeout=-1",
        "socket_connect_timeout=1e400",
        "socket_connect_timeout=90000",
    ],
)
def test_a_socket_timeout_out_of_range_in_the_url_is_a_usage_error(
    settler: Settler, redis_url: str, namespace: str, query: str
) -> None:
    # redis-py takes any float and the socket refused it at connect: a ValueError
    # (-1, nan) or OverflowError (inf) traceback; 0 made the socket non-blocking.
    settler.check()
    url = f"{redis_url}?{query}&password=s3cret"
    done = settle("stats", "--redis-url", url, "--namespace", namespace)
    assert done.returncode == 2, done.stderr
    name = query.split("=", maxsplit=1)[0]
    assert done.stderr == (
        f"settle: bad --redis-url {redis_url}?{query}&password=***: the value of the query "
        f"parameter '{name}' is not a number of seconds above 0 and at most 86400\n"
    )
    with pytest.raises(InvalidInput, match=f"'{name}' is not a number of seconds"):
        Settler.from_url(url, namespace=namespace)
    fine = f"{redis_url}?{name}=2.5"
    assert settle("stats", "--redis-url", fine, "--namespace", namespace).returncode == 0


@pytest.mark.parametrize("command", [("stats",), ("quarantine", "ls"), ("inspect", "order-1")])
def test_an_unreachable_ipv6_server_is_not_called_a_node_of_a_cluster(
    command: tuple[str, ...],
) -> None:
    """redis-py names an IPv6 server ``::1:PORT``; it was parsed as host ``:`` and taken for
    another node than the URL's, so a server that never answered was called "a node of the
    cluster at redis://[::1]:PORT/0 (which answered)"."""
    url = f"redis://[::1]:{_closed_port()}/0"
    done = settle(*command, "--redis-url", url, "--redis-timeout", "1", env=cli_env(), timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith(f"settle: cannot reach Redis at {url}"), done.stderr
    assert "node of the cluster" not in done.stderr


@pytest.mark.parametrize("service", ["my%20primary", "main%0A", "%00"])
def test_a_sentinel_service_no_sentinel_can_monitor_is_a_usage_error(service: str) -> None:
    """``from_sentinel`` refuses such a ``service_name`` before anything connects; in a
    ``redis+sentinel://`` URL it was asked of every Sentinel, and the command exited 3 as if
    Redis were out of reach (here no Sentinel listens), not 2 for the URL it was given."""
    url = f"redis+sentinel://127.0.0.1:{_closed_port()}/{service}"
    done = settle("stats", "--redis-url", url)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("settle: bad --redis-url redis+sentinel://127.0.0.1:")
    assert "service_name must be" in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
