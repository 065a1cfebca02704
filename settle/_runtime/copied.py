"""The redis-py code the lane copies, held to the redis-py installed.

``packing.exchange`` (sync), ``cancel_safe.read`` and ``cancel_safe.ready`` / ``write``
(asyncio) are redis-py 8's send and read line for line, failures included. settle allows
any redis-py from 8.0: a release that changes one of the copied methods (a new error text, a
step on failure, a new push notification) would leave the copy behind without a sound. So
the copy is taken only while those methods' code is the code it was copied from (their
comments and layout aside); on any other redis-py the lane calls the connection's own
methods, which costs the copy's gain and nothing else. (On Python 3.11 the connections' send
stays ``cancel_safe.keep_cancellations``' copy whatever the redis-py: redis-py's own loses
cancellations there.) ``tests/unit/test_lane_wire.py`` fails on such a redis-py: read its
new code, bring the copy to it, and write the new digest here.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap
from collections.abc import Callable
from functools import cache
from typing import Any

from redis import connection as _connection
from redis.asyncio import connection as _async_connection

try:  # a redis-py that moved it: no copy is current (its names are not found)
    from redis._parsers import hiredis as _hiredis
except ImportError:  # pragma: no cover
    _hiredis = None  # type: ignore[assignment]

__all__ = ["ASYNC", "ASYNC_SEND", "SYNC", "Copy", "digest"]


def digest(functions: tuple[Callable[..., Any], ...]) -> str | None:
    """SHA-256 of the functions' code, comments and layout aside (``ast.unparse``); None
    when one's source cannot be read (an installation without ``.py`` files)."""
    hasher = hashlib.sha256()
    for function in functions:
        try:
            source = textwrap.dedent(inspect.getsource(function))
            hasher.update(ast.unparse(ast.parse(source)).encode())
        except (OSError, TypeError, SyntaxError):
            return None
    return hasher.hexdigest()


class Copy:
    """redis-py methods a copy of settle's was made from, and the digests of the code it
    was made from (:func:`digest`)."""

    def __init__(self, name: str, where: Callable[[], tuple[Callable[..., Any], ...]]):
        self.name = name
        self._where = where

    def installed(self) -> str | None:
        """The digest of the installed redis-py's methods (None: not found or unreadable)."""
        try:
            functions = self._where()
        except (ImportError, AttributeError):
            return None
        return digest(functions)

    def current(self) -> bool:
        """Whether the installed redis-py's methods are those the copy was made from."""
        return _current(self)


@cache
def _current(copy: Copy) -> bool:
    return copy.installed() in DIGESTS[copy.name]


def _sync() -> tuple[Callable[..., Any], ...]:
    parser = _hiredis._HiredisParser
    return (
        _connection.AbstractConnection.send_packed_command,
        _connection.AbstractConnection.check_health,
        _connection.AbstractConnection.read_response,
        parser.read_response,
        parser.read_from_socket,
    )


def _async() -> tuple[Callable[..., Any], ...]:
    parser = _hiredis._AsyncHiredisParser
    return (
        _async_connection.AbstractConnection.read_response,
        _async_connection.AbstractConnection._read_response_from_parser,
        parser.read_response,
        parser.read_from_socket,
    )


def _async_send() -> tuple[Callable[..., Any], ...]:
    return (_async_connection.AbstractConnection.send_packed_command,)


#: ``packing.exchange``: redis-py's sync send, health check and read, hiredis' read.
SYNC = Copy("sync", _sync)
#: ``cancel_safe.read``: redis-py's asyncio read, hiredis' asyncio read.
ASYNC = Copy("async", _async)
#: ``cancel_safe.ready`` / ``write``: redis-py's asyncio send.
ASYNC_SEND = Copy("async_send", _async_send)

#: The digests of the redis-py code each copy follows (redis-py 8.2.0).
DIGESTS: dict[str, frozenset[str | None]] = {
    "sync": frozenset({"a2dc4c5baa4e9b3270d5d4d4c053d1707629f387e478029dd08f28035c9f663d"}),
    "async": frozenset({"d122c64fcacf09442d77ddc323aa47578e004f4d0203c09a3d5ecd6cbc94fcb5"}),
    "async_send": frozenset({"72f4d84ee38d60c83d130319c245f391a3b403fd5b2c491dd1e69769e6c46776"}),
}
