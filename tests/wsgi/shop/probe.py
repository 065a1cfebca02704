"""Test instrumentation: every run of a guarded handler is counted in Redis (a list per
namespace, so a killed server's runs count too), and held while the key ``<ns>:hold`` exists."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis

_redis = redis.Redis.from_url(os.environ.get("SETTLE_REDIS_URL", "redis://localhost:6379/0"))
_ns = os.environ.get("SETTLE_NAMESPACE", "payments")


def ran(attempt: Any, path: str) -> None:
    if attempt is None:
        return
    run = {"path": path, "generation": attempt.generation, "pid": os.getpid()}
    _redis.rpush(f"{_ns}:runs", json.dumps(run))
    while _redis.exists(f"{_ns}:hold"):
        time.sleep(0.02)


def count(path: str) -> int:
    """How many runs of ``path`` were counted (this one included)."""
    return sum(json.loads(raw)["path"] == path for raw in _redis.lrange(f"{_ns}:runs", 0, -1))


def crash_first(path: str) -> int:
    """Raise on the first run of ``path`` (after its side effect was counted)."""
    n = count(path)
    if n == 1:
        raise RuntimeError("the handler crashed after its side effect")
    return n


class ProbeMiddleware:
    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        ran(getattr(request, "settle", None), request.path)
        return self.get_response(request)
