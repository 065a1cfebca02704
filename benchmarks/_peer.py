"""The peer: AWS Lambda Powertools' idempotency utility (``idempotent_function``) on its cache
persistence layer (``CachePersistenceLayer``, the Redis one), configured as its docs show for
a payment: the idempotency key from ``order_id`` (payload validation: see ``validate``).

Install it with ``pip install 'settle-sdk[bench]'`` (or ``aws-lambda-powertools[redis]`` and
``boto3``: the idempotency package imports boto3 even when DynamoDB is not used).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import redis

__all__ = ["PEER", "LambdaContext", "peer_function"]

PEER = "aws-lambda-powertools"


class LambdaContext:
    """What Powertools reads from a Lambda context: the time left before the invocation is
    killed. It is the peer's only lease: an in-progress record expires at now + this."""

    def __init__(self, remaining_ms: int) -> None:
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def peer_function(
    url: str,
    body: Callable[..., Any],
    *,
    key_prefix: str | None = None,
    remaining_ms: int | None = None,
    expires_after_seconds: int = 3600,
    validate: bool = False,
    client: Any = None,
) -> Callable[..., Any]:
    """``body(order=...)`` wrapped in ``idempotent_function(data_keyword_argument="order")``
    on its own Redis client. ``remaining_ms`` plays the Lambda context's remaining time (the
    in-progress expiry); without it an in-progress record never expires before its TTL.
    ``validate`` turns on payload validation of the money fields: in 3.37.0 the cache layer
    drops the validation hash when it stores the result, so with it on an identical retry
    of a completed call raises ``IdempotencyValidationError`` (the TypeScript twin of this
    bug was fixed in aws-powertools/powertools-lambda-typescript#5705); off by default.
    ``client``: a decoding redis-py client to use instead of one for ``url``."""
    try:
        from aws_lambda_powertools.utilities.idempotency import (  # noqa: PLC0415 - optional
            IdempotencyConfig,
            idempotent_function,
        )
        from aws_lambda_powertools.utilities.idempotency.persistence.cache import (  # noqa: PLC0415
            CachePersistenceLayer,
        )
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"the peer is not installed ({exc}): pip install -e '.[bench]' boto3"
        ) from exc

    client = client or redis.Redis.from_url(url, decode_responses=True)
    # redis-py's Redis is the client its docs pass; its Protocol types `set` narrower.
    persistence = CachePersistenceLayer(client=client)  # type: ignore[arg-type]
    config = IdempotencyConfig(
        event_key_jmespath="order_id",
        payload_validation_jmespath="[amount, currency]" if validate else "",
        expires_after_seconds=expires_after_seconds,
        # Duck-typed: the peer reads only get_remaining_time_in_millis().
        lambda_context=LambdaContext(remaining_ms) if remaining_ms is not None else None,  # type: ignore[arg-type]
    )

    # Other keyword arguments (the caller's tenant) are not part of the peer's key.
    def charge(order: dict[str, Any], **_: Any) -> Any:
        return body(order=order)

    async def acharge(order: dict[str, Any], **_: Any) -> Any:
        return await body(order=order)

    wrapped: Callable[..., Any] = idempotent_function(
        acharge if inspect.iscoroutinefunction(body) else charge,
        data_keyword_argument="order",
        persistence_store=persistence,
        config=config,
        key_prefix=key_prefix,
    )
    return wrapped
