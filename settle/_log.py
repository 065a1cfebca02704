"""settle's structlog logger. Event names are stable (``settle.<area>.<what>``) and fields
are named; payloads, results and principals themselves are never logged.

A principal appears in a log line only as ``binding_digest``: the first 12 hex digits of
HMAC-SHA256 under a per-deployment secret, ``SETTLE_DIGEST_KEY``. Two lines of one
principal carry the same digest, so they can be correlated, but the digest cannot be
reversed with a dictionary of user ids without the secret. Without ``SETTLE_DIGEST_KEY`` each
process draws a random secret: digests then correlate lines of one process only. The
digest is for logs only; nothing stored depends on it, so the secret can be rotated at any
time. (An HTTP operation id carries an unkeyed digest of the principal: see
docs/http-endpoints.md, "What is exposed".)
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import secrets

import structlog

__all__ = ["DIGEST_KEY_ENV", "binding_digest", "logger"]

logger = structlog.get_logger("settle")

DIGEST_KEY_ENV = "SETTLE_DIGEST_KEY"


@functools.cache
def _digest_key() -> bytes:
    configured = os.environ.get(DIGEST_KEY_ENV, "")
    return configured.encode("utf-8") if configured else secrets.token_bytes(32)


def binding_digest(binding: str) -> str:
    """A short keyed digest of a principal, for log lines (never the principal itself)."""
    mac = hmac.new(_digest_key(), binding.encode("utf-8"), hashlib.sha256)
    return mac.hexdigest()[:12]
