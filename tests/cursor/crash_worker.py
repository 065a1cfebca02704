"""A consumer process for the crash tests: drains a stream from the test's HTTP provider and
SIGKILLs itself at a chosen cut.

    python -m tests.cursor.crash_worker REDIS_URL NAMESPACE STREAM PROVIDER_URL [CUT]

CUT is ``<log event>:<n>`` (killed right after the n-th such log line, i.e. right after the
transition it reports became durable, or right before the step it announces) or
``effect:<n>`` (killed after the n-th event's effect, before its receipt). Effects go to
Redis: ``SET <ns>:effect:<key> <event id> NX`` (idempotent) and ``HINCRBY <ns>:calls``.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import httpx
import redis
import structlog

from settle.cursor import CursorConsumer, CursorStore, Event, EventContext, ProviderContract
from tests.cursor.helpers import drain
from tests.cursor.provider import fetcher


def main(url: str, namespace: str, stream: str, provider: str, cut: str = "") -> None:
    name, _, nth = cut.partition(":")
    seen = {"n": 0}

    def kill_at_cut(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("event") == name:
            seen["n"] += 1
            if seen["n"] == int(nth):
                os.kill(os.getpid(), signal.SIGKILL)
        return event

    structlog.configure(processors=[kill_at_cut, structlog.processors.JSONRenderer()])
    r = redis.Redis.from_url(url)
    effects = {"n": 0}

    def handle(event: Event, ctx: EventContext) -> None:
        r.set(f"{namespace}:effect:{ctx.key}", event.id, nx=True)
        r.hincrby(f"{namespace}:calls", event.id, 1)
        effects["n"] += 1
        if name == "effect" and effects["n"] == int(nth):
            os.kill(os.getpid(), signal.SIGKILL)

    store = CursorStore.from_url(url, namespace=namespace)
    with httpx.Client() as http:
        consumer = CursorConsumer(
            fetcher(provider, http),
            handle,
            ProviderContract(rotation_allowed=True),
            store=store,
            stream=stream,
        )
        drain(consumer)


if __name__ == "__main__":
    main(*sys.argv[1:])
