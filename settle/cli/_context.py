"""What every ``settle`` command shares: connection options, the exit codes, turning a
library error into one clear line on stderr, and connecting to an existing namespace."""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import Any, NoReturn, TypeVar
from urllib.parse import parse_qs, urlsplit

import click
import structlog
from pydantic import ValidationError
from redis import ConnectionPool, Redis
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import RedisError, ResponseError
from redis.retry import Retry

from settle._core.codec import UndecodableEntry
from settle._core.keys import Keys
from settle._exit import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE

# Exit codes scripts can rely on (docs/cli.md), shared with the cursor and progress groups.
from settle._input import is_decimal
from settle._runtime import topology
from settle._runtime._sync import client_from_url, sentinel_client
from settle._runtime.urls import check, redacted, url_problem
from settle._sync.settler import Settler
from settle._text import as_text
from settle.cli._render import visible_message
from settle.cli._sentinel import SentinelUrl, is_sentinel_url
from settle.cli._sentinel import ask as ask_sentinels
from settle.cli._sentinel import parse as parse_sentinel_url
from settle.config import MAX_SHARDS, SettleConfig
from settle.demo.server import client_of
from settle.errors import (
    BackendError,
    ConfigurationError,
    InvalidInput,
    SettleError,
)

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "EXIT_WHEN_READER_STOPS",
    "REDIS_TIMEOUT",
    "Connection",
    "EnvOption",
    "OutputGroup",
    "checked_namespace",
    "checked_url",
    "configure_logging",
    "connection_options",
    "connection_options_for",
    "drop_stdout",
    "errors_as_exit_codes",
    "exit_code_of",
    "fail",
    "forget_interrupt",
    "json_option",
    "name_undecodable",
    "open_settler",
    "options_named",
    "remember_interrupt",
    "say_undecodable",
    "settings",
]

F = TypeVar("F", bound=Callable[..., Any])

#: ``ctx.meta`` key: the exit code when the reader of stdout stops (``| head``) before the
#: command ends, where that is not 0: the demo's failed check (``settle.cli.main``).
EXIT_WHEN_READER_STOPS = "settle.exit_when_reader_stops"

DEFAULT_URL = "redis://localhost:6379/0"
DEFAULT_NAMESPACE = "default"


class _OutputFailed(OSError):
    """A write to stdout failed (a full disk, ``> /dev/full``): told apart from every other
    ``OSError`` by :class:`_Stdout`, which raises it."""


class _Stdout:
    """``sys.stdout`` whose failed writes are :class:`_OutputFailed` (a reader that stopped
    stays ``BrokenPipeError``, which ends a command quietly); everything else is the
    stream's own. ``stream`` None: stdout was closed when settle started (``>&-``, where
    Python has no ``sys.stdout``), and every write fails, where a table ended in an
    ``AttributeError`` and JSON or help went nowhere with exit 0."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _open(self) -> Any:
        if self._stream is None:
            raise OSError(errno.EBADF, "stdout is closed")
        return self._stream

    def write(self, text: str) -> int:
        with _as_output_failure():
            return int(self._open().write(text))

    def writelines(self, lines: Any) -> None:
        with _as_output_failure():
            self._open().writelines(lines)

    def flush(self) -> None:
        if self._stream is not None:  # closed: nothing was written, nothing to flush
            with _as_output_failure():
                self._stream.flush()

    def isatty(self) -> bool:
        return self._stream is not None and bool(self._stream.isatty())

    def fileno(self) -> int:
        if self._stream is None:
            raise io.UnsupportedOperation("stdout is closed")
        return int(self._stream.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)  # closed (None): an AttributeError


@contextlib.contextmanager
def _as_output_failure() -> Iterator[None]:
    try:
        yield
    except (BrokenPipeError, _OutputFailed):
        raise
    except OSError as exc:
        raise _OutputFailed(exc.errno, exc.strerror) from exc


def _guard_stdout() -> None:
    stream: Any = sys.stdout
    if not isinstance(stream, _Stdout):
        sys.stdout = _Stdout(stream)


def _flush_stdout() -> None:
    stream: Any = sys.stdout
    if stream is not None:
        stream.flush()


def drop_stdout() -> None:
    """What is still buffered for stdout goes nowhere, so the flush at exit does not fail
    again (after a reader that stopped, or a failed write that was said); stdout closed
    (``>&-``): there is nothing to drop."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _reader_gone(code: int) -> NoReturn:
    drop_stdout()
    sys.exit(code)


class OutputGroup(click.Group):
    """A group whose output never ends in a traceback: ``settle`` and the companion groups
    run alone (``python -m settle.cli.cursor``).

    A program reading the output that stops (``settle inspect ... | head -3``, ``settle
    --help | head -0``) ends the command quietly with exit 0, as ``git log | head`` does, in
    every command and in help: click's own handling exits 1, the code the docs give to "not
    found", and a script under ``set -o pipefail`` took it for that. A write that fails
    otherwise (a full disk, ``> /dev/full``) is one line on stderr and exit 1, as
    ``quarantine export`` says it (docs/cli.md, "Exit codes"). Ctrl-C is ``settle:
    interrupted`` and exit 130 (``quarantine tail`` ends with 0, the demo says more)."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        _guard_stdout()
        exiting: SystemExit | None = None
        try:
            try:
                done = super().main(*args, **kwargs)
            except SystemExit as exc:  # standalone (the console script): always
                exiting = exc
            _flush_stdout()  # what is still buffered: a failure is said here, not at exit
        except BrokenPipeError:  # the reader stopped before the last flush: the code stands
            _reader_gone(exiting.code if exiting and isinstance(exiting.code, int) else EXIT_OK)
        except _OutputFailed as exc:
            drop_stdout()
            with contextlib.suppress(OSError):  # stderr full too: the exit code says it
                fail(
                    "the output to stdout is incomplete: a write failed "
                    f"({exc.strerror or os.strerror(exc.errno or errno.EIO)})",
                    EXIT_FAILED,
                )
            sys.exit(EXIT_FAILED)
        if exiting is not None:
            raise exiting
        return done

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        # --help and --version print while the arguments are parsed, before invoke
        try:
            return super().make_context(*args, **kwargs)
        except BrokenPipeError:
            _reader_gone(EXIT_OK)

    def invoke(self, ctx: click.Context) -> Any:
        with _interrupts_kept():
            try:
                done = super().invoke(ctx)
            except BrokenPipeError:
                _reader_gone(ctx.meta.get(EXIT_WHEN_READER_STOPS, EXIT_OK))
            except KeyboardInterrupt:  # click's "Aborted!" exits 1, the code for "not found"
                fail("interrupted", EXIT_INTERRUPTED)
            except SystemExit as exc:  # a failure said after a Ctrl-C that was lost
                if _INTERRUPTED.is_set() and exc.code not in (None, EXIT_OK, EXIT_INTERRUPTED):
                    fail("interrupted", EXIT_INTERRUPTED)
                raise
            # A Ctrl-C lost in a finalizer, and the command then ran to its end: the
            # operator stopped it, and a script must not read exit 0 (nor did the command
            # say anything, its "Exception ignored" hidden).
            if _LOST.is_set():
                fail("interrupted", EXIT_INTERRUPTED)
            return done


#: Set by Ctrl-C while a command runs (:func:`_interrupts_kept`).
_INTERRUPTED = threading.Event()
#: Set when the ``KeyboardInterrupt`` of such a Ctrl-C was lost (raised in a finalizer).
_LOST = threading.Event()


@contextlib.contextmanager
def _interrupts_kept() -> Iterator[None]:
    """Ctrl-C during a command is remembered as well as raised. Python loses the
    ``KeyboardInterrupt`` of a Ctrl-C that lands while a finalizer or the garbage collector
    runs (redis-py's ``__del__`` of a connection or pool: it prints "Exception ignored" and
    goes on), and the command went on waiting for Redis, then failed as if Redis were down:
    ``cannot reach Redis``, exit 3, for an operator who pressed Ctrl-C. A failure after a
    Ctrl-C is said as ``interrupted``, exit 130 (:func:`fail`), the lost raise is not printed,
    and the wait it could not cut short lasts at most ``--redis-timeout``; a command that
    runs to its end after a lost one says ``interrupted`` too (it said nothing, exit 0, its
    output whole though the operator had stopped it). Off the main
    thread (a command invoked from a thread), Python's own handling stands."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _INTERRUPTED.clear()
    _LOST.clear()

    def interrupt(signum: int, frame: FrameType | None) -> None:
        _INTERRUPTED.set()
        signal.default_int_handler(signum, frame)

    def unraisable(info: Any) -> None:
        if isinstance(info.exc_value, KeyboardInterrupt) and _INTERRUPTED.is_set():
            _LOST.set()
            return  # the Ctrl-C is said as "interrupted", once, by the command's end
        before_hook(info)

    before, before_hook = signal.getsignal(signal.SIGINT), sys.unraisablehook
    if before is not signal.default_int_handler:  # ignored, or the application's own
        yield
        return
    signal.signal(signal.SIGINT, interrupt)
    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
        sys.unraisablehook = before_hook
        _INTERRUPTED.clear()  # said by now; a later command (a test's runner) starts anew
        _LOST.clear()


def remember_interrupt() -> None:
    """Told by a command's own Ctrl-C handler (``quarantine tail``'s), which replaced the
    group's: a failure after a Ctrl-C whose raise was lost is ``interrupted``, exit 130
    (:func:`fail`), and the lost raise is not printed."""
    _INTERRUPTED.set()


def forget_interrupt() -> None:
    """The command ended by its Ctrl-C, as it is meant to (``quarantine tail``: exit 0, or 1
    after an entry it could not decode): its own exit code stands."""
    _INTERRUPTED.clear()
    _LOST.clear()


class EnvOption(click.Option):
    """An option that also reads the environment, refusing a variable that is set but empty
    (or blank): click reads ``SETTLE_NAMESPACE=`` as unset, so an operator who exported it
    empty by mistake inspected namespace ``default`` and was told nothing. A flag on the
    command line still wins, and the variable is then not read. The refusal is a usage error
    (exit 2) naming the variable."""

    def resolve_envvar_value(self, ctx: click.Context) -> str | None:
        names = [self.envvar] if isinstance(self.envvar, str) else list(self.envvar or ())
        for name in names:
            value = os.environ.get(name)
            if value is not None and not value.strip():
                raise click.BadParameter(
                    f"{name} is set but empty; give it a value, or unset it "
                    f"(unset {name}) to use the default",
                    ctx=ctx,
                    param=self,
                )
            if value:
                return value
        return None


#: Seconds a command waits for each Redis reply, and the console for each page's
#: (``--redis-timeout`` / ``SETTLE_REDIS_TIMEOUT``).
REDIS_TIMEOUT = 5.0


class Connection:
    """The connection options of one command: ``--redis-url``, ``--namespace``,
    ``--shards``, ``--redis-timeout``."""

    def __init__(
        self,
        redis_url: str | None,
        namespace: str,
        shards: int | None,
        redis_timeout: float = REDIS_TIMEOUT,
        sentinel: SentinelUrl | None = None,
        primary: tuple[str, int] | None = None,
    ) -> None:
        self.redis_url = redis_url
        self.namespace = namespace
        self.shards = shards
        self.redis_timeout = redis_timeout
        #: The namespace's shard count once read (an error names the shards on a node).
        self.known_shards: int | None = None
        #: A ``redis+sentinel://`` URL read, and the primary its Sentinels named at start.
        self.sentinel = sentinel
        self.primary = primary
        #: The Sentinel-following client in use (its pool knows the primary it reached).
        self.following: Redis | None = None

    @property
    def url(self) -> str:
        """The URL of the server in use: behind Sentinel, the primary's (the one the
        client reached last, else the one named at start), which every message names."""
        if self.sentinel is not None and self.primary is not None:
            pool = getattr(self.following, "connection_pool", None)
            host, port = getattr(pool, "master_address", None) or self.primary
            return self.sentinel.primary_url(str(host), int(port))
        # None only: an empty --redis-url '' is refused as malformed, never the default
        return DEFAULT_URL if self.redis_url is None else self.redis_url


def connection_options(fn: F) -> F:
    """Add ``--redis-url`` / ``--namespace`` / ``--shards`` (also from the environment) and
    pass them to the command as one ``conn`` argument."""
    return connection_options_for(DEFAULT_NAMESPACE)(fn)


def connection_options_for(default_namespace: str, url_help: str | None = None) -> Callable[[F], F]:
    """:func:`connection_options` with another default namespace (the demo's)."""
    return functools.partial(_connection_options, default_namespace, url_help)


def _a_number(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """``--redis-timeout`` unless NaN, which ``FloatRange`` lets through (the socket then
    refused it with a traceback)."""
    del ctx
    if value != value:  # noqa: PLR0124 - NaN is the one value unequal to itself
        raise click.BadParameter("must be a number of seconds, not nan", param=param)
    return value


def redis_timeout_option(fn: F) -> F:
    """``--redis-timeout SECONDS`` / ``SETTLE_REDIS_TIMEOUT``, passed as ``redis_timeout``
    (every command that connects: the connection options' and the companions')."""
    option = click.option(
        "--redis-timeout",
        envvar="SETTLE_REDIS_TIMEOUT",
        cls=EnvOption,
        type=click.FloatRange(0, 300, min_open=True),
        default=REDIS_TIMEOUT,
        show_default=True,
        metavar="SECONDS",
        callback=_a_number,
        help="How long to wait for Redis (env SETTLE_REDIS_TIMEOUT): for each reply, or "
        "in settle web for each page; then exit 3 (a 503 page). A ?socket_timeout= in the "
        "URL wins for replies.",
    )
    return option(fn)


def companion_client(conn: Connection) -> Redis:
    """The client of ``conn``'s URL for the companions' stores (``cursor``, ``progress``),
    as every command's: checked (exit 2 when malformed), waiting at most its
    ``--redis-timeout`` (:func:`bounded`); behind Sentinel the Sentinel-following one, the
    Sentinels asked first (exit 3 when none names the primary) and ``conn`` naming the
    primary in use, never "a node of the cluster"."""
    find_primary(conn)
    return connected(conn)


def find_primary(conn: Connection) -> None:
    """Behind Sentinel (a ``redis+sentinel://`` URL), the Sentinels asked for the primary
    (:func:`~settle.cli._sentinel.ask`), which ``conn`` names until the client reaches one;
    else nothing."""
    if conn.redis_url is not None and is_sentinel_url(conn.redis_url):
        conn.sentinel = parse_sentinel_url(conn.redis_url)
        conn.primary = ask_sentinels(conn.sentinel, conn.redis_timeout)


def connected(conn: Connection) -> Redis:
    """The client of ``conn`` (nothing connected yet), waiting at most its
    ``--redis-timeout`` for a connection and each reply as :func:`bounded`: behind Sentinel
    the library's Sentinel-following one (``from_sentinel``'s), which ``conn`` keeps to name
    the primary it reached."""
    if conn.sentinel is None or conn.primary is None:
        url = checked_url(conn.url)
        return bounded(client_from_url(url), url, conn.redis_timeout)
    target, timeout = conn.sentinel, conn.redis_timeout
    client = sentinel_client(
        list(target.sentinels),
        target.service,
        target.client_options(),
        target.sentinel_options(timeout),
    )
    conn.following = bounded(client, target.primary_url(*conn.primary), timeout)
    return conn.following


def _connection_options(default_namespace: str, url_help: str | None, fn: F) -> F:
    @click.option(
        "--redis-url",
        envvar="SETTLE_REDIS_URL",
        cls=EnvOption,
        default=None,
        metavar="URL",
        help=url_help or f"Redis to use (env SETTLE_REDIS_URL; default {DEFAULT_URL}).",
    )
    @click.option(
        "--namespace",
        envvar="SETTLE_NAMESPACE",
        cls=EnvOption,
        default=default_namespace,
        show_default=True,
        help="settle namespace (env SETTLE_NAMESPACE).",
    )
    @click.option(
        "--shards",
        envvar="SETTLE_SHARDS",
        cls=EnvOption,
        type=click.IntRange(1, MAX_SHARDS),
        default=None,
        help="Shard count of the namespace (env SETTLE_SHARDS). Read commands use the "
        "namespace's stored count when not given, and refuse a different one.",
    )
    @redis_timeout_option
    @functools.wraps(fn)
    def wrapper(
        redis_url: str | None,
        namespace: str,
        shards: int | None,
        redis_timeout: float,
        **kw: Any,
    ) -> Any:
        conn = Connection(redis_url, namespace, shards, redis_timeout)
        with errors_as_exit_codes():
            find_primary(conn)
        return fn(conn=conn, **kw)

    return wrapper  # type: ignore[return-value]


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")(fn)


def fail(message: str, code: int) -> NoReturn:
    """Print one line on stderr (control characters made visible) and exit with ``code``;
    after a Ctrl-C whose ``KeyboardInterrupt`` was lost (:func:`_interrupts_kept`), the
    failure it caused is ``interrupted``, exit 130."""
    if _INTERRUPTED.is_set() and code != EXIT_INTERRUPTED:
        message, code = "interrupted", EXIT_INTERRUPTED
    click.echo(f"settle: {visible_message(message)}", err=True)
    sys.exit(code)


def exit_code_of(exc: SettleError) -> int:
    """3 for Redis or the namespace, 2 for bad input, 1 for the rest (not found...)."""
    if isinstance(exc, BackendError | ConfigurationError):
        return EXIT_UNAVAILABLE
    if isinstance(exc, InvalidInput):
        return EXIT_USAGE
    return EXIT_FAILED


def _one_line(text: str) -> str:
    return " ".join(text.split())


@contextlib.contextmanager
def errors_as_exit_codes(conn: Connection | None = None, task: str = "") -> Iterator[None]:
    """Turn a :class:`SettleError` into one line on stderr and its exit code. A Redis
    failure names what the command was doing (``task``: "read the checkpoint of 's'"), not
    the script it ran."""
    try:
        yield
    except BackendError as exc:
        where = f" at {redacted(conn.url)}" if conn is not None else ""
        cause = exc.__cause__
        detail = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
        doing = f" to {task}" if task else ""
        if exc.code:  # Redis answered, with an error: it was reached
            fail(f"Redis{where} refused the command{doing} ({_one_line(detail)})", EXIT_UNAVAILABLE)
        node = _other_node(detail, conn)
        if conn is not None and node is not None:
            fail(
                f"cannot reach Redis node {node}{_shards_on(conn, node)}, a node of the cluster "
                f"at {redacted(conn.url)} (which answered){doing}; the answer would be partial, "
                f"so none is given: bring that node back or fail over to its replica "
                f"({_one_line(detail)})",
                EXIT_UNAVAILABLE,
            )
        fail(f"cannot reach Redis{where}{doing} ({_one_line(detail)})", EXIT_UNAVAILABLE)
    except SettleError as exc:
        fail(_one_line(_in_cli_terms(_at_server(str(exc), conn))), exit_code_of(exc))


#: The library's advice on a replica, and what it means on the command line.
_LIBRARY_SENTINEL = "(or use from_sentinel, which follows failovers)"
_CLI_SENTINEL = (
    "(--redis-url of the primary, or redis+sentinel://SENTINEL_HOST:PORT/SERVICE, "
    "which asks the Sentinels for it)"
)


def _in_cli_terms(message: str) -> str:
    """The library's refusal of a replica names ``from_sentinel``, a Python call: on the
    command line it is a ``redis+sentinel://`` URL."""
    return message.replace(_LIBRARY_SENTINEL, _CLI_SENTINEL)


#: The address redis-py names in a connection or timeout error (``Error 111 connecting to
#: 127.0.0.1:7002.``, ``Timeout reading from 127.0.0.1:7002``).
#: An IPv6 host is written bare (``::1:6379``): the port is the last colon's digits.
_ADDRESS = re.compile(
    r"(?:connecting to|reading from|writing to) \[?([\w.:-]+?)\]?:(\d+)(?=[.,;\s]|$)"
)


def _other_node(detail: str, conn: Connection | None) -> str | None:
    """The ``host:port`` a connection error names when it is not the URL's own server: a
    cluster node behind the seed, which answered (the error said "cannot reach Redis at
    <the seed>", and an operator checked the wrong node)."""
    found = _ADDRESS.search(detail)
    # Behind Sentinel the address may be a Sentinel's (MasterNotFoundError quotes each one's)
    if conn is None or found is None or conn.sentinel is not None:
        return None
    host, port = found.groups()
    try:
        seed = urlsplit(conn.url)
        if seed.scheme == "unix" or (seed.hostname or "localhost", seed.port or 6379) == (
            host,
            int(port),
        ):
            return None
    except ValueError:
        return None
    return f"{host}:{port}"


def _shards_on(conn: Connection, node: str) -> str:
    """ " (shards 1, 5 of namespace 'ns')": the namespace's shards whose slots ``node``
    serves, as the seed's ``CLUSTER SLOTS`` says, when the seed tells it in one try within
    ``--redis-timeout`` and the shard count is known (``--shards``, or a count stored on a
    node that answers); else "", the node alone."""
    try:
        with bounded(Redis.from_url(conn.url), conn.url, conn.redis_timeout) as seed:
            slots = [
                (int(low), int(high), f"{as_text(at[0], 'replace') or '127.0.0.1'}:{int(at[1])}")
                for low, high, at, *_ in seed.execute_command("CLUSTER", "SLOTS")
            ]
            shards = conn.shards or conn.known_shards or _stored_count(conn, seed, slots, node)
    except (RedisError, OSError, ValueError, TypeError, IndexError, SettleError):
        return ""
    if not shards:
        return ""
    keys = Keys(conn.namespace, shards)
    on = [s for s in range(shards) if _server_of(keys.tag(s), slots) == node]
    if not on:
        return ""
    shown = ", ".join(map(str, on[:12])) + (", ..." if len(on) > 12 else "")
    return f" (shard{'s' if len(on) > 1 else ''} {shown} of namespace {conn.namespace!r})"


def _server_of(key: str, slots: list[tuple[int, int, str]]) -> str | None:
    slot = key_slot(key.encode())
    return next((at for low, high, at in slots if low <= slot <= high), None)


def _stored_count(
    conn: Connection, seed: Redis, slots: list[tuple[int, int, str]], down: str
) -> int | None:
    """The namespace's shard count, read where a node that answers holds it: its metadata,
    else the first shard state (each keeps the count it was claimed for) on such a node;
    nothing is asked of ``down``."""
    keys = Keys(conn.namespace, MAX_SHARDS)
    pool = seed.connection_pool
    settings = {**topology.passed_on(pool.connection_kwargs, pool.connection_class)}
    settings["retry"] = Retry(NoBackoff(), 0)
    for key in [keys.meta, *(keys.generation(s) for s in range(64))]:
        at = _server_of(key, slots)
        if at is None or at == down:
            continue
        host, _, port = at.rpartition(":")
        with Redis(**{**settings, "host": host, "port": int(port)}) as client:
            raw = client.hget(key, "shards")
        text = "" if raw is None else as_text(raw, "replace")
        if is_decimal(text) and 1 <= int(text) <= MAX_SHARDS:
            return int(text)
    return None


def _at_server(message: str, conn: Connection | None) -> str:
    """A refusal by Redis (``Redis refused settle's credentials ...``, ``... to run settle's
    scripts ...``) naming the server, its password shown as ``***``: the library's words do
    not say which, and an operator with several URLs at hand could not tell."""
    if conn is None or not message.startswith(_REFUSED):
        return message
    return f"Redis at {redacted(conn.url)} refused {message.removeprefix(_REFUSED)}"


_REFUSED = "Redis refused "


@contextlib.contextmanager
def options_named(options: Mapping[str, str]) -> Iterator[None]:
    """The library's refusal of a value the user gave as an option, said of that option:
    the library names its argument (``older_than must be more than 0 seconds...``), which
    the user never typed, so ``options`` maps those names to the options that fed them
    (``{"older_than": "--before"}``) and the refusal reads ``bad --before: must be more
    than 0 seconds...`` (exit 2, as every bad input; the checks stay the library's)."""
    try:
        yield
    except InvalidInput as exc:
        message = str(exc)
        for name, option in options.items():
            if message.startswith(f"{name} "):
                said = f"bad {option}: {message.removeprefix(f'{name} ')}"
                raise InvalidInput(said, operation_id=exc.operation_id) from exc
        raise


def stored_shards(client: Any, namespace: str) -> int | None:
    """The shard count a namespace was created with, or None when it was never used.

    Metadata that is not what settle writes (another type of key, a count that is not a
    number from 1 to 4096) is a :class:`ConfigurationError` that names the key."""
    meta = Keys(namespace, 1).meta
    try:
        raw = client.hget(meta, "shards")
    except ResponseError as exc:
        if not str(exc).startswith("WRONGTYPE"):
            raise
        raise ConfigurationError(
            f"the metadata of namespace {namespace!r} is corrupt: key {meta!r} is not a hash "
            "(something other than settle wrote it); inspect it with redis-cli TYPE / DUMP "
            "before repairing or deleting it"
        ) from exc
    if raw is None:
        return None
    text = as_text(raw, "replace")
    if not (is_decimal(text) and 1 <= int(text) <= MAX_SHARDS):
        raise ConfigurationError(
            f"the metadata of namespace {namespace!r} is corrupt: key {meta!r} field 'shards' "
            f"is {text[:40]!r}, not a shard count from 1 to {MAX_SHARDS}; settle never writes "
            "that. Restore the count the namespace was created with (HSET), or use another "
            "namespace"
        )
    return int(text)


def probed_shards(client: Redis, namespace: str) -> int | None:
    """:func:`stored_shards` of ``namespace``, read through a settler on ``client`` that
    reads only and is closed after (with ``client``): it connects, switching to a cluster
    client on a cluster, and checks the server, not the namespace; it writes nothing, so
    an evicting server is read. A Redis failure of the read is a :class:`BackendError`
    (the command's and doctor's probe alike)."""
    options = {"namespace": namespace, "shards": 1, "allow_eviction": True}
    probe = Settler(client, settings(options))
    try:
        probe._reading(namespace=False).check()
        try:
            return stored_shards(client_of(probe), namespace)
        except RedisError as exc:
            raise BackendError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        probe.close()


@contextlib.contextmanager
def open_settler(
    conn: Connection, *, create: bool = False, reads: bool = False
) -> Iterator[Settler]:
    """A :class:`Settler` on ``conn``, checked before use.

    For read commands (``create=False``) the namespace must exist: its stored shard count
    is used unless ``--shards`` says otherwise, and a different ``--shards`` is refused
    rather than silently reading the wrong keys. ``create=True`` (the demo) creates it.
    ``reads``: the command writes no record and no quarantine entry (``ls``, ``show``,
    ``export``, ``tail``, ``inspect``, ``stats``), so a server whose ``maxmemory-policy``
    evicts is read, not refused: the refusal keeps writes from being evicted, and it
    stopped an operator from exporting the very evidence the policy puts at risk
    (``settle doctor`` fails the policy by name). Such a settler is checked without
    claiming a shard (``Settler._reading``): it writes nothing.
    """
    with errors_as_exit_codes(conn):
        shards = conn.known_shards = _shards(conn, create=create)
        options: dict[str, Any] = {"namespace": conn.namespace, "allow_eviction": reads}
        if shards is not None:
            options["shards"] = shards
        settler = _settler(conn, options)
        try:
            # Read commands: checked without claiming a shard, writing nothing
            (settler._reading() if reads else settler).check()
            yield settler
        finally:
            settler.close()


def settings(options: dict[str, Any]) -> SettleConfig:
    """The namespace's settings; a bad ``--namespace`` is :class:`InvalidInput` (exit 2)."""
    try:
        return SettleConfig(**options)
    except InvalidInput as exc:
        cause = exc.__cause__
        if not isinstance(cause, ValidationError):
            raise
        problems = "; ".join(f"bad --{e['loc'][0]}: {e['msg']}" for e in cause.errors())
        raise InvalidInput(problems) from exc


def checked_namespace(namespace: str) -> str:
    """``namespace`` when settle takes it, else :class:`InvalidInput` (exit 2) that says what
    a namespace may hold: ``bad --namespace: must be 1 to 64 characters of ...`` (the one
    rule, :class:`SettleConfig`'s), for the commands that open no :class:`Settler`."""
    return settings({"namespace": namespace}).namespace


def checked_url(url: str) -> str:
    """``url`` when redis-py can build a connection from it, else :class:`InvalidInput`
    (exit 2). Nothing is connected: a query parameter redis-py passes on but no connection
    takes (``?foo=1``, ``ssl_password`` without TLS) would otherwise be a ``TypeError`` at
    the first command; a password with an unencoded ``/``, ``?`` or ``#`` would connect to a
    port read from the password (:func:`~settle._runtime.urls.check`). The message shows the
    URL redacted and says what is wrong in fixed words, never redis-py's own (which can quote
    the password)."""
    try:
        ConnectionPool.from_url(url).make_connection()
        check(url)  # parsed, but a part of the password read as the port (or the path)
    # ValueError, TypeError: parsing; RedisError: a query value the connection's
    # constructor refuses (?protocol=9). redis-py's text may quote the password: dropped.
    except (ValueError, TypeError, RedisError) as exc:
        raise InvalidInput(f"bad --redis-url {redacted(url)}: {url_problem(exc)}") from None
    return url


def _settler(conn: Connection, options: dict[str, Any]) -> Settler:
    return Settler(connected(conn), settings(options))


def bounded(client: Redis, url: str, seconds: float) -> Redis:
    """``client`` waiting at most ``seconds`` for a connection and for each reply, trying a
    command that timed out once: against a paused Redis (SIGSTOP, a partition) a command
    waited out the library's 30 s socket timeout four times, ``settle quarantine ls`` over
    two minutes. A ``socket_timeout`` or ``socket_connect_timeout`` in the URL wins."""
    given = parse_qs(urlsplit(url).query)
    kwargs = client.connection_pool.connection_kwargs
    for name in ("socket_timeout", "socket_connect_timeout"):
        if name not in given:
            kwargs[name] = seconds
    client.set_retry(Retry(NoBackoff(), 0))
    return client


def _shards(conn: Connection, *, create: bool) -> int | None:
    """The shard count to use: the namespace's stored one, read without creating the
    namespace (``Settler.check`` records it on first use). A read command needs the
    namespace to exist; an explicit ``--shards`` must match what is stored."""
    # The probe reads the stored count and writes nothing: an evicting server is refused
    # (or not) by the settler the command opens next.
    stored = probed_shards(connected(conn), conn.namespace)
    if stored is None:
        if create:
            return conn.shards
        raise ConfigurationError(
            f"namespace {conn.namespace!r} does not exist at {redacted(conn.url)} "
            "(nothing was ever written to it); check --namespace / SETTLE_NAMESPACE"
        )
    if conn.shards is not None and conn.shards != stored:
        raise ConfigurationError(
            f"namespace {conn.namespace!r} has {stored} shards, but --shards is "
            f"{conn.shards}; drop --shards or pass --shards {stored}"
        )
    return stored


def configure_logging(verbosity: int) -> None:
    """settle's structlog events go to stderr: none but CRITICAL by default (a command
    prints its own output and nothing else), WARNING with -v, INFO -vv, DEBUG -vvv."""
    levels = {0: logging.CRITICAL, 1: logging.WARNING, 2: logging.INFO}
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(levels.get(verbosity, logging.DEBUG)),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def name_undecodable(marks: list[UndecodableEntry]) -> None:
    """Name each quarantine entry this version cannot decode on stderr, then exit 1
    (docs/cli.md): the others were shown or counted, and a script must not take the
    output for whole."""
    for mark in marks:
        say_undecodable(mark)
    if marks:
        sys.exit(EXIT_FAILED)


def say_undecodable(mark: UndecodableEntry) -> None:
    """Name one quarantine entry this version cannot decode on stderr (``quarantine tail``
    names each as it meets it, and exits 1 when it ends)."""
    click.echo(
        visible_message(
            f"settle: quarantine entry {mark.ref} cannot be decoded: {mark.problem} "
            "(another settle version or another program wrote it; inspect it with "
            "redis-cli XRANGE)"
        ),
        err=True,
    )
