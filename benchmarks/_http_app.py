"""The server side of ``python -m benchmarks.http``: one FastAPI payment endpoint (a small
pydantic body in, a small pydantic body out, 201), bare or behind an idempotency middleware,
served by uvicorn with one worker in this process:

    python -m benchmarks._http_app VARIANT REDIS_URL PORT NAMESPACE
    python -m benchmarks._http_app --in-process VARIANT MODE REQUESTS REDIS_URL

``VARIANT`` is ``bare`` (no middleware), ``settle`` (:class:`settle.asgi.IdempotencyMiddleware`
as docs/http-endpoints.md sets it up) or ``peer`` (the ``fastapi-idempotency`` middleware on
:class:`RedisStore`, a Redis store of its ``Store`` protocol with one Lua script per call:
the package ships only an in-process store and a Tortoise ORM one).

``--in-process`` drives the same app without a server: ``REQUESTS`` raw ASGI calls from 32
concurrent tasks (the body and headers of ``benchmarks.http``; ``MODE`` ``new`` or
``replay``, or ``none``, no key, for ``bare`` only: settle answers a guarded path without a
key 400 and the peer would fall back to its automatic window, which :class:`RedisStore`
does not index) after a warm-up, and prints the CPU time per request; the app's Redis
clients are closed before it exits, as the server's are when uvicorn stops. Run under valgrind,
``REQUESTS`` minus ``0`` counts the instructions of a request (docs/benchmarks.md, "HTTP
endpoints over a real server"); ``SETTLE_LISTEN_AFTER_SCALE`` stretches the middleware's
0.1 s before it listens for a disconnect as much as valgrind slows the run down.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel, Field

from benchmarks._server import quiet_logs

__all__ = ["API_KEYS", "PATH", "RedisStore", "build"]

PATH = "/payments"
API_KEYS = {"sk_test_acme": "tenant:acme"}
VARIANTS = ("bare", "settle", "peer")
#: key modes of ``--in-process``: no key (``bare`` only), a new key each, one key replayed
MODES = ("none", "new", "replay")


class PaymentIn(BaseModel):
    amount: int = Field(gt=0, description="in minor units")
    currency: str = Field(pattern="^[A-Z]{3}$")
    customer: str


class PaymentOut(BaseModel):
    id: str
    status: str
    amount: int
    currency: str


def _tenant(authorization: bytes | None) -> str | None:
    scheme, _, token = (authorization or b"").decode("latin-1").partition(" ")
    return API_KEYS.get(token) if scheme.lower() == "bearer" else None


def principal(scope: Any) -> str | None:
    """settle's principal: the tenant of the bearer token (docs/http-endpoints.md)."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            return _tenant(value)
    return None


# -- the peer's store ------------------------------------------------------------------------

_CLAIM = """
local row = redis.call('HMGET', KEYS[1], 'fingerprint', 'status', 'headers', 'body')
if not row[1] then
  redis.call('HSET', KEYS[1], 'fingerprint', ARGV[1], 'scope', ARGV[2], 'explicit', ARGV[3],
             'version', ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return {'claimed'}
end
if row[1] ~= ARGV[1] then return {'conflict'} end
if row[2] then return {'stored', row[2], row[3], row[4]} end
return {'busy'}
"""
_RENEW = """
local row = redis.call('HMGET', KEYS[1], 'version', 'status')
if row[1] ~= ARGV[1] or row[2] then return 0 end
redis.call('HSET', KEYS[1], 'version', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""
_COMPLETE = """
local row = redis.call('HMGET', KEYS[1], 'version', 'status')
if row[1] ~= ARGV[1] or row[2] then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'headers', ARGV[3], 'body', ARGV[4],
           'version', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return 1
"""
_RELEASE = """
local row = redis.call('HMGET', KEYS[1], 'version', 'status')
if row[1] == ARGV[1] and not row[2] then redis.call('DEL', KEYS[1]) end
return 1
"""


class RedisStore:
    """``fastapi_idempotency.Store`` on Redis: one EVALSHA per call, a HASH per key that
    expires on its own (so ``cleanup`` has nothing to do). Automatic-window keys (requests
    without a header) are not indexed by scope: the benchmark always sends a key."""

    def __init__(self, url: str, prefix: str) -> None:
        self._redis = aioredis.Redis.from_url(url)
        self._prefix = prefix
        self._claim = self._redis.register_script(_CLAIM)
        self._renew = self._redis.register_script(_RENEW)
        self._complete = self._redis.register_script(_COMPLETE)
        self._release = self._redis.register_script(_RELEASE)

    def _key(self, key: str) -> str:
        return f"{self._prefix}:{key}"

    async def claim(
        self, *, key: str, scope: str, fingerprint: str, explicit: bool, lease_seconds: float
    ) -> Any:
        from fastapi_idempotency import (  # noqa: PLC0415 - the bench extra's peer
            Claim,
            ConflictingRequestError,
            StoredResponse,
        )

        version = uuid.uuid4().hex
        args = [fingerprint, scope, int(explicit), version, int(lease_seconds * 1000)]
        row = await self._claim(keys=[self._key(key)], args=args)
        verdict = row[0]
        if verdict == b"claimed":
            return Claim(key=key, scope=scope, explicit=explicit, version=version)
        if verdict == b"conflict":
            raise ConflictingRequestError(key)
        if verdict == b"stored":
            headers = [(n, v) for n, v in json.loads(row[2])]
            return StoredResponse(int(row[1]), headers, bytes(row[3]))
        return None

    async def renew(self, claim: Any, lease_seconds: float) -> Any:
        from dataclasses import replace  # noqa: PLC0415

        version = uuid.uuid4().hex
        args = [claim.version, version, int(lease_seconds * 1000)]
        if not await self._renew(keys=[self._key(claim.key)], args=args):
            return None
        return replace(claim, version=version)

    async def complete(self, claim: Any, response: Any, ttl_seconds: float) -> bool:
        args = [
            claim.version,
            response.status_code,
            json.dumps(response.headers),
            response.body,
            uuid.uuid4().hex,
            int(ttl_seconds * 1000),
        ]
        return bool(await self._complete(keys=[self._key(claim.key)], args=args))

    async def release(self, claim: Any) -> None:
        await self._release(keys=[self._key(claim.key)], args=[claim.version])

    async def aclose(self) -> None:
        await self._redis.aclose()

    async def forget_previous_automatic(self, scope: str, keep: str) -> None:  # noqa: ARG002
        return None

    async def cleanup(self) -> None:
        return None


# -- the app -----------------------------------------------------------------------------------


async def close(app: FastAPI) -> None:
    """Close the Redis clients ``build`` opened for ``app`` (its settler or its store)."""
    closers: list[Callable[[], Awaitable[None]]] = app.state.closers
    while closers:
        await closers.pop()()


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    await close(app)


def build(variant: str, url: str, namespace: str) -> FastAPI:
    """The app of ``variant``; its Redis clients close when the server stops (its lifespan)
    or on :func:`close`."""
    if variant not in VARIANTS:
        raise SystemExit(f"unknown variant {variant!r}: {', '.join(VARIANTS)}")
    app = FastAPI(lifespan=_lifespan)
    app.state.closers = []
    if variant == "settle":
        from settle import AsyncSettler  # noqa: PLC0415
        from settle.asgi import IdempotencyMiddleware  # noqa: PLC0415

        settler = AsyncSettler.from_url(url, namespace=namespace)
        app.state.closers.append(settler.aclose)
        app.add_middleware(
            IdempotencyMiddleware, settler=settler, principal=principal, paths=[PATH]
        )
    elif variant == "peer":
        from fastapi_idempotency import IdempotencyMiddleware as Peer  # noqa: PLC0415

        def scope(request: Any) -> str:
            return _tenant(request.headers.get("authorization", "").encode("latin-1")) or ""

        store = RedisStore(url, namespace)
        app.state.closers.append(store.aclose)
        app.add_middleware(Peer, store=store, methods=("POST", "PATCH"), scope=scope)

    @app.post(PATH, status_code=201, response_model=PaymentOut)
    async def create_payment(payment: PaymentIn) -> PaymentOut:
        return PaymentOut(
            id=f"ch_{uuid.uuid4().hex[:16]}",
            status="succeeded",
            amount=payment.amount,
            currency=payment.currency,
        )

    return app


# -- in-process ------------------------------------------------------------------------------


def _scope(key: str | None, body: bytes) -> dict[str, Any]:
    headers = [
        (b"host", b"127.0.0.1:8000"),
        (b"content-length", str(len(body)).encode()),
        (b"content-type", b"application/json"),
        (b"authorization", b"Bearer sk_test_acme"),
    ]
    if key is not None:
        headers.append((b"idempotency-key", key.encode()))
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 5000),
        "scheme": "http",
        "method": "POST",
        "root_path": "",
        "path": PATH,
        "raw_path": PATH.encode(),
        "query_string": b"",
        "headers": headers,
        "state": {},
    }


async def _requests(app: Any, keys: list[str | None], body: bytes, tasks: int = 32) -> None:
    """``keys`` (None: no key) as raw ASGI calls from ``tasks`` concurrent tasks; each must
    answer 201."""
    todo = iter(keys)

    async def one(key: str | None) -> None:
        sent: list[Any] = []
        delivered = False

        async def receive() -> Any:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # the client never leaves
            return {"type": "http.disconnect"}

        async def send(message: Any) -> None:
            sent.append(message)

        await app(_scope(key, body), receive, send)
        if sent[0]["status"] != 201:
            raise RuntimeError(f"the app answered {sent[0]['status']}")

    async def worker() -> None:
        for key in todo:
            await one(key)

    await asyncio.gather(*(worker() for _ in range(tasks)))


def in_process(variant: str, mode: str, requests: int, url: str) -> float:
    """CPU seconds per request of ``requests`` driven in this process (after 200 warm-up
    requests; a replay's key completed before them)."""
    if mode not in MODES:
        raise SystemExit(f"unknown mode {mode!r}: {', '.join(MODES)}")
    if mode == "none" and variant != "bare":
        raise SystemExit(
            f"mode 'none' sends no Idempotency-Key, which only the bare app serves as "
            f"measured (settle answers 400, the peer falls back to its automatic window): "
            f"use 'new' or 'replay' for {variant!r}"
        )
    import settle.asgi.runner  # noqa: PLC0415

    settle.asgi.runner.LISTEN_AFTER *= float(os.environ.get("SETTLE_LISTEN_AFTER_SCALE", "1"))
    body = json.dumps({"amount": 1250, "currency": "EUR", "customer": "cus_42"}).encode()
    app = build(variant, url, f"inproc-{uuid.uuid4().hex[:8]}")
    prefix = uuid.uuid4().hex[:12]

    def keys(n: int, run: str) -> list[str | None]:
        if mode == "none":
            return [None] * n
        return [prefix if mode == "replay" else f"{prefix}-{run}-{i}" for i in range(n)]

    loop = asyncio.new_event_loop()
    try:
        if mode == "replay":
            loop.run_until_complete(_requests(app, keys(1, "first"), body, tasks=1))
        loop.run_until_complete(_requests(app, keys(200, "warm"), body))
        cpu = time.process_time()
        loop.run_until_complete(_requests(app, keys(requests, "measured"), body))
        return (time.process_time() - cpu) / max(requests, 1)
    finally:
        loop.run_until_complete(close(app))
        loop.close()


def main(argv: list[str]) -> int:
    quiet_logs()
    if argv[:1] == ["--in-process"]:
        variant, mode, requests, url = argv[1:]
        per_request = in_process(variant, mode, int(requests), url)
        print(json.dumps({"variant": variant, "mode": mode, "cpu_us": per_request * 1e6}))
        return 0
    variant, url, port, namespace = argv
    uvicorn.run(
        build(variant, url, namespace),
        host="127.0.0.1",
        port=int(port),
        workers=1,
        log_level="warning",
        access_log=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
