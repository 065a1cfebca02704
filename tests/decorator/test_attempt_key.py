"""The downstream idempotency key an attempt hands its function (``Attempt.idempotency_key``):
the one a payments provider deduplicates by, so the same value from every version of settle,
whether the attempt derives it when made or when first read, for the decorator (sync and
async) and the HTTP guard alike, and still assignable as the attribute it always was."""

from __future__ import annotations

import copy
import pickle
import time
import uuid
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from settle import AsyncSettler, Settler
from settle.asgi import IdempotencyMiddleware
from settle.attempt import Attempt, downstream_key
from settle.fastapi import CurrentAttempt

PRINCIPAL = "tenant:acme"


def test_the_downstream_key_is_the_one_every_version_derived() -> None:
    # A retry after an upgrade must send the provider the key the first attempt sent.
    assert (
        downstream_key("ns", PRINCIPAL, "op") == "settle_eae899c2bdbc9c31bd827d2bb0c6d5b8380a74f2"
    )


def test_a_decorated_functions_attempt_has_the_key_of_its_namespace_principal_and_id(
    settler: Settler, namespace: str
) -> None:
    seen: list[Attempt] = []

    @settler.operation(key="charge:{order}", principal=PRINCIPAL)
    def charge(order: str, attempt: Attempt = Attempt.INJECTED) -> int:
        seen.append(attempt)
        return 1

    charge("o-1")
    (attempt,) = seen
    expected = downstream_key(namespace, PRINCIPAL, "charge:o-1")
    assert attempt.idempotency_key == expected
    assert f"idempotency_key={expected!r}" in repr(attempt)


@pytest.mark.asyncio
async def test_an_async_decorated_functions_attempt_has_the_same_key(
    async_settler: AsyncSettler, namespace: str
) -> None:
    seen: list[Attempt] = []

    @async_settler.operation(key="charge:{order}", principal=PRINCIPAL)
    async def charge(order: str, attempt: Attempt = Attempt.INJECTED) -> int:
        seen.append(attempt)
        return 1

    await charge("o-1")
    (attempt,) = seen
    assert attempt.idempotency_key == downstream_key(namespace, PRINCIPAL, "charge:o-1")


@pytest.mark.asyncio
async def test_the_http_guards_attempt_has_the_key_of_its_namespace_principal_and_id(
    async_settler: AsyncSettler, namespace: str
) -> None:
    seen: list[Attempt] = []
    app = FastAPI()
    app.add_middleware(
        IdempotencyMiddleware, settler=async_settler, principal=lambda scope: PRINCIPAL
    )

    @app.post("/charges", status_code=201)
    async def create(attempt: CurrentAttempt) -> dict[str, Any]:
        seen.append(attempt)
        return {"id": uuid.uuid4().hex}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        created = await client.post("/charges", json={}, headers={"Idempotency-Key": "k-1"})
    assert created.status_code == 201
    (attempt,) = seen
    assert attempt.idempotency_key == downstream_key(namespace, PRINCIPAL, attempt.operation_id)


def test_an_attempts_key_is_kept_by_copy_and_pickle_and_may_be_assigned(
    settler: Settler, namespace: str
) -> None:
    """Read before anything else (derived on first read): copied, pickled, or assigned over
    before and after it is first read, it is what the attribute always was."""
    seen: list[Attempt] = []

    @settler.operation(key="charge:{order}", principal=PRINCIPAL)
    def charge(order: str, attempt: Attempt = Attempt.INJECTED) -> int:
        seen.append(attempt)
        return 1

    for order in ("o-1", "o-2", "o-3", "o-4"):
        charge(order)
    copied, pickled, assigned, read_then_assigned = seen
    assert copy.copy(copied).idempotency_key == downstream_key(namespace, PRINCIPAL, "charge:o-1")
    assert copy.deepcopy(copied).idempotency_key == copied.idempotency_key
    unpickled = pickle.loads(pickle.dumps(pickled))
    assert unpickled.idempotency_key == downstream_key(namespace, PRINCIPAL, "charge:o-2")
    assigned.idempotency_key = "mine"
    assert assigned.idempotency_key == "mine"
    assert read_then_assigned.idempotency_key == downstream_key(namespace, PRINCIPAL, "charge:o-4")
    read_then_assigned.idempotency_key = "mine too"
    assert read_then_assigned.idempotency_key == "mine too"
    made = Attempt(operation_id="x", generation=1, number=1, idempotency_key="k", attempt_id="a")
    assert made.idempotency_key == "k"


def test_a_pickled_or_copied_attempt_holds_its_key_never_the_principal(
    settler: Settler, namespace: str
) -> None:
    """The key is what reveals neither namespace nor principal; an attempt derives it when
    first read, and until then held the principal: pickled before that read (handed to a
    worker process, a task queue), the bytes carried the principal in clear."""
    seen: list[Attempt] = []

    @settler.operation(key="charge:{order}", principal="tenant:acme/user:42")
    def charge(order: str, attempt: Attempt = Attempt.INJECTED) -> int:
        seen.append(attempt)
        return 1

    charge("o-1")
    (attempt,) = seen
    data = pickle.dumps(attempt)
    assert b"tenant:acme" not in data
    assert b"user:42" not in data
    want = downstream_key(namespace, "tenant:acme/user:42", "charge:o-1")
    assert pickle.loads(data).idempotency_key == want
    for copied in (copy.copy(attempt), copy.deepcopy(attempt)):
        assert copied._key_of is None
        assert copied.idempotency_key == want


@pytest.mark.parametrize("timeout", [None, 3600.0])
def test_a_reservations_attempt_is_the_one_its_constructor_makes(
    settler: Settler, namespace: str, timeout: float | None
) -> None:
    """``Attempt.for_reservation`` sets its slots itself (no call of ``__init__`` by
    keyword): every slot holds what ``Attempt(...)`` with the derived key holds, none is
    left unset, and the key is derived only when read."""
    deadline = None if timeout is None else time.monotonic() + timeout
    reserved = settler.reserve(f"op-{uuid.uuid4().hex}", {"a": 1}, principal=PRINCIPAL)
    assert reserved.__class__.__name__ == "Reserved"
    r = reserved.reservation  # type: ignore[union-attr]
    made = Attempt.for_reservation(reserved, namespace, deadline)  # type: ignore[arg-type]
    assert made._key is None
    expected = Attempt(
        operation_id=r.operation_id,
        generation=r.generation,
        number=1,
        idempotency_key=downstream_key(namespace, PRINCIPAL, r.operation_id),
        attempt_id=r.attempt_id,
        deadline=deadline,
    )
    for slot in Attempt.__slots__:
        if slot not in ("_key", "_key_of"):
            assert getattr(made, slot) == getattr(expected, slot), slot
    assert made.idempotency_key == expected.idempotency_key
    assert repr(made) == repr(expected)
    assert not made.lost
    made.check()  # neither lost nor stopped
