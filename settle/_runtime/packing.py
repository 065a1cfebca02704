"""Packing a script call's command for the runner's lane."""

from __future__ import annotations

import codecs
import select
import socket
from collections.abc import Callable
from functools import lru_cache
from typing import Any

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

_hiredis_pack: Callable[[tuple[Any, ...]], Any] | None
try:
    import hiredis

    _hiredis_pack = hiredis.pack_command
except ImportError:  # pragma: no cover - without hiredis redis-py packs in Python
    _hiredis_pack = None

__all__ = ["can_read", "pack_command", "retries_as_redis_py", "tried"]

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

#: hiredis writes integers of this magnitude itself; larger ones go as their text.
_INT64 = 2**63


def pack_command(conn: Any, command: tuple[Any, ...]) -> Any:
    """``conn.pack_command(*command)``, sent the same, without redis-py's per-argument pass
    where hiredis gives the same bytes (:func:`_hiredis_packs_as`; the lane's ``EVALSHA`` /
    ``FCALL`` never hold a command name with spaces, which redis-py would split). A
    memoryview goes redis-py's way (hiredis would send a strided view's underlying bytes),
    and so does what hiredis refuses (a bytearray, a bool, None), to be converted or to
    raise redis-py's DataError. An integer beyond 64 bits goes as its text, the same bytes:
    hiredis (also under redis-py's own sync serializer) crashes the process on one of over
    4,300 digits, where making its text raises Python's ValueError and sends nothing."""
    plain, big = True, False
    for arg in command:
        kind = type(arg)
        if kind is memoryview:
            plain = False
        elif kind is int and not -_INT64 <= arg < _INT64:
            big = True
    if big:
        command = tuple(
            str(a) if type(a) is int and not -_INT64 <= a < _INT64 else a for a in command
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
