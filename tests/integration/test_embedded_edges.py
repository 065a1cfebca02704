"""EmbeddedRedis at its edges: the private files its passwords go through, in a directory
that will not take them or that another start shares, and the log it reads an error from."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from settle.embedded import EmbeddedRedis
from settle.errors import ConfigurationError

PASSWORD = "s3cret @/#: pw"


@pytest.fixture
def read_only_directory(tmp_path: Path) -> Iterator[Path]:
    """A directory this user cannot create files in: mode 0500, and immutable for root
    (whom no mode stops)."""
    directory = tmp_path / "read-only"
    directory.mkdir()
    directory.chmod(0o500)
    chattr = shutil.which("chattr") if os.geteuid() == 0 else None
    if os.geteuid() == 0 and (
        chattr is None or subprocess.run([chattr, "+i", str(directory)], check=False).returncode
    ):
        directory.chmod(0o700)
        pytest.skip("root, and no immutable directory here (chattr +i refused)")
    try:
        yield directory
    finally:
        if chattr is not None:
            subprocess.run([chattr, "-i", str(directory)], check=True)
        directory.chmod(0o700)


def _refused_before_starting(directory: Path, extra_args: list[str]) -> str:
    """start() in ``directory`` raises ConfigurationError (no other error), starts no
    server, and leaves no file of its own behind; the error's text."""
    before = sorted(directory.iterdir()) if directory.is_dir() else None
    server = EmbeddedRedis(directory=str(directory), extra_args=extra_args)
    try:
        with pytest.raises(ConfigurationError) as info:
            server.start()
        assert server.process is None
        after = sorted(directory.iterdir()) if directory.is_dir() else None
        assert [p.name for p in after or []] == [p.name for p in before or []]
    finally:
        server.close()
    message = str(info.value)
    assert PASSWORD not in message
    return message


@pytest.mark.parametrize(
    "extra_args",
    [
        ["--requirepass", PASSWORD],
        ["--user", "default", "on", f">{PASSWORD}", "~*", "+@all"],
    ],
    ids=["requirepass", "user"],
)
def test_a_directory_it_cannot_write_is_a_configuration_error(
    read_only_directory: Path, extra_args: list[str]
) -> None:
    """The private file a password goes through could not be made in the directory the
    user chose (not writable): start() raised a raw PermissionError. It raises
    ConfigurationError naming the directory and what to change, and starts nothing."""
    message = _refused_before_starting(read_only_directory, extra_args)
    assert str(read_only_directory) in message
    assert "directory" in message


@pytest.mark.parametrize("kind", ["missing", "a file"])
def test_a_directory_that_is_missing_or_no_directory_is_a_configuration_error(
    tmp_path: Path, kind: str
) -> None:
    """A directory that does not exist, or a file given as the directory: start() raised a
    raw FileNotFoundError / NotADirectoryError from the password's private file."""
    directory = tmp_path / "server"
    if kind == "a file":
        directory.write_text("not a directory\n")
    message = _refused_before_starting(directory, ["--requirepass", PASSWORD])
    assert str(directory) in message
    if kind == "a file":
        assert directory.read_text() == "not a directory\n"


def _start_together(servers: list[EmbeddedRedis]) -> list[BaseException | None]:
    """start() of each of ``servers`` in a thread of its own, all at once; what each
    raised (None when it started)."""
    barrier = threading.Barrier(len(servers))
    raised: list[BaseException | None] = [None] * len(servers)

    def start(at: int) -> None:
        barrier.wait()
        try:
            servers[at].start()
        except Exception as exc:  # reported by the test, whatever it is
            raised[at] = exc

    threads = [threading.Thread(target=start, args=(at,)) for at in range(len(servers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return raised


@pytest.mark.parametrize("rounds", [12])
def test_servers_started_at_once_in_one_directory_each_read_their_own_passwords(
    tmp_path: Path, rounds: int
) -> None:
    """Two EmbeddedRedis started at the same time in one directory wrote their private
    files under the same names (``requirepass-0.conf``, ``user-1.conf``): one removed or
    replaced the other's before its server read it, and a server started with the other's
    password (its checks refused: WRONGPASS) or not at all (no such file). Each start
    has files of its own now: both start, each with its own password only, and no file
    of theirs is left."""
    for _ in range(rounds):
        servers = [
            EmbeddedRedis(
                directory=str(tmp_path),
                extra_args=[
                    "--requirepass",
                    f"{PASSWORD}-{n}",
                    "--user",
                    "alice",
                    "on",
                    f">alice-{n}",
                    "~*",
                    "+@all",
                ],
            )
            for n in range(2)
        ]
        try:
            assert _start_together(servers) == [None, None]
            for n, server in enumerate(servers):
                with redis.Redis.from_url(server.url) as client:
                    assert client.ping() is True
                    assert client.execute_command("AUTH", "alice", f"alice-{n}") is True
                    with pytest.raises(redis.AuthenticationError):
                        client.execute_command("AUTH", "alice", f"alice-{1 - n}")
            assert [p.name for p in tmp_path.iterdir()] == ["redis.log"]
        finally:
            for server in servers:
                server.close()


def test_files_left_in_the_directory_under_the_old_names_are_left_alone(tmp_path: Path) -> None:
    """A ``requirepass-0.conf`` left in the directory (here a directory; or a file of
    another user, in a shared one) made start() fail with a raw IsADirectoryError /
    PermissionError as it removed it to write its own. Each start's files have names of
    their own now: the server starts and what was left is as it was."""
    (tmp_path / "requirepass-0.conf").mkdir()
    (tmp_path / "user-1.conf").write_text("theirs\n")
    given = ["--requirepass", PASSWORD, "--user", "alice", "on", ">alice", "~*", "+@all"]
    with (
        EmbeddedRedis(directory=str(tmp_path), extra_args=given) as server,
        redis.Redis.from_url(server.url) as client,
    ):
        assert client.ping() is True
    assert (tmp_path / "requirepass-0.conf").is_dir()
    assert (tmp_path / "user-1.conf").read_text() == "theirs\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "redis.log",
        "requirepass-0.conf",
        "user-1.conf",
    ]
