"""A worker process for the crash tests: charges one order through the decorator and
prints JSON lines on stdout (``attempt`` when the function starts, then the outcome).

    python -m tests.decorator._worker sync|async REDIS_URL NAMESPACE PROVIDER_URL ORDER LEASE
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import structlog

structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))

from settle import AsyncSettler, Settler, StaleAttempt  # noqa: E402
from settle.attempt import Attempt  # noqa: E402
from tests.decorator.payments import ChargeRequest, async_charge, sync_charge  # noqa: E402

seen: list[Attempt] = []


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def on_attempt(attempt: Attempt) -> None:
    seen.append(attempt)
    emit(event="attempt", generation=attempt.generation, attempt_id=attempt.attempt_id)


def report_stale(exc: StaleAttempt) -> None:
    record = exc.record
    emit(
        event="stale",
        state=record.state.value if record else None,
        generation=record.generation if record else None,
        quarantine_id=exc.quarantine_id,
        lost=seen[-1].lost if seen else None,
    )


def main(mode: str, url: str, namespace: str, provider: str, order: str, lease: str) -> None:
    request = ChargeRequest(order_id=order, amount=1250)
    options: dict[str, Any] = {"lease": float(lease), "wait": 30.0, "on_attempt": on_attempt}
    if mode == "sync":
        settler = Settler.from_url(url, namespace=namespace, shards=4)
        try:
            receipt = sync_charge(settler, provider, **options)(request)
            emit(event="result", receipt=receipt.model_dump())
        except StaleAttempt as exc:
            report_stale(exc)
        finally:
            settler.close()
        return

    async def run() -> None:
        settler = AsyncSettler.from_url(url, namespace=namespace, shards=4)
        try:
            receipt = await async_charge(settler, provider, **options)(request)
            emit(event="result", receipt=receipt.model_dump())
        except StaleAttempt as exc:
            report_stale(exc)
        finally:
            await settler.aclose()

    asyncio.run(run())


if __name__ == "__main__":
    main(*sys.argv[1:])
