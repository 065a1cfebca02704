"""Key layout of ``settle.progress`` (progress server and stream server).

Progress: every key of one consumer shares the hash tag ``{<namespace>:progress:<consumer>}``,
so each progress script touches one slot. Stream side: the incarnation marker and the
dead-letter stream share the stream key's slot, so the stream scripts do too.
"""

from __future__ import annotations

from dataclasses import dataclass

from settle._runtime.scripts import wait_probe_key
from settle._runtime.topology import hash_tag
from settle.config import check_namespace
from settle.progress.errors import InvalidDelivery
from settle.progress.identity import EmissionId, check_name

__all__ = ["ProgressKeys", "StreamKeys"]


@dataclass(frozen=True, slots=True)
class ProgressKeys:
    namespace: str
    consumer: str

    def __post_init__(self) -> None:
        check_namespace(self.namespace, InvalidDelivery)
        check_name(self.consumer, "consumer")
        if "{" in self.consumer or "}" in self.consumer:
            raise InvalidDelivery("consumer must not contain braces (it is a hash tag)")

    @property
    def tag(self) -> str:
        return f"settle:{{{self.namespace}:progress:{self.consumer}}}"

    @property
    def scopes(self) -> str:
        return f"{self.tag}:scopes"

    def scope(self, scope_id: str) -> tuple[str, ...]:
        """meta, applied, resolved, gaps, intents, deferred, dead, receipts, scopes (the
        scripts' KEYS[1..9]; the emission is KEYS[10], :meth:`holds` KEYS[11])."""
        base = f"{self.tag}:s:{scope_id}"
        parts = ("meta", "applied", "resolved", "gaps", "intents", "deferred", "dead", "receipts")
        return (*(f"{base}:{p}" for p in parts), self.scopes)

    def emission(self, emission: EmissionId | None) -> str:
        return f"{self.tag}:em:{emission.value}" if emission else f"{self.tag}:em-none"

    def holds(self, scope_id: str) -> str:
        """The scope's index of its gaps and deferrals (a ZSET; see ``lua/_lib.lua``)."""
        return f"{self.tag}:s:{scope_id}:holds"


@dataclass(frozen=True, slots=True)
class StreamKeys:
    stream: str

    def __post_init__(self) -> None:
        check_name(self.stream, "stream")
        if hash_tag(self.stream) is None and "}" in self.stream:
            raise InvalidDelivery(
                "a stream name with '}' needs a hash tag ({...}) so settle's keys can share "
                "its slot"
            )
        if self.stream == wait_probe_key(self.stream):
            raise InvalidDelivery(
                f"stream {self.stream!r} is the key settle's min_replicas probe writes (it "
                "would set the stream to expire): name the stream otherwise"
            )

    @property
    def tag(self) -> str:
        return hash_tag(self.stream) or self.stream

    @property
    def incarnation(self) -> str:
        return f"settle:{{{self.tag}}}:incarnation:{self.stream}"

    @property
    def acknowledged(self) -> str:
        """The acknowledged mark: a hash, one field per progress consumer and group, whose
        value is the last incarnation in which one of their deliveries was acknowledged
        (``lua/stream_settle.lua``)."""
        return f"settle:{{{self.tag}}}:acked:{self.stream}"

    @property
    def dead_letters(self) -> str:
        return f"settle:{{{self.tag}}}:dead:{self.stream}"
