"""The decorator: one ``settle.operation`` span per decorated call, one ``settle.attempt``
child per attempt (its number, its generation, its error), and the attempt's settle calls
inside it. Sync and async, on a real Redis, with the real SDK."""

from __future__ import annotations

import pytest

from settle import AsyncSettler, OperationFailed, Settler
from settle.attempt import Attempt
from tests.telemetry.conftest import Telemetry


def _check(otel: Telemetry, ns: str, function: str) -> None:
    first, replayed = otel.spans("settle.operation")
    assert first.attributes["settle.namespace"] == ns
    # The fully-qualified name, as the semantic conventions ask: its module and qualname.
    assert first.attributes["code.function.name"] == f"tests.telemetry.test_decorator.{function}"
    assert first.attributes["settle.outcome"] == "completed"
    assert first.attributes["settle.attempts"] == 2
    attempts = [s for s in otel.children(first) if s.name == "settle.attempt"]
    assert [a.attributes["settle.attempt.number"] for a in attempts] == [1, 2]
    failed, succeeded = attempts
    assert failed.attributes["error.type"] == "ConnectionError"
    assert not failed.status.is_ok
    assert "error.type" not in succeeded.attributes
    assert succeeded.attributes["settle.generation"] > failed.attributes["settle.generation"]
    # Each attempt settles inside its own span; the reservations are the operation's.
    assert [s.name for s in otel.children(failed)] == ["settle.mark_provisional"]
    assert [s.name for s in otel.children(succeeded)] == ["settle.complete"]
    reserves = [s for s in otel.children(first) if s.name == "settle.reserve"]
    assert [s.attributes["settle.outcome"] for s in reserves] == ["reserved", "reserved"]
    assert reserves[1].attributes["settle.takeover"] == "provisional"

    assert replayed.attributes["settle.outcome"] == "replayed"
    assert replayed.attributes["settle.attempts"] == 0
    assert [s.name for s in otel.children(replayed)] == ["settle.reserve"]
    n = {"settle.namespace": ns}
    assert otel.count("settle.takeovers", **n, **{"settle.takeover.reason": "provisional"}) == 1
    assert otel.count("settle.reservations", **n, **{"settle.outcome": "replayed"}) == 1


def test_sync_operation_and_attempt_spans(
    settler: Settler, namespace: str, otel: Telemetry
) -> None:
    runs: list[int] = []

    @settler.operation(key="charge:{order}", principal="tenant:acme")
    def charge(order: str, attempt: Attempt) -> dict[str, int]:
        runs.append(attempt.number)
        if len(runs) == 1:
            raise ConnectionError("reset by peer")
        return {"number": attempt.number}

    assert charge("o-1") == {"number": 2}
    assert charge("o-1") == {"number": 2}
    assert runs == [1, 2]
    _check(otel, namespace, "test_sync_operation_and_attempt_spans.<locals>.charge")


@pytest.mark.asyncio
async def test_async_operation_and_attempt_spans(
    async_settler: AsyncSettler, namespace: str, otel: Telemetry
) -> None:
    runs: list[int] = []

    @async_settler.operation(key="charge:{order}", principal="tenant:acme")
    async def charge(order: str, attempt: Attempt) -> dict[str, int]:
        runs.append(attempt.number)
        if len(runs) == 1:
            raise ConnectionError("reset by peer")
        return {"number": attempt.number}

    assert await charge("o-1") == {"number": 2}
    assert await charge("o-1") == {"number": 2}
    assert runs == [1, 2]
    _check(otel, namespace, "test_async_operation_and_attempt_spans.<locals>.charge")


class Billing:
    """A decorated method: its span names the class too."""

    def __init__(self, settler: Settler) -> None:
        self.charge = settler.operation(key="bill:{order}", principal="tenant:acme")(self._charge)

    def _charge(self, order: str) -> str:
        return order


def test_a_method_is_named_with_its_class(settler: Settler, otel: Telemetry) -> None:
    assert Billing(settler).charge("o-3") == "o-3"
    name = otel.span("settle.operation").attributes["code.function.name"]
    assert name == "tests.telemetry.test_decorator.Billing._charge"


def test_an_operation_that_fails_says_so(settler: Settler, namespace: str, otel: Telemetry) -> None:
    @settler.operation(key="charge:{order}", principal="tenant:acme", terminal=(ValueError,))
    def charge(order: str) -> None:
        raise ValueError("card declined")

    with pytest.raises(OperationFailed):
        charge("o-2")
    operation = otel.span("settle.operation")
    assert operation.attributes["error.type"] == "OperationFailed"
    assert operation.attributes["settle.attempts"] == 1
    fail = otel.span("settle.fail")
    assert fail.attributes["settle.verdict"] == "accepted"
