"""The client side of the tests: a charge call decorated with ``settler.operation``, in a
sync and an async flavour, against :mod:`tests.decorator.provider`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from pydantic import BaseModel

from settle import AsyncSettler, Settler
from settle.attempt import Attempt

#: The sync and the async charge are one operation: they share it on purpose.
CHARGE = "payments.charge"
PRINCIPAL = "tenant:acme"


class ChargeRequest(BaseModel):
    order_id: str
    amount: int
    currency: str = "EUR"


class Receipt(BaseModel):
    charge_id: str
    order_id: str
    amount: int
    currency: str
    fencing_token: int


class CardDeclined(Exception):
    pass


def _headers(attempt: Attempt) -> dict[str, str]:
    return {"Idempotency-Key": attempt.idempotency_key, "X-Fencing-Token": str(attempt.generation)}


def _receipt(response: httpx.Response) -> Receipt:
    if response.status_code == 402:
        raise CardDeclined(response.json()["error"])
    response.raise_for_status()
    return Receipt.model_validate(response.json())


def _http_timeout(attempt: Attempt, default: float) -> float:
    remaining = attempt.remaining()
    return default if remaining is None else max(remaining, 0.001)


def sync_charge(
    settler: Settler,
    url: str,
    *,
    on_attempt: Callable[[Attempt], None] | None = None,
    http_timeout: float = 10.0,
    **options: Any,
) -> Callable[..., Receipt]:
    options.setdefault("terminal", (CardDeclined,))

    @settler.operation(key="charge:{request.order_id}", principal=PRINCIPAL, name=CHARGE, **options)
    def charge(request: ChargeRequest, attempt: Attempt = Attempt.INJECTED) -> Receipt:
        if on_attempt is not None:
            on_attempt(attempt)
        with httpx.Client(timeout=_http_timeout(attempt, http_timeout)) as client:
            response = client.post(
                f"{url}/charges", json=request.model_dump(), headers=_headers(attempt)
            )
        attempt.check()
        return _receipt(response)

    return charge


def async_charge(
    settler: AsyncSettler,
    url: str,
    *,
    on_attempt: Callable[[Attempt], None] | None = None,
    http_timeout: float = 10.0,
    **options: Any,
) -> Callable[..., Awaitable[Receipt]]:
    options.setdefault("terminal", (CardDeclined,))

    @settler.operation(key="charge:{request.order_id}", principal=PRINCIPAL, name=CHARGE, **options)
    async def charge(request: ChargeRequest, attempt: Attempt = Attempt.INJECTED) -> Receipt:
        if on_attempt is not None:
            on_attempt(attempt)
        async with httpx.AsyncClient(timeout=http_timeout) as client:
            response = await client.post(
                f"{url}/charges", json=request.model_dump(), headers=_headers(attempt)
            )
        return _receipt(response)

    return charge
