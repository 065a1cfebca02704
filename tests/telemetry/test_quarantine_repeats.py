"""``settle.quarantine.entries`` counts quarantine entries written, as the stream holds them:
the same rejected response delivered again (same attempt, action and payload digest) stays
one entry (SPEC 3), and was counted again, so an alert on new evidence fired on a sender
that only retried. A repeat is counted by ``settle.quarantine.repeats``, its span carries
``settle.quarantine.repeated``, and its ``Settlement`` says ``quarantine_repeated``. Real
Redis, the real OpenTelemetry SDK with in-memory readers; sync, async and the reference
model alike."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from settle import AsyncSettler, Reserved, Settler, Verdict
from settle.testing import MemorySettler
from tests.telemetry.conftest import Telemetry

P = "tenant:acme"
KIND = {"settle.quarantine.kind": "conflicting_settlement", "settle.action": "complete"}


def _check(otel: Telemetry, namespace: str, settlements: list[Any], stream: int) -> None:
    assert [s.verdict for s in settlements] == [Verdict.QUARANTINED] * 3
    assert {s.quarantine_id for s in settlements} == {settlements[0].quarantine_id}
    assert stream == 1  # the stream holds one entry, and the counter says so
    n = {"settle.namespace": namespace}
    assert otel.count("settle.quarantine.entries", **n, **KIND) == 1
    assert otel.count("settle.quarantine.repeats", **n, **KIND) == 2
    quarantined = [
        s
        for s in otel.spans("settle.complete")
        if (s.attributes or {}).get("settle.verdict") == "quarantined"
    ]
    assert [(s.attributes or {}).get("settle.quarantine.repeated") for s in quarantined] == [
        None,
        True,
        True,
    ]
    assert [s.quarantine_repeated for s in settlements] == [False, True, True]


@pytest.mark.parametrize("store", ["redis", "reference model"])
def test_a_repeated_rejected_response_is_one_entry_and_counted_once(
    store: str, namespace: str, otel: Telemetry, request: pytest.FixtureRequest
) -> None:
    memory = store != "redis"
    s = MemorySettler(namespace=namespace) if memory else request.getfixturevalue("settler")
    r = s.reserve("op-1", {"amount": 5}, principal=P)
    assert isinstance(r, Reserved)
    s.complete(r.reservation, {"receipt": "a"})
    late = [s.complete(r.reservation, {"receipt": "b"}) for _ in range(3)]
    _check(otel, namespace, late, len(s.quarantine.list()))


@pytest.mark.asyncio
async def test_async_a_repeated_rejected_response_is_one_entry_and_counted_once(
    async_settler: AsyncSettler, namespace: str, otel: Telemetry
) -> None:
    r = await async_settler.reserve("op-1", {"amount": 5}, principal=P)
    assert isinstance(r, Reserved)
    await async_settler.complete(r.reservation, {"receipt": "a"})
    late = [await async_settler.complete(r.reservation, {"receipt": "b"}) for _ in range(3)]
    _check(otel, namespace, late, len(await async_settler.quarantine.list()))


def test_a_different_rejected_response_is_a_new_entry(
    settler: Settler, namespace: str, otel: Telemetry
) -> None:
    r = settler.reserve("op-1", {"amount": 5}, principal=P)
    assert isinstance(r, Reserved)
    settler.complete(r.reservation, {"receipt": "a"})
    late = [settler.complete(r.reservation, {"receipt": f"b{i}"}) for i in range(2)]
    assert [s.quarantine_repeated for s in late] == [False, False]
    assert late[0].quarantine_id != late[1].quarantine_id
    n = {"settle.namespace": namespace}
    assert otel.count("settle.quarantine.entries", **n, **KIND) == 2
    assert otel.count("settle.quarantine.repeats", **n) == 0


def test_the_quarantined_log_line_says_whether_it_repeats_an_entry(settler: Settler) -> None:
    r = settler.reserve("op-1", {"amount": 5}, principal=P)
    assert isinstance(r, Reserved)
    settler.complete(r.reservation, {"receipt": "a"})
    with capture_logs() as logs:
        for _ in range(3):
            settler.complete(r.reservation, {"receipt": "b"})
    quarantined = [e for e in logs if e["event"] == "settle.settlement.quarantined"]
    assert [e["repeated"] for e in quarantined] == [False, True, True]
    assert len({e["quarantine_id"] for e in quarantined}) == 1
