"""The server side of ``python -m benchmarks.http``: one FastAPI payment endpoint (a small
pydantic body in, a small pydantic body out, 201), bare or behind an idempotency middleware,
served by uvicorn with one worker in this process:

    python -m benchmarks._http_app VARIANT REDIS_URL PORT NAMESPACE

``VARIANT`` is ``bare`` (no middleware), ``settle`` (:class:`settle.asgi.IdempotencyMiddleware`
as docs/http-endpoints.md sets it up) or ``peer`` (the ``fastapi-idempotency`` middleware on
:class:`RedisStore`, a Redis store of its ``Store`` protocol with one Lua script per call:
the package ships only an in-process store and a Tortoise ORM one).
"""

from __future__ import annotations

import json
import sys
import uuid
from typing import Any

import redis.asyncio as aioredis
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel, Field

from benchmarks._server import quiet_logs

__all__ = ["API_KEYS", "PATH", "RedisStore", "build"]

PATH = "/payments"
API_KEYS = {"sk_test_acme": "tenant:acme"}


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

    async def forget_previous_automatic(self, scope: str, keep: str) -> None:  # noqa: ARG002
        return None

    async def cleanup(self) -> None:
        return None


# -- the app -----------------------------------------------------------------------------------


def build(variant: str, url: str, namespace: str) -> FastAPI:
    app = FastAPI()
    if variant == "settle":
        from settle import AsyncSettler  # noqa: PLC0415
        from settle.asgi import IdempotencyMiddleware  # noqa: PLC0415

        settler = AsyncSettler.from_url(url, namespace=namespace)
        app.add_middleware(
            IdempotencyMiddleware, settler=settler, principal=principal, paths=[PATH]
        )
    elif variant == "peer":
        from fastapi_idempotency import IdempotencyMiddleware as Peer  # noqa: PLC0415

        def scope(request: Any) -> str:
            return _tenant(request.headers.get("authorization", "").encode("latin-1")) or ""

        app.add_middleware(
            Peer, store=RedisStore(url, namespace), methods=("POST", "PATCH"), scope=scope
        )
    elif variant != "bare":
        raise SystemExit(f"unknown variant {variant!r}: bare, settle or peer")

    @app.post(PATH, status_code=201, response_model=PaymentOut)
    async def create_payment(payment: PaymentIn) -> PaymentOut:
        return PaymentOut(
            id=f"ch_{uuid.uuid4().hex[:16]}",
            status="succeeded",
            amount=payment.amount,
            currency=payment.currency,
        )

    return app


def main(argv: list[str]) -> int:
    variant, url, port, namespace = argv
    quiet_logs()
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
