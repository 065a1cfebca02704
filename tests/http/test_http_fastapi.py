"""IdempotencyMiddleware with FastAPI: the payment example of docs/http-endpoints.md, run as
written, and FastAPI's own behaviours (validation errors, the attempt dependency)."""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from settle import AsyncSettler
from settle.asgi import IdempotencyMiddleware, ProblemKind
from settle.attempt import Attempt
from settle.fastapi import CurrentAttempt
from tests.http.docs import DOC, section_blocks


def doc_example() -> str:
    blocks = section_blocks("A payment endpoint with FastAPI")
    assert len(blocks) == 1, "the FastAPI section has exactly one runnable example"
    return blocks[0]


def bearer(token: str, key: str | None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token}"}
    if key is not None:
        headers["Idempotency-Key"] = f'"{key}"'
    return headers


@pytest.mark.asyncio
async def test_the_documented_payment_endpoint(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SETTLE_REDIS_URL", redis_url)
    monkeypatch.setenv("SETTLE_NAMESPACE", namespace)
    example: dict[str, Any] = {"__name__": "payments_example"}
    exec(compile(doc_example(), str(DOC), "exec"), example)
    app, provider, settler = example["app"], example["provider"], example["settler"]
    transport = httpx.ASGITransport(app=app)
    payment = {"amount": 4200, "currency": "EUR", "customer": "cus_1"}
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://shop") as client:
            key = str(uuid.uuid4())
            first = await client.post(
                "/payments", json=payment, headers=bearer("sk_test_acme", key)
            )
            assert first.status_code == 201
            assert first.json()["status"] == "succeeded"
            assert first.headers["location"] == f"/payments/{first.json()['id']}"

            retry = await client.post(
                "/payments", json=payment, headers=bearer("sk_test_acme", key)
            )
            assert retry.content == first.content
            assert retry.headers["idempotent-replayed"] == "true"
            assert retry.headers["location"] == first.headers["location"]

            other_tenant = await client.post(
                "/payments", json=payment, headers=bearer("sk_test_umbrella", key)
            )
            assert other_tenant.status_code == 201
            assert other_tenant.json()["id"] != first.json()["id"]

            changed = await client.post(
                "/payments", json={**payment, "amount": 1}, headers=bearer("sk_test_acme", key)
            )
            assert changed.status_code == 422
            assert changed.json()["type"] == "urn:settle:problem:idempotency-key-reused"

            no_key = await client.post(
                "/payments", json=payment, headers=bearer("sk_test_acme", None)
            )
            assert no_key.status_code == 400
            anonymous = await client.post(
                "/payments", json=payment, headers={"Idempotency-Key": "x"}
            )
            assert anonymous.status_code == 401
            assert anonymous.headers["www-authenticate"] == 'Bearer realm="payments"'
        assert len(provider.charges) == 2  # one per tenant, none for the replay
    finally:
        await settler.aclose()


def test_the_doc_lists_every_status_the_middleware_returns() -> None:
    text = DOC.read_text()
    rows = re.findall(r"^\| (\d{3}) \| `([a-z-]+)` \|", text, flags=re.MULTILINE)
    assert sorted((int(status), slug) for status, slug in rows) == sorted(
        (kind.status, kind.value) for kind in ProblemKind
    )


class Charge(BaseModel):
    amount: int
    currency: str


def fastapi_app(settler: AsyncSettler, runs: list[Attempt], **options: Any) -> FastAPI:
    app = FastAPI()
    app.add_middleware(
        IdempotencyMiddleware, settler=settler, principal=lambda scope: "tenant:acme", **options
    )

    @app.post("/charges", status_code=201)
    async def create(charge: Charge, attempt: CurrentAttempt) -> dict[str, Any]:
        runs.append(attempt)
        return {"id": uuid.uuid4().hex, "amount": charge.amount, "gen": attempt.generation}

    @app.patch("/charges/{charge_id}")
    def update(charge_id: str, charge: Charge, attempt: CurrentAttempt) -> dict[str, Any]:
        runs.append(attempt)  # a sync endpoint: FastAPI runs it in a thread
        return {"id": charge_id, "amount": charge.amount, "nonce": uuid.uuid4().hex}

    return app


@pytest.mark.asyncio
async def test_fastapi_validation_error_is_a_finished_response(
    async_settler: AsyncSettler,
) -> None:
    """FastAPI's 422 for an invalid body is the endpoint's answer: stored and replayed."""
    runs: list[Attempt] = []
    app = fastapi_app(async_settler, runs)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        bad = {"amount": "lots", "currency": "EUR"}
        first = await client.post("/charges", json=bad, headers={"Idempotency-Key": "v-1"})
        again = await client.post("/charges", json=bad, headers={"Idempotency-Key": "v-1"})
        assert first.status_code == again.status_code == 422
        assert again.content == first.content
        assert again.headers["idempotent-replayed"] == "true"
        fixed = await client.post(
            "/charges", json={"amount": 5, "currency": "EUR"}, headers={"Idempotency-Key": "v-1"}
        )
        assert fixed.json()["type"] == "urn:settle:problem:idempotency-key-reused"
    assert runs == []


@pytest.mark.asyncio
async def test_fastapi_async_and_sync_endpoints_get_their_attempt(
    async_settler: AsyncSettler,
) -> None:
    runs: list[Attempt] = []
    app = fastapi_app(async_settler, runs, require_key=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        body = {"amount": 5, "currency": "EUR"}
        created = await client.post("/charges", json=body, headers={"Idempotency-Key": "a-1"})
        patched = await client.patch("/charges/c1", json=body, headers={"Idempotency-Key": "a-2"})
        repatched = await client.patch("/charges/c1", json=body, headers={"Idempotency-Key": "a-2"})
        unguarded = await client.post("/charges", json=body)
    assert created.status_code == 201
    assert patched.status_code == 200
    assert repatched.content == patched.content
    assert [a.operation_id.rsplit(":", 1)[1] for a in runs] == ["a-1", "a-2"]
    assert runs[0].idempotency_key != runs[1].idempotency_key
    assert unguarded.status_code == 400  # the dependency: no attempt without a key
