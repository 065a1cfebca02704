"""Packing a script call's command for the runner's lane."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.connection import AbstractConnection, HiredisRespSerializer

_hiredis_pack: Callable[[tuple[Any, ...]], Any] | None
try:
    import hiredis

    _hiredis_pack = hiredis.pack_command
except ImportError:  # pragma: no cover - without hiredis redis-py packs in Python
    _hiredis_pack = None

__all__ = ["pack_command"]

_REDIS_PY_PACK = AbstractConnection.pack_command


def pack_command(conn: Any, command: tuple[Any, ...]) -> Any:
    """``conn.pack_command(*command)``. A sync connection that packs with redis-py's own
    hiredis serializer gets the same bytes from ``hiredis.pack_command`` directly, without
    the serializer's per-argument pass (it splits a command name holding spaces, which the
    lane's ``EVALSHA`` / ``FCALL`` never do, and turns bytearray and memoryview into bytes:
    hiredis takes a memoryview as it is and refuses a bytearray, which then goes the
    serializer's way, as does any other refused argument, to raise redis-py's DataError)."""
    if (
        _hiredis_pack is not None
        and type(getattr(conn, "_command_packer", None)) is HiredisRespSerializer
        and type(conn).pack_command is _REDIS_PY_PACK
    ):
        try:
            return [_hiredis_pack(command)]
        except TypeError:
            pass
    return conn.pack_command(*command)
