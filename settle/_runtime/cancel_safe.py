"""Sends that keep a cancellation, for redis-py's asyncio connections on Python 3.11.

redis-py bounds each send by ``socket_timeout`` with ``asyncio.wait_for``, and on Python
3.11 ``wait_for`` returns normally when the task is cancelled just after the send it waits
for has finished (CPython gh-86296, fixed in 3.12 by rebuilding ``wait_for`` on
``asyncio.timeout``). A cancelled task then runs on: an ``asyncio.timeout`` around a settle
call does not fire and the guarded function runs after its caller gave up, a server's
cancellation of a request is lost. It is not rare: a task that calls Redis in a loop lost 16
of 20 cancellations here. settle sets a ``socket_timeout`` on every client it makes, so
every one of its sends went that way.

:func:`keep_cancellations` gives a client's connections a ``send_packed_command`` that bounds
the send with ``asyncio.timeout`` instead, as 3.12's ``wait_for`` does, and is otherwise
redis-py's (the same connect, health check, errors and disconnects). It changes nothing on
Python 3.12+ and on a connection class that defines its own ``send_packed_command``.
"""

from __future__ import annotations

import asyncio
import math
import sys
from typing import Any

from redis import exceptions as rx
from redis.asyncio import connection as _connection
from redis.asyncio.connection import AbstractConnection, Connection

from settle._runtime import copied

try:  # what redis-py 8's asyncio read uses: without them the lane calls read_response
    from redis._parsers.hiredis import NOT_ENOUGH_DATA, _AsyncHiredisParser
    from redis._parsers.socket import SERVER_CLOSED_CONNECTION_ERROR
    from redis.utils import is_os_level_timeout
except ImportError:  # pragma: no cover - a redis-py that renamed them
    _AsyncHiredisParser = None  # type: ignore[assignment,misc]

__all__ = [
    "NEEDED",
    "keep_cancellations",
    "read",
    "ready",
    "watchable",
    "write",
    "write_error",
]

#: Python 3.11 from 3.11.3 (whose ``asyncio.timeout`` redis-py itself uses for reads).
NEEDED = (3, 11, 3) <= sys.version_info < (3, 12)

_OWN_SEND = AbstractConnection.send_packed_command
#: redis-py's DEBUG line for a failed write (``redis.connection`` logger), where it has one.
_DEBUG_LOG = getattr(_connection, "add_debug_log_for_connection_failure", None)


def _debug_log(conn: Any, exc: BaseException) -> None:
    if _DEBUG_LOG is not None:
        _DEBUG_LOG(conn, exc, "writing command")


async def _send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
    """redis-py's ``AbstractConnection.send_packed_command`` (8.x), with ``asyncio.timeout``
    where it has ``asyncio.wait_for``."""
    await ready(self, check_health)
    await write(self, command, bounded=True)


async def ready(conn: Any, check_health: bool = True) -> None:
    """What redis-py's ``send_packed_command`` does before it sends: connect, and check the
    connection's health when its interval is due."""
    if not conn.is_connected:
        await conn.connect_check_health(check_health=False)
    if check_health:
        await conn.check_health()


async def write(conn: Any, command: Any, *, bounded: bool) -> None:
    """Send ``command`` on a :func:`ready` connection as redis-py does: a connection whose
    send failed or was cut short is closed, a failed write is a ``ConnectionError``. With
    ``bounded``, within the connection's ``socket_timeout`` (``asyncio.timeout``); without,
    the caller bounds it (the asyncio lane's :mod:`settle._runtime.deadlines`)."""
    try:
        if isinstance(command, str):
            command = command.encode()
        if isinstance(command, bytes):
            command = [command]
        if bounded:
            # read after ready, as redis-py does (notifications move it); none: redis-py's
            # path has no wait_for
            async with asyncio.timeout(conn.socket_timeout or None):
                await conn._send_packed_command(command)
        else:
            await conn._send_packed_command(command)
    except TimeoutError as exc:
        _debug_log(conn, exc)
        await conn.disconnect(nowait=True)
        if exc.errno is not None:  # ETIMEDOUT from the OS: the connection is dead, not slow
            raise rx.ConnectionError(
                f"Error {exc.errno} while writing to socket. {exc.strerror}."
            ) from exc
        raise rx.TimeoutError("Timeout writing to socket") from None
    except OSError as exc:
        _debug_log(conn, exc)
        await conn.disconnect(nowait=True)
        raise write_error(exc) from exc
    except BaseException as exc:
        # a send cut short (cancelled): the connection may hold part of a command
        _debug_log(conn, exc)
        await conn.disconnect(nowait=True)
        raise


#: ``read_response(timeout=math.inf)`` reads without a timeout of its own (redis-py 8.x)
_OWN_READ = AbstractConnection.read_response


_WATCHABLE: dict[type, bool] = {}


def watchable(conn: Any) -> bool:
    """Whether ``conn`` sends and reads as redis-py's own asyncio connection does (its send,
    or the one above; its read), on the redis-py :func:`ready` and :func:`write` were copied
    from (:mod:`settle._runtime.copied`): the lane may then bound them itself (:func:`ready`,
    :func:`write` unbounded, ``read_response(timeout=math.inf)``). A connection class of the
    application's, or any on another redis-py, keeps its own. Asked once per class."""
    cls = type(conn)
    known = _WATCHABLE.get(cls)
    if known is None:
        known = _WATCHABLE[cls] = (
            getattr(cls, "read_response", None) is _OWN_READ
            and getattr(cls, "send_packed_command", None) in _SENDS
            and copied.ASYNC_SEND.current()
        )
    return known


_OWN_PARSE = AbstractConnection._read_response_from_parser
_LEAN: dict[type, bool] = {}


def _lean(cls: type) -> bool:
    """Whether a connection of class ``cls`` reads as redis-py's own (its ``read_response``
    and ``_read_response_from_parser``), on the redis-py the copy was made from
    (:mod:`settle._runtime.copied`). Asked once per class."""
    known = _LEAN.get(cls)
    if known is None:
        known = _LEAN[cls] = (
            _AsyncHiredisParser is not None
            and copied.ASYNC.current()
            and getattr(cls, "read_response", None) is _OWN_READ
            and getattr(cls, "_read_response_from_parser", None) is _OWN_PARSE
        )
    return known


async def read(conn: Any) -> Any:
    """``conn.read_response(timeout=math.inf)`` of a :func:`watchable` connection (the
    asyncio lane bounds the read itself). With redis-py's hiredis parser, its read without
    the frames around it, line for line (redis-py 8's ``AbstractConnection.read_response``
    without a timeout of its own, ``_AsyncHiredisParser.read_response`` and
    ``read_from_socket``): the same reply, the same error class and text, the connection
    closed the same way (a cancelled read too); anything else is the connection's own."""
    parser: Any = conn._parser
    if type(parser) is not _AsyncHiredisParser or not _lean(type(conn)):
        return await conn.read_response(timeout=math.inf)
    named: list[str] = []  # the host, named before a push notification is handled
    try:
        response = await _reply(conn, parser, named)
    except TimeoutError as e:  # asyncio.TimeoutError is TimeoutError (3.11+)
        if is_os_level_timeout(e):
            host_error = named[0] if named else conn._host_error()
            _read_log(conn, e)
            await conn.disconnect(nowait=True)
            raise rx.ConnectionError(f"Error while reading from {host_error} : {e.args}") from e
        return None  # redis-py's answer to a timeout under a read timeout of the caller's
    except OSError as e:
        host_error = named[0] if named else conn._host_error()
        _read_log(conn, e)
        await conn.disconnect(nowait=True)
        raise rx.ConnectionError(f"Error while reading from {host_error} : {e.args}") from e
    except BaseException as e:  # a parse error, a cancellation: redis-py's handling is this
        _read_log(conn, e)
        await conn.disconnect(nowait=True)
        raise
    if conn.health_check_interval:
        conn.next_health_check = asyncio.get_running_loop().time() + conn.health_check_interval
    if isinstance(response, rx.ResponseError):
        try:
            raise response from None
        finally:
            del response  # no reference cycle through the traceback, as redis-py
    return response


async def _reply(conn: Any, parser: Any, named: list[str]) -> Any:
    """redis-py 8's ``_AsyncHiredisParser.read_response()`` with its defaults."""
    while True:
        if not parser._connected:
            raise rx.ConnectionError(SERVER_CLOSED_CONNECTION_ERROR) from None
        response = parser._reader.gets()
        while response is NOT_ENOUGH_DATA:
            buffer = await parser._stream.read(parser._read_size)
            if not buffer or not isinstance(buffer, bytes):
                raise rx.ConnectionError(SERVER_CLOSED_CONNECTION_ERROR) from None
            parser._reader.feed(buffer)
            response = parser._reader.gets()
        push = parser._hiredis_PushNotificationType
        if push is None or not isinstance(response, push):
            break
        if not named:
            named.append(conn._host_error())
        response = await parser.handle_push_response(response)
    if isinstance(response, rx.ConnectionError):
        raise response
    if isinstance(response, list) and response and isinstance(response[0], rx.ConnectionError):
        raise response[0]
    return response


def _read_log(conn: Any, exc: BaseException) -> None:
    if _DEBUG_LOG is not None:
        _DEBUG_LOG(conn, exc, "reading response")


def write_error(exc: OSError) -> rx.ConnectionError:
    """A failed write as redis-py reports it, a ``ConnectionError`` (transient: the runtime
    repeats the call, then raises ``BackendError``), whatever ``exc.args`` holds. redis-py's
    own mapping unpacks ``exc.args[:2]``, so an ``OSError()`` without arguments became a
    ``ValueError`` there."""
    if len(exc.args) >= 2:
        number, message = exc.args[:2]
    else:
        number, message = "UNKNOWN", (exc.args[0] if exc.args else type(exc).__name__)
    return rx.ConnectionError(f"Error {number} while writing to socket. {message}.")


#: Each connection class, made once with the send above (a class per class, not per client).
_MADE: dict[type, type] = {}


def _safe(cls: type) -> type:
    """``cls`` with the send above, or ``cls`` itself where it is already that or defines
    its own send (a user's connection class keeps what it does)."""
    if getattr(cls, "send_packed_command", None) is not _OWN_SEND:
        return cls
    made = _MADE.get(cls)
    if made is None:
        made = type(cls.__name__, (cls,), {"send_packed_command": _send_packed_command})
        _MADE[cls] = made
    return made


#: The sends :func:`watchable` knows: redis-py's own and the one above.
_SENDS = (_OWN_SEND, _send_packed_command)


def _holder(holder: Any, *held: str) -> None:
    """A connection pool or a cluster node: its class for new connections, and the
    connections it already holds (in the attributes named ``held``)."""
    if hasattr(holder, "connection_class"):
        holder.connection_class = _safe(holder.connection_class)
    for name in held:
        for conn in getattr(holder, name, ()):
            conn.__class__ = _safe(type(conn))


def keep_cancellations(client: Any) -> None:
    """Make an asyncio ``Redis`` (standalone, Sentinel) or ``RedisCluster`` send without
    ``asyncio.wait_for`` on Python 3.11 (see the module); nothing elsewhere."""
    if not NEEDED:
        return
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        _holder(pool, "_available_connections", "_in_use_connections")
        # a Sentinel pool asks its Sentinels for the primary on every new connection
        for sentinel in getattr(getattr(pool, "sentinel_manager", None), "sentinels", ()):
            keep_cancellations(sentinel)
    manager = getattr(client, "nodes_manager", None)
    if manager is None:
        return
    kwargs = manager.connection_kwargs
    kwargs["connection_class"] = _safe(kwargs.get("connection_class", Connection))
    for nodes in (manager.startup_nodes, manager.nodes_cache):
        for node in list(nodes.values()):
            _holder(node, "_connections")
