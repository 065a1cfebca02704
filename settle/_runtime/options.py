"""The options every part's runner shares: how many replicas must acknowledge a write, and
whether an evicting ``maxmemory-policy`` is accepted."""

from __future__ import annotations

from dataclasses import dataclass

from settle.errors import InvalidInput, InvalidOption

__all__ = ["MAX_MIN_REPLICAS", "Durability", "check_client"]

#: The most replicas a write may wait for: ``WAIT`` takes a signed 64-bit count.
MAX_MIN_REPLICAS = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Durability:
    """With ``min_replicas = N > 0`` every writing script is followed, on the same
    connection, by ``WAIT N replica_timeout`` (or the call's shorter bound, ``Call.wait_ms``:
    a renewal's); fewer acknowledgements raise
    :class:`~settle.errors.DurabilityError` (the outcome is then uncertain).

    ``allow_eviction``: a server whose ``maxmemory-policy`` may evict settle's keys (every
    ``allkeys-*`` and ``volatile-*`` policy: settle's keys carry a TTL) is refused at
    start-up unless this is True; then a warning is logged once instead."""

    min_replicas: int = 0
    replica_timeout: float = 1.0
    allow_eviction: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.min_replicas, bool) or not isinstance(self.min_replicas, int):
            raise InvalidOption("min_replicas must be a whole number of replicas")
        if not isinstance(self.allow_eviction, bool):
            raise InvalidOption("allow_eviction must be True or False")
        if not 0 <= self.min_replicas <= MAX_MIN_REPLICAS:
            # A larger count was accepted here and failed every write (WAIT refuses it).
            raise InvalidOption(
                f"min_replicas must be 0 to {MAX_MIN_REPLICAS}, got {self.min_replicas}"
            )
        if isinstance(self.replica_timeout, bool) or not isinstance(
            self.replica_timeout, int | float
        ):
            raise InvalidOption("replica_timeout must be a number of seconds")
        if not 0 < self.replica_timeout <= 3600:
            raise InvalidOption(
                f"replica_timeout must be more than 0 and at most 3600 s, got "
                f"{self.replica_timeout}"
            )

    @property
    def wait_ms(self) -> int:
        return max(1, round(self.replica_timeout * 1000))

    def wait_ms_for(self, bound: int | None) -> int:
        """The ``WAIT`` timeout of a call that waits at most ``bound`` ms (None: no bound of
        its own, ``replica_timeout``)."""
        return self.wait_ms if bound is None else max(1, min(self.wait_ms, bound))


def check_client(
    client: object, kinds: tuple[type, ...], owner: str, build: str = "from_url(url)"
) -> None:
    """Refuse, before anything is built, a ``client`` that is none of ``kinds`` (the redis-py
    clients of the owner's flavour): ``None``, a URL, the other flavour's client. It was
    taken, and failed later with an ``AttributeError`` or a coroutine never awaited."""
    if isinstance(client, kinds):
        return
    names = " or ".join(
        f"{'redis.asyncio' if k.__module__.startswith('redis.asyncio') else 'redis'}.{k.__name__}"
        for k in kinds
    )
    got = type(client)
    raise InvalidInput(
        f"{owner} needs a {names} client, got {got.__module__}.{got.__qualname__}; "
        f"build one with {owner}.{build}"
    )
