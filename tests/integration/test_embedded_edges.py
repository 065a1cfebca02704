"""EmbeddedRedis at its edges: the private files its passwords go through, in a directory
that will not take them or that another start shares, and the log it reads an error from."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

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
