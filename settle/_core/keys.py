"""Input validation and the Redis key layout (SPEC 4).

Every key of one operation, its attempt log and its shard's quarantine stream share the hash
tag ``{<namespace>:<shard>}``, so each script touches one slot and runs on Redis Cluster.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from settle._input import has_control
from settle.errors import InvalidInput

__all__ = ["MAX_BINDING_CHARS", "MAX_OPERATION_ID_CHARS", "Keys", "has_control", "shard_of"]

MAX_OPERATION_ID_CHARS = 256
MAX_BINDING_CHARS = 1024


def check_operation_id(operation_id: object) -> str:
    if not isinstance(operation_id, str):
        raise InvalidInput(f"operation id must be a str, got {type(operation_id).__name__}")
    if not 1 <= len(operation_id) <= MAX_OPERATION_ID_CHARS:
        raise InvalidInput(
            f"operation id must be 1 to {MAX_OPERATION_ID_CHARS} characters, "
            f"got {len(operation_id)}",
            operation_id=operation_id[:MAX_OPERATION_ID_CHARS] or None,
        )
    if has_control(operation_id):
        raise InvalidInput(
            "operation id must not contain control characters or line separators "
            "(U+0000-U+001F, U+007F-U+009F, U+2028, U+2029, format characters), nor a lone "
            "surrogate (bytes that were not UTF-8 text)",
            operation_id=operation_id,
        )
    return operation_id


def check_binding(binding: object, operation_id: str | None = None) -> str:
    if not isinstance(binding, str):
        raise InvalidInput(
            f"principal must be a str, got {type(binding).__name__}", operation_id=operation_id
        )
    if not 1 <= len(binding) <= MAX_BINDING_CHARS:
        raise InvalidInput(
            f"principal must be 1 to {MAX_BINDING_CHARS} characters", operation_id=operation_id
        )
    if has_control(binding):
        raise InvalidInput(
            "principal must not contain control characters, nor a lone surrogate (bytes that "
            "were not UTF-8 text)",
            operation_id=operation_id,
        )
    return binding


def shard_of(operation_id: str, shards: int) -> int:
    """A stable shard for an operation id: the same in every process and version."""
    digest = hashlib.sha256(operation_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % shards


@dataclass(frozen=True, slots=True)
class Keys:
    """Key names of one namespace."""

    namespace: str
    shards: int

    def tag(self, shard: int) -> str:
        return f"settle:{{{self.namespace}:{shard}}}"

    @property
    def meta(self) -> str:
        return f"settle:{{{self.namespace}}}:meta"

    def console_session(self, digest: str) -> str:
        """A sign-in of the console (settle.web), named by the SHA-256 of its session id
        (the id itself is only in the browser's cookie); it expires with the session."""
        return f"settle:{{{self.namespace}}}:console:session:{digest}"

    @property
    def console_epochs(self) -> str:
        """The console's principals' epochs: a hash from the SHA-256 of a principal to a
        random value made at its first sign-in and replaced by ``end_sessions``; a session
        holds only while it equals the one it started under (a lost one ends them all)."""
        return f"settle:{{{self.namespace}}}:console:epochs"

    def of(self, operation_id: str) -> tuple[int, str, str]:
        """(shard, record key, attempt log key) of an operation, hashing its id once. The
        attempt log lives inside the record's packed value; its own key is the previous
        layout's, which the scripts read and delete when they meet a record written by it."""
        shard = shard_of(operation_id, self.shards)
        tag = self.tag(shard)
        return shard, f"{tag}:op:{operation_id}", f"{tag}:log:{operation_id}"

    def record(self, operation_id: str) -> str:
        return f"{self.tag(shard_of(operation_id, self.shards))}:op:{operation_id}"

    def attempt_log(self, operation_id: str) -> str:
        """The previous layout's attempt log LIST (see :meth:`of`)."""
        return f"{self.tag(shard_of(operation_id, self.shards))}:log:{operation_id}"

    def generation(self, shard: int) -> str:
        """The shard's state HASH (never expires): ``gen``, the last generation issued there,
        and ``shards``, the shard count it was claimed for (lua/_lib.lua, ``guard``)."""
        return f"{self.tag(shard)}:gen"

    def quarantine(self, shard: int) -> str:
        return f"{self.tag(shard)}:quarantine"

    def resolutions(self, shard: int) -> str:
        return f"{self.tag(shard)}:quarantine:resolved"

    def identities(self, shard: int) -> str:
        """Identity of a rejected response -> its quarantine entry id (one entry each)."""
        return f"{self.tag(shard)}:quarantine:seen"

    def trimmed(self, shard: int) -> str:
        """The shard's last quarantine trim reply (a STRING, expires after a day): what a
        repeat of that call after a lost reply gets back (lua/quarantine_trim.lua)."""
        return f"{self.tag(shard)}:quarantine:trimmed"

    def quarantine_keys(self, shard: int) -> tuple[str, str, str]:
        """The stream, its resolutions and its identities."""
        return self.quarantine(shard), self.resolutions(shard), self.identities(shard)
