"""The decorator's events carry what docs/outbound-calls.md says ("with the namespace,
operation id, generation and function name"), as text: a failed renewal names its call, a
stale settlement its quarantine kind by value. Real Redis; a failed renewal is a real
dropped connection (the fault tests' proxy)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from settle import AsyncSettler, Reservation, Settler, StaleAttempt
from settle._core.scripts import SCRIPTS
from settle._runtime.transient import ATTEMPTS
from settle.attempt import Attempt
from tests.faults.servers import async_client, proxy_to, script_needle, sync_client
from tests.faults.tcp_proxy import FaultyProxy

WHO = "tenant:acme"
#: What a reservation takes from its record (besides the attempt id).
_RESERVATION = ("operation_id", "fingerprint", "fingerprint_version", "binding", "generation")


@pytest.fixture
def proxy(redis_url: str) -> Iterator[FaultyProxy]:
    running = proxy_to(redis_url, SCRIPTS)
    yield running
    running.close()


def _events(logs: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == event]


def _check_heartbeat_failed(logs: list[dict[str, Any]], namespace: str) -> None:
    """Every failed renewal names its call. One is cut on purpose; on a loaded machine the
    cut renewal's retries can end before every cut was used (their budget is the lease's
    time), and the next renewal then meets the rest: it must name its call too."""
    failures = _events(logs, "settle.operation.heartbeat_failed")
    assert failures
    for failed in failures:
        assert failed["namespace"] == namespace
        assert failed["function"] == "charge"
        assert failed["error"] == "BackendError"
        assert isinstance(failed["generation"], int)
        assert isinstance(failed["operation_digest"], str)
        assert "op:1" not in repr(failed)


def test_a_failed_renewal_names_its_call(proxy: FaultyProxy, namespace: str) -> None:
    settler = Settler(sync_client(proxy.port), namespace=namespace, shards=4)

    @settler.operation(key="op:{n}", principal=WHO, result_type=int, lease=1.5)
    def charge(n: int) -> int:
        time.sleep(1.2)  # renewed at 0.5 (cut) and 1.0
        return n

    # Every try of the first renewal is cut (settle's own retries included): it raises.
    proxy.cut(script_needle(SCRIPTS, "renew"), "before_request", times=ATTEMPTS)
    try:
        with capture_logs() as logs:
            assert charge(1) == 1
    finally:
        settler.close()
    _check_heartbeat_failed(logs, namespace)


@pytest.mark.asyncio
async def test_a_failed_async_renewal_names_its_call(proxy: FaultyProxy, namespace: str) -> None:
    settler = AsyncSettler(async_client(proxy.port), namespace=namespace, shards=4)

    @settler.operation(key="op:{n}", principal=WHO, result_type=int, lease=1.5)
    async def charge(n: int) -> int:
        await asyncio.sleep(1.2)
        return n

    proxy.cut(script_needle(SCRIPTS, "renew"), "before_request", times=ATTEMPTS)
    try:
        with capture_logs() as logs:
            assert await charge(1) == 1
    finally:
        await settler.aclose()
    _check_heartbeat_failed(logs, namespace)


def test_a_stale_settlement_logs_its_kind_as_text(settler: Settler) -> None:
    @settler.operation(key="op:{n}", principal=WHO, result_type=int)
    def charge(n: int, attempt: Attempt) -> int:
        # This attempt's reservation is marked provisional (as after a lost lease) and
        # another worker takes over: this attempt's completion is then stale.
        record = settler.get(attempt.operation_id)
        assert record is not None
        mine = Reservation(
            **{name: getattr(record, name) for name in _RESERVATION},
            attempt_id=attempt.attempt_id,
        )
        settler.mark_provisional(mine, reason="lease lost")
        settler.reserve(record.operation_id, principal=WHO, fingerprint=record.fingerprint)
        return n

    with capture_logs() as logs, pytest.raises(StaleAttempt):
        charge(1)
    (stale,) = _events(logs, "settle.operation.stale")
    assert type(stale["kind"]) is str  # not the enum: its repr is what stdlib logging shows
    assert stale["kind"] == "stale_generation"
