"""The Redis server behind a :class:`~settle.Settler`, as the demo and the CLI need it: its
client (for SCAN and TIME, which settle's scripts do not cover) and its clock."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from settle._sync.settler import Settler

__all__ = ["client_of", "server_now"]


def client_of(settler: Settler) -> Any:
    """The redis-py client the settler runs its scripts on (standalone or cluster)."""
    return settler.client


def server_now(settler: Settler) -> datetime:
    """The server's clock: quarantine stream ids and record times are server time."""
    seconds, micros = client_of(settler).time()
    return datetime.fromtimestamp(int(seconds) + int(micros) / 1e6, tz=UTC)
