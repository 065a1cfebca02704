"""Credentials a server refuses: the refusal names the server, as the URL with its password
shown as ``***`` (an operator with several Redis URLs in the environment learns which one),
and never prints the password."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

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
