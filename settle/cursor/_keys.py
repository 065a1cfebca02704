"""Validation of stream names and the Redis key layout of one stream.

Every key of a stream shares the hash tag ``{<namespace>:cursor:<stream>}``, so each script
touches one slot and runs unchanged on Redis Cluster.
"""

from __future__ import annotations

from settle._input import has_control
from settle.errors import InvalidInput

__all__ = ["MAX_STREAM_CHARS", "check_stream", "stream_keys"]

MAX_STREAM_CHARS = 256


def check_stream(stream: object) -> str:
    if not isinstance(stream, str):
        raise InvalidInput(f"stream must be a str, got {type(stream).__name__}")
    if not 1 <= len(stream) <= MAX_STREAM_CHARS:
        raise InvalidInput(f"stream must be 1 to {MAX_STREAM_CHARS} characters")
    if has_control(stream) or "{" in stream or "}" in stream:
        raise InvalidInput(
            "stream must not contain control characters or braces (it is part of a hash tag)",
            operation_id=stream,
        )
    return stream


def stream_keys(namespace: str, stream: str) -> tuple[str, str, str, str, str]:
    """checkpoint, witnesses, witness index, receipts, receipt index (see lua/_lib.lua)."""
    tag = f"settle:{{{namespace}:cursor:{stream}}}"
    return (f"{tag}:ckpt", f"{tag}:wit", f"{tag}:wits", f"{tag}:rcpt", f"{tag}:rpos")
