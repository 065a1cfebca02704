"""The two libraries the fault scenarios run, behind one small surface: wrap a charge
function, and read back what the store holds as the operation's committed result.

Both wrap ``charge(order=..., tenant=...)``: the operation id is ``order["order_id"]``; the
tenant is settle's principal (the peer has no principal, and keys by ``order_id`` alone).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import redis

from benchmarks._peer import peer_function
from settle import AsyncSettler, Settler, State
from settle.attempt import Attempt

__all__ = ["DEFAULT_TENANT", "Peer", "Settle", "order"]

DEFAULT_TENANT = "tenant:acme"
Body = Callable[..., dict[str, Any]]
AsyncBody = Callable[..., Awaitable[dict[str, Any]]]


def order(order_id: str, amount: int = 1250) -> dict[str, Any]:
    """The request every scenario sends (a changed payload changes ``amount``)."""
    return {"order_id": order_id, "amount": amount, "currency": "EUR"}


def _key(order: dict[str, Any], **_: Any) -> str:
    return str(order["order_id"])


def _principal(tenant: str = DEFAULT_TENANT, **_: Any) -> str:
    return tenant


def _request(order: dict[str, Any], **_: Any) -> dict[str, Any]:
    return order


class Settle:
    """settle's ``@operation`` with its defaults (3 attempts, backoff) and a given lease."""

    name = "settle"

    def __init__(self, url: str, namespace: str, settler: Settler | None = None) -> None:
        self.url = url
        self.namespace = namespace
        self.settler = settler or Settler.from_url(url, namespace=namespace)

    def function(self, body: Body, *, lease: float, wait: float = 5.0) -> Callable[..., Any]:
        @self.settler.operation(
            key=_key, principal=_principal, fingerprint=_request, lease=lease, wait=wait
        )
        def charge(
            order: dict[str, Any],
            tenant: str = DEFAULT_TENANT,  # noqa: ARG001 - read by `principal`
            attempt: Attempt = Attempt.INJECTED,  # noqa: ARG001 - this downstream takes no key
        ) -> dict[str, Any]:
            return body(order=order)

        return charge

    def async_function(self, body: AsyncBody, *, lease: float) -> Callable[..., Any]:
        settler = AsyncSettler.from_url(self.url, namespace=self.namespace)

        @settler.operation(key=_key, principal=_principal, fingerprint=_request, lease=lease)
        async def charge(
            order: dict[str, Any],
            tenant: str = DEFAULT_TENANT,  # noqa: ARG001 - read by `principal`
            attempt: Attempt = Attempt.INJECTED,  # noqa: ARG001 - this downstream takes no key
        ) -> dict[str, Any]:
            return await body(order=order)

        return charge

    def stored(self, order_id: str) -> dict[str, Any] | None:
        record = self.settler.get(order_id)
        if record is None or record.state is not State.COMPLETED or record.result is None:
            return None
        value: dict[str, Any] = json.loads(record.result)
        return value

    def close(self) -> None:
        self.settler.close()


class Peer:
    """Powertools' ``idempotent_function`` on its Redis cache layer; the Lambda context's
    remaining time plays the lease (its in-progress expiry)."""

    name = "powertools"

    def __init__(
        self, url: str, prefix: str, *, validate: bool = False, client: Any = None
    ) -> None:
        """``client``: a decoding redis-py client to use instead of one for ``url`` (a
        Sentinel-managed or cluster client)."""
        self.url = url
        self.prefix = prefix
        self.validate = validate
        self._given = client
        self._client = client or redis.Redis.from_url(url, decode_responses=True)

    def function(
        self,
        body: Body,
        *,
        lease: float,
        wait: float = 5.0,  # noqa: ARG002 - the peer never waits: it raises at once
    ) -> Callable[..., Any]:
        return peer_function(
            self.url,
            body,
            key_prefix=self.prefix,
            remaining_ms=round(lease * 1000),
            validate=self.validate,
            client=self._given,
        )

    def async_function(self, body: AsyncBody, *, lease: float) -> Callable[..., Any]:
        return peer_function(
            self.url, body, key_prefix=self.prefix, remaining_ms=round(lease * 1000)
        )

    def stored(self, order_id: str) -> dict[str, Any] | None:
        """The record's ``data`` when its status is COMPLETED (one operation per prefix)."""
        for key in self._client.scan_iter(match=f"{self.prefix}#*"):
            if key.endswith(":lock"):
                continue
            raw = self._client.get(key)
            if raw is None:
                continue
            item = json.loads(raw)
            if item.get("status") == "COMPLETED" and item.get("data"):
                value: dict[str, Any] = json.loads(item["data"])
                if value.get("order_id") == order_id:
                    return value
        return None

    def close(self) -> None:
        self._client.close()
