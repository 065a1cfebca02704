"""The options every part's runner shares: how many replicas must acknowledge a write."""

from __future__ import annotations

from dataclasses import dataclass

from settle.errors import ConfigurationError

__all__ = ["Durability"]


@dataclass(frozen=True, slots=True)
class Durability:
    """With ``min_replicas = N > 0`` every writing script is followed, on the same
    connection, by ``WAIT N replica_timeout``; fewer acknowledgements raise
    :class:`~settle.errors.DurabilityError` (the outcome is then uncertain)."""

    min_replicas: int = 0
    replica_timeout: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.min_replicas, bool) or not isinstance(self.min_replicas, int):
            raise ConfigurationError("min_replicas must be a whole number of replicas")
        if self.min_replicas < 0:
            raise ConfigurationError(f"min_replicas must be 0 or more, got {self.min_replicas}")
        if isinstance(self.replica_timeout, bool) or not isinstance(
            self.replica_timeout, int | float
        ):
            raise ConfigurationError("replica_timeout must be a number of seconds")
        if not 0 < self.replica_timeout <= 3600:
            raise ConfigurationError(
                f"replica_timeout must be more than 0 and at most 3600 s, got "
                f"{self.replica_timeout}"
            )

    @property
    def wait_ms(self) -> int:
        return max(1, round(self.replica_timeout * 1000))
