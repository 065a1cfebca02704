"""Packing a script call's command for the runner's lane."""

from __future__ import annotations

import codecs
import select
import socket
import time
from collections.abc import Callable
from functools import lru_cache
from typing import Any, NoReturn

from redis import exceptions as rx

from settle._runtime import copied
from settle._runtime.calls import INT64, INT64_MIN

try:  # redis-py 8's own names: without them the lane packs through the connection
    from redis.asyncio.connection import AbstractConnection as AsyncConnection
    from redis.connection import AbstractConnection, HiredisRespSerializer
except ImportError:  # pragma: no cover - a redis-py that renamed them
    AbstractConnection = AsyncConnection = HiredisRespSerializer = None  # type: ignore[assignment,misc]

try:  # redis-py's own retry policies: another's call_with_retry is asked for every try
    from redis.asyncio.retry import Retry as AsyncRetry
    from redis.retry import Retry
except ImportError:  # pragma: no cover - a redis-py that renamed them
    AsyncRetry = Retry = None  # type: ignore[assignment,misc]

try:  # redis-py 8's sync hiredis parser: without it every check asks the connection
    from redis._parsers import _HiredisParser
except ImportError:  # pragma: no cover - a redis-py that renamed it
    _HiredisParser = None  # type: ignore[assignment,misc]

try:  # what redis-py 8's sync send and read use: without them the lane calls its methods
    from redis._parsers.hiredis import NOT_ENOUGH_DATA
    from redis._parsers.socket import (
        NONBLOCKING_EXCEPTIONS,
        SERVER_CLOSED_CONNECTION_ERROR,
    )
    from redis.connection import add_debug_log_for_connection_failure
    from redis.utils import is_os_level_timeout
except ImportError:  # pragma: no cover - a redis-py that renamed them
    NOT_ENOUGH_DATA = None

_hiredis_pack: Callable[[tuple[Any, ...]], Any] | None
try:
    import hiredis

    _hiredis_pack = hiredis.pack_command
except ImportError:  # pragma: no cover - without hiredis redis-py packs in Python
    _hiredis_pack = None

__all__ = ["can_read", "exchange", "pack_command", "retries_as_redis_py", "tried"]

_REDIS_PY_PACK = None if AbstractConnection is None else AbstractConnection.pack_command
_REDIS_PY_CAN_READ = None if AbstractConnection is None else AbstractConnection.can_read
_ASYNC_PACK = None if AsyncConnection is None else AsyncConnection.pack_command
_REDIS_PY_TRIES = tuple(
    policy.call_with_retry for policy in (Retry, AsyncRetry) if policy is not None
)


@lru_cache(maxsize=16)
def _utf8(encoding: str) -> bool:
    try:
        return codecs.lookup(encoding).name == "utf-8"
    except LookupError:
        return False


def _hiredis_packs_as(conn: Any) -> bool:
    """Whether hiredis packs a command as ``conn`` itself would. A sync connection packing
    with redis-py's hiredis serializer does (that serializer is ``hiredis.pack_command``
    after a pass over the arguments). An asyncio connection packs in Python, each argument
    through its encoder; with UTF-8 and strict errors (redis-py's default) that encoder
    gives the bytes hiredis gives for text, bytes, integers and floats, and raises the same
    UnicodeEncodeError on text UTF-8 cannot encode."""
    cls = type(conn)
    if cls.pack_command is _REDIS_PY_PACK:
        return type(getattr(conn, "_command_packer", None)) is HiredisRespSerializer
    if cls.pack_command is _ASYNC_PACK:
        encoder = getattr(conn, "encoder", None)
        return (
            getattr(encoder, "encoding_errors", None) == "strict"
            and isinstance(encoding := getattr(encoder, "encoding", None), str)
            and _utf8(encoding)
        )
    return False


_poll = getattr(select, "poll", None)  # not on Windows


def pack_command(conn: Any, command: tuple[Any, ...], plain: bool = False) -> Any:
    """``conn.pack_command(*command)``, sent the same, without redis-py's per-argument pass
    where hiredis gives the same bytes (:func:`_hiredis_packs_as`; the lane's ``EVALSHA`` /
    ``FCALL`` never hold a command name with spaces, which redis-py would split). A
    memoryview goes redis-py's way (hiredis would send a strided view's underlying bytes),
    and so does what hiredis refuses (a bytearray, a bool, None), to be converted or to
    raise redis-py's DataError. An integer beyond 64 bits goes as its text, the same bytes:
    hiredis (also under redis-py's own sync serializer) crashes the process on one of over
    4,300 digits, where making its text raises Python's ValueError and sends nothing.
    ``plain``: the caller knows every argument is neither (a :class:`Call` marked ``plain``):
    not looked at again (a loop of ~10,000 instructions per script call)."""
    big = False
    if not plain:
        plain = True
        for arg in command:
            kind = type(arg)
            if kind is memoryview:
                plain = False
            elif kind is int and not INT64_MIN <= arg < INT64:
                big = True
    if big:
        command = tuple(
            str(a) if type(a) is int and not INT64_MIN <= a < INT64 else a for a in command
        )
    if plain and _hiredis_pack is not None and _hiredis_packs_as(conn):
        try:
            return [_hiredis_pack(command)]
        except TypeError:
            pass
    return conn.pack_command(*command)


def can_read(conn: Any) -> bool:
    """``conn.can_read()`` of a sync connection (data the server sent that nobody asked
    for, or a connection it closed), without redis-py's frames in the case almost every
    call finds: a plain socket, redis-py's hiredis parser holding nothing, and a poll that
    finds nothing to read, as its own check polls. Anything else (a connection class whose
    ``can_read`` is the application's, a TLS socket, another parser, no socket yet,
    something to read) is the connection's own check, errors and all."""
    sock = getattr(conn, "_sock", None)
    if (
        type(sock) is socket.socket
        and type(conn).can_read is _REDIS_PY_CAN_READ
        and type(parser := getattr(conn, "_parser", None)) is _HiredisParser
    ):
        reader = parser._reader
        if _poll is not None and reader is not None and not reader.has_data():
            poller = _poll()
            try:  # a socket closed meanwhile (no descriptor): the connection's own check
                poller.register(sock, select.POLLIN)
                if not poller.poll(0):
                    return False
            except (OSError, ValueError):
                pass
    return bool(conn.can_read())


def retries_as_redis_py(policy: Any) -> bool:
    """Whether the retry policy ``policy`` tries as redis-py's own ``Retry`` does (sync or
    asyncio, whatever its backoff, retries, errors and ``is_retryable``): only then may the
    lane make a call's first try outside it (:func:`tried`). A ``call_with_retry`` of the
    application's (a circuit breaker, a rate limit, a count of sends) is asked for every
    try, the first one too, as redis-py's ``execute_command`` asks it."""
    return type(policy).call_with_retry in _REDIS_PY_TRIES


def tried(error: Exception | None, then: Callable[[], Any]) -> Callable[[], Any]:
    """``then`` for a retry policy, whose first call raises ``error`` (the try already
    made) instead: the policy judges it, and repeats, as if it had made that try. With no
    ``error`` (no try made yet), ``then`` itself."""
    if error is None:
        return then
    pending = [error]

    def call() -> Any:
        if pending:
            raise pending.pop()
        return then()

    return call


#: What redis-py's ``read_from_socket`` maps itself (a timeout, a blocking error).
_SOCKET_ERRORS = (TimeoutError, *NONBLOCKING_EXCEPTIONS) if NOT_ENOUGH_DATA else ()

#: The methods of redis-py's sync connection that :func:`exchange` stands in for.
_LEAN_METHODS = ("send_packed_command", "read_response", "check_health")
_LEAN_CLASSES: dict[type, bool] = {}


def _lean(cls: type) -> bool:
    """Whether a connection of class ``cls`` sends, reads and checks its health as redis-py's
    own sync connection does (not a Sentinel-managed one, whose read is its own, nor a class
    of the application's that overrides one of them), on the redis-py the copy was made from
    (:mod:`settle._runtime.copied`). Asked once per class."""
    known = _LEAN_CLASSES.get(cls)
    if known is None:
        known = (
            NOT_ENOUGH_DATA is not None
            and AbstractConnection is not None
            and copied.SYNC.current()
            and all(
                getattr(cls, name, None) is getattr(AbstractConnection, name)
                for name in _LEAN_METHODS
            )
        )
        _LEAN_CLASSES[cls] = known
    return known


def exchange(conn: Any, packed: Any) -> Any:  # noqa: PLR0915 - one frame: the point
    """``conn.send_packed_command(packed)``, then ``conn.read_response()``, of a sync
    connection: on redis-py's own connection class with a plain socket and its hiredis
    parser, the same send (``sendall``) and read (its hiredis reader fed from the socket)
    without the frames around them; anything else (another class, TLS, another parser, no
    socket yet) is the connection's own two calls.

    It is redis-py 8's ``AbstractConnection.send_packed_command`` and ``read_response``
    (sync) through ``_HiredisParser.read_response`` and ``read_from_socket`` with their
    defaults (a health check, no timeout of the read's own, decoded, no push request), in
    one frame: a failure ends as redis-py's does (:func:`_send_failed`,
    :func:`_socket_failed`, :func:`_read_failed`: the same exception class, text and chain,
    the connection closed, the failure logged at DEBUG on redis-py's logger); an error reply
    raises the same ``ResponseError`` subclass and leaves the connection open, a
    ``ConnectionError`` reply (``LOADING``) closes it. tests/unit/test_lane_wire.py holds
    each to redis-py's answer on a real server."""
    lean = _LEAN_CLASSES.get(cls := type(conn))
    if lean is None:
        lean = _lean(cls)
    # the class first: one of the application's, or redis-py's client-side caching proxy,
    # may have no socket nor parser of its own
    if (
        not lean
        or type(sock := conn._sock) is not socket.socket
        or type(conn._parser) is not _HiredisParser
    ):
        conn.send_packed_command(packed)
        return conn.read_response()
    # -- send_packed_command (a socket: no connect) --
    if conn.health_check_interval:  # its check_health does nothing more without one
        conn.check_health()
        sock = conn._sock  # a failed check connects again
    try:
        if isinstance(packed, str):
            packed = [packed]
        for item in packed:
            sock.sendall(item)
    except BaseException as e:  # noqa: BLE001 - each as redis-py's: raised again, mapped
        _send_failed(conn, e)
    # -- read_response: the host an error names is the connection's before the read (named
    # here only when needed: a push notification handled during the read may move it) --
    host_error = None
    parser: Any = conn._parser
    try:
        while True:
            reader = parser._reader
            if reader is None:
                raise rx.ConnectionError(SERVER_CLOSED_CONNECTION_ERROR)  # noqa: TRY301
            response = reader.gets()
            while response is NOT_ENOUGH_DATA:
                # read_from_socket
                sock, fed = parser._sock, parser._reader
                if sock is None or fed is None:
                    raise rx.ConnectionError(SERVER_CLOSED_CONNECTION_ERROR)  # noqa: TRY301
                try:
                    count = sock.recv_into(parser._buffer)
                    if count == 0:
                        raise rx.ConnectionError(SERVER_CLOSED_CONNECTION_ERROR)
                    fed.feed(parser._buffer, 0, count)
                except _SOCKET_ERRORS as e:
                    _socket_failed(e)
                response = reader.gets()
            push = parser._hiredis_PushNotificationType
            if push is None or not isinstance(response, push):
                break
            if host_error is None:
                host_error = conn._host_error()
            response = parser.handle_push_response(response)
        if isinstance(response, rx.ConnectionError):
            raise response  # noqa: TRY301
        if isinstance(response, list) and response and isinstance(response[0], rx.ConnectionError):
            raise response[0]  # noqa: TRY301
    except BaseException as e:  # noqa: BLE001 - each as redis-py's: raised again, mapped
        _read_failed(conn, e, host_error)
    if conn.health_check_interval:
        conn.next_health_check = time.monotonic() + conn.health_check_interval
    if isinstance(response, rx.ResponseError):
        try:
            raise response
        finally:
            del response  # no reference cycle through the traceback, as redis-py
    return response


def _send_failed(conn: Any, e: BaseException) -> NoReturn:
    """What redis-py's ``send_packed_command`` raises for ``e`` (called while it is being
    handled, so that the chain is redis-py's), the connection closed."""
    add_debug_log_for_connection_failure(conn, e, "writing command")
    conn.disconnect()
    if isinstance(e, TimeoutError):  # socket.timeout
        if is_os_level_timeout(e):
            raise rx.ConnectionError(
                f"Error {e.errno} while writing to socket. {e.strerror}."
            ) from e
        raise rx.TimeoutError("Timeout writing to socket")
    if isinstance(e, OSError):
        if len(e.args) == 1:
            number, message = "UNKNOWN", e.args[0]
        else:
            number, message = e.args[0], e.args[1]
        raise rx.ConnectionError(f"Error {number} while writing to socket. {message}.") from e
    raise e


def _socket_failed(e: BaseException) -> NoReturn:
    """What redis-py's ``_HiredisParser.read_from_socket()`` raises for ``e`` (a timeout or
    a blocking error of the socket's): with its defaults, a blocking error is this
    ConnectionError whatever its errno."""
    if isinstance(e, TimeoutError) and not is_os_level_timeout(e):
        raise rx.TimeoutError("Timeout reading from socket")
    raise rx.ConnectionError(f"Error while reading from socket: {e.args}")


def _read_failed(conn: Any, e: BaseException, host_error: str | None) -> NoReturn:
    """What redis-py's ``read_response()`` raises for ``e`` (called while it is being
    handled), the connection closed; ``host_error``: the host named before the read, or
    None when it is the connection's still."""
    if isinstance(e, (TimeoutError, rx.TimeoutError, OSError)):
        host_error = conn._host_error() if host_error is None else host_error
    add_debug_log_for_connection_failure(conn, e, "reading response")
    conn.disconnect()
    if isinstance(e, (TimeoutError, rx.TimeoutError)):
        raise rx.TimeoutError(f"Timeout reading from {host_error}")
    if isinstance(e, OSError):
        raise rx.ConnectionError(f"Error while reading from {host_error} : {e.args}") from e
    raise e  # a parse error among them: redis-py's handling is the same
