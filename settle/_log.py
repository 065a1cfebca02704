"""settle's structlog logger. Event names are stable (``settle.<area>.<what>``) and fields
are named; payloads, results and principals are never logged (a principal appears only as a
short digest, so two log lines can still be correlated)."""

from __future__ import annotations

import hashlib

import structlog

__all__ = ["binding_digest", "logger"]

logger = structlog.get_logger("settle")


def binding_digest(binding: str) -> str:
    return hashlib.sha256(binding.encode("utf-8")).hexdigest()[:12]
