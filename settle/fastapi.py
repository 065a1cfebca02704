"""FastAPI convenience: a dependency that hands a guarded endpoint its ``Attempt``.

    from settle.fastapi import CurrentAttempt

    @app.post("/payments")
    async def create(payment: Payment, attempt: CurrentAttempt) -> ...:
        charge(payment, idempotency_key=attempt.idempotency_key, fence=attempt.generation)

The middleware is :class:`settle.asgi.IdempotencyMiddleware`; only this module imports
FastAPI.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request

from settle.attempt import Attempt

__all__ = ["CurrentAttempt", "current_attempt"]


def current_attempt(request: Request) -> Attempt:
    """The attempt of this request; 400 if the request was not guarded by the middleware."""
    attempt = request.scope.get("settle")
    if not isinstance(attempt, Attempt):
        raise HTTPException(
            status_code=400,
            detail="send an Idempotency-Key header: this endpoint runs only under one",
        )
    return attempt


CurrentAttempt = Annotated[Attempt, Depends(current_attempt)]
