"""Credentials a server refuses: the refusal names the server, as the URL with its password
shown as ``***`` (an operator with several Redis URLs in the environment learns which one),
and never prints the password."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import redis

from settle import Settler
from settle.embedded import EmbeddedRedis
from tests.cli.conftest import settle

PASSWORD = "pw-Xq7-never-shown"
WRONG = "wrong-Zr9-never-shown"


@pytest.fixture(scope="module")
def guarded() -> Iterator[str]:
    """``host:port`` of a redis-server that takes only ``PASSWORD``."""
    server = EmbeddedRedis(extra_args=["--requirepass", PASSWORD]).start()
    try:
        yield urlsplit(server.url).netloc.rsplit("@", 1)[-1]
    finally:
        server.close()


COMMANDS = [
    ("stats",),
    ("inspect", "charge:1"),
    ("quarantine", "ls"),
    ("quarantine", "export"),
    ("cursor", "show", "orders"),
    ("cursor", "witnesses", "orders"),
    ("progress", "show", "billing"),
    ("demo", "--ops", "6"),
    ("doctor",),
    ("web", "--port", "0"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize(
    ("userinfo", "shown"),
    [(f":{WRONG}@", ":***@"), (f"bob:{WRONG}@", "bob:***@"), ("", "")],
    ids=["password", "user", "none"],
)
def test_refused_credentials_name_the_server_without_the_password(
    guarded: str, command: tuple[str, ...], userinfo: str, shown: str
) -> None:
    done = settle(*command, "--redis-url", f"redis://{userinfo}{guarded}/0", timeout=60)
    assert done.returncode == 3, done.stderr
    # It said "Redis refused settle's credentials during a command (...)": which Redis?
    # (doctor said "cannot reach Redis at ...": it was reached, and refused them)
    assert done.stderr.startswith(f"settle: Redis at redis://{shown}{guarded}/0 refused "), (
        done.stderr
    )
    assert "credentials" in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert WRONG not in done.stdout + done.stderr


@pytest.fixture(scope="module")
def scripts_refused() -> Iterator[str]:
    """``host:port`` of a redis-server with a namespace ``ns`` and a user ``app`` (password
    ``PASSWORD``) whose ACL refuses every script command."""
    server = EmbeddedRedis().start()
    try:
        with Settler.from_url(server.url, namespace="ns") as s:
            s.check()
        with redis.Redis.from_url(server.url) as admin:
            admin.acl_setuser(
                "app",
                enabled=True,
                passwords=[f"+{PASSWORD}"],
                keys=["*"],
                channels=["*"],
                commands=["+@all", "-@scripting"],
            )
        yield urlsplit(server.url).netloc.rsplit("@", 1)[-1]
    finally:
        server.close()


@pytest.mark.parametrize(
    "command", [("stats",), ("quarantine", "ls"), ("cursor", "show", "orders")], ids=" ".join
)
def test_a_refusal_to_run_settles_scripts_names_the_server(
    scripts_refused: str, command: tuple[str, ...]
) -> None:
    url = f"redis://app:{PASSWORD}@{scripts_refused}/0"
    done = settle(*command, "--redis-url", url, "--namespace", "ns", timeout=60)
    assert done.returncode == 3, done.stderr
    said = f"settle: Redis at redis://app:***@{scripts_refused}/0 refused to run settle's scripts"
    assert done.stderr.startswith(said), done.stderr
    assert PASSWORD not in done.stdout + done.stderr
