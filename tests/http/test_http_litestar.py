"""IdempotencyMiddleware in a Litestar app (no Starlette underneath), on a real Redis."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from litestar import Litestar, Request, post
from litestar.middleware import DefineMiddleware
from litestar.params import JSONBody
from litestar.response import Response

from settle import AsyncSettler
from settle.asgi import IdempotencyMiddleware, current_attempt

pytestmark = pytest.mark.asyncio


def litestar_app(settler: AsyncSettler, effects: list[int]) -> Litestar:
    @post("/orders")
    async def create_order(
        request: Request[Any, Any, Any], data: JSONBody[dict[str, Any]]
    ) -> Response[Any]:
        attempt = current_attempt(request.scope)
        effects.append(attempt.generation)
        order = {"id": uuid.uuid4().hex, "items": data["items"], "generation": attempt.generation}
        return Response(order, status_code=201, headers={"location": f"/orders/{order['id']}"})

    def principal(scope: Any) -> str | None:
        return dict(scope["headers"]).get(b"x-tenant", b"").decode() or None

    middleware = DefineMiddleware(IdempotencyMiddleware, settler=settler, principal=principal)
    return Litestar(route_handlers=[create_order], middleware=[middleware])


async def test_litestar_replay_mismatch_and_missing_key(async_settler: AsyncSettler) -> None:
    effects: list[int] = []
    app = litestar_app(async_settler, effects)
    transport = httpx.ASGITransport(app=app)
    headers = {"x-tenant": "tenant:acme", "idempotency-key": "order-1"}
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        first = await client.post("/orders", json={"items": [1, 2]}, headers=headers)
        assert first.status_code == 201
        again = await client.post(
            "/orders",
            content=b'{ "items" : [1,2] }',
            headers={**headers, "content-type": "application/json"},
        )
        assert again.content == first.content
        assert again.headers["idempotent-replayed"] == "true"
        assert again.headers["location"] == first.headers["location"]

        changed = await client.post("/orders", json={"items": [3]}, headers=headers)
        assert changed.status_code == 422
        assert changed.headers["content-type"] == "application/problem+json"

        missing = await client.post("/orders", json={"items": [1]}, headers={"x-tenant": "t"})
        assert missing.status_code == 400
        assert missing.json()["type"] == "urn:settle:problem:idempotency-key-missing"
    assert effects == [first.json()["generation"]]
