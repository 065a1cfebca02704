"""Packing a script call's command for the runner's lane."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:  # redis-py 8's own names: without them the lane packs through the connection
    from redis.connection import AbstractConnection, HiredisRespSerializer
except ImportError:  # pragma: no cover - a redis-py that renamed them
    AbstractConnection = HiredisRespSerializer = None  # type: ignore[assignment,misc]

_hiredis_pack: Callable[[tuple[Any, ...]], Any] | None
try:
    import hiredis

    _hiredis_pack = hiredis.pack_command
except ImportError:  # pragma: no cover - without hiredis redis-py packs in Python
    _hiredis_pack = None

__all__ = ["pack_command"]

_REDIS_PY_PACK = None if AbstractConnection is None else AbstractConnection.pack_command


def pack_command(conn: Any, command: tuple[Any, ...]) -> Any:
    """``conn.pack_command(*command)``. A sync connection that packs with redis-py's own
    hiredis serializer gets the same bytes from ``hiredis.pack_command`` directly, without
    the serializer's per-argument pass (it splits a command name holding spaces, which the
    lane's ``EVALSHA`` / ``FCALL`` never do, and turns bytearray and memoryview into bytes).
    A memoryview goes the serializer's way (hiredis would send a strided view's underlying
    bytes), and so does what hiredis refuses (a bytearray), to be converted or to raise
    redis-py's DataError. An asyncio connection packs as it always did."""
    if (
        _hiredis_pack is not None
        and HiredisRespSerializer is not None
        and type(getattr(conn, "_command_packer", None)) is HiredisRespSerializer
        and type(conn).pack_command is _REDIS_PY_PACK
        and not any(type(arg) is memoryview for arg in command)
    ):
        try:
            return [_hiredis_pack(command)]
        except TypeError:
            pass
    return conn.pack_command(*command)
