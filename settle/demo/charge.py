"""The demo's outbound call: a charge at the simulated provider, decorated with
``@settler.operation`` exactly as an application would write it (docs/outbound-calls.md).

The same function runs in the demo process and in its worker processes (the ones that
crash or freeze), so every attempt of an order goes through the same decorator.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable

import tenacity
from pydantic import BaseModel

from settle._sync.settler import Settler
from settle.attempt import Attempt

__all__ = [
    "CardDeclined",
    "Charge",
    "ChargeRequest",
    "ProviderError",
    "ProviderUnavailable",
    "Receipt",
    "make_charge",
]

#: Seconds the client waits for the provider's answer.
HTTP_TIMEOUT = 0.5


class ChargeRequest(BaseModel):
    order_id: str
    customer_id: str
    amount: int  # minor units
    currency: str = "EUR"


class Receipt(BaseModel):
    charge_id: str
    order_id: str
    amount: int
    currency: str


class CardDeclined(Exception):
    """The provider said no: a definite answer, stored and replayed, never retried."""


class ProviderUnavailable(Exception):
    """The provider answered 503: nothing happened, try again."""


class ProviderError(Exception):
    """Any other unexpected answer (uncertain: retried)."""


RETRY = tenacity.Retrying(
    stop=tenacity.stop_after_attempt(6),
    wait=tenacity.wait_exponential(multiplier=0.02, max=0.3) + tenacity.wait_random(0, 0.02),
    retry=tenacity.retry_if_exception_type(
        (TimeoutError, ProviderUnavailable, ProviderError, OSError)
    ),
)

Charge = Callable[[ChargeRequest, str], Receipt]
Hook = Callable[[ChargeRequest, Attempt], None]


def _nothing(request: ChargeRequest, attempt: Attempt) -> None:
    del request, attempt


def post_charge(provider_url: str, request: ChargeRequest, attempt: Attempt) -> Receipt:
    http = urllib.request.Request(  # noqa: S310 - a loopback http:// URL the demo built
        f"{provider_url}/charges",
        data=json.dumps(request.model_dump()).encode(),
        headers={
            "Content-Type": "application/json",
            # The same on every attempt of the operation: the provider deduplicates the
            # retry that follows a timeout after its success.
            "Idempotency-Key": attempt.idempotency_key,
            "X-Fencing-Token": str(attempt.generation),
        },
        method="POST",
    )
    try:
        with urllib.request.urlopen(http, timeout=HTTP_TIMEOUT) as response:  # noqa: S310
            return Receipt.model_validate_json(response.read())
    except urllib.error.HTTPError as exc:
        with exc:  # the error holds the response (and its socket) until closed
            body = exc.read()
        if exc.code == 402:
            raise CardDeclined(json.loads(body)["error"]) from None
        if exc.code == 503:
            raise ProviderUnavailable("the provider answered 503") from None
        raise ProviderError(f"the provider answered {exc.code}") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise TimeoutError("the provider did not answer in time") from None
        raise


def make_charge(
    settler: Settler,
    provider_url: str,
    *,
    lease: float,
    wait: float,
    before: Hook = _nothing,
    after: Hook = _nothing,
) -> Charge:
    """The decorated charge. ``before`` runs when an attempt starts, ``after`` once the
    provider charged and before the attempt settles (the worker processes block there)."""

    @settler.operation(
        key="charge:{request.order_id}",
        # The merchant account calling the API is the principal; it is not part of the
        # request, so the same order sent by another merchant is a BindingMismatch.
        principal=lambda _request, merchant: f"merchant:{merchant}",
        fingerprint=lambda request, _merchant: request,
        result_type=Receipt,
        lease=lease,
        retry=RETRY,
        terminal=(CardDeclined,),
        wait=wait,
    )
    def charge(
        request: ChargeRequest, merchant: str, attempt: Attempt = Attempt.INJECTED
    ) -> Receipt:
        del merchant  # the principal (see above)
        before(request, attempt)
        receipt = post_charge(provider_url, request, attempt)
        after(request, attempt)
        return receipt

    return charge
