"""One operation per function (issue 16): the function is part of the fingerprint, shared
on purpose with ``name=``; dataclass arguments fingerprint like pydantic models; a function
that does not say what a replay returns is refused; ``on_replay`` tells a caller that a
result was replayed. On the in-memory reference model and on a real Redis."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel

from settle import FingerprintError, FingerprintMismatch, OperationFailed, Settler
from settle.errors import InvalidInput
from settle.models import OperationRecord
from settle.testing import MemorySettler

P = "tenant:acme"


@pytest.fixture(params=["memory", "redis"])
def any_settler(request: pytest.FixtureRequest) -> Settler:
    if request.param == "memory":
        return MemorySettler(namespace="identity")
    settler: Settler = request.getfixturevalue("settler")
    return settler


def test_two_functions_with_one_key_template_never_return_each_others_results(
    any_settler: Settler,
) -> None:
    ran: list[str] = []

    @any_settler.operation(key="order:{n}", principal=P)
    def refund(n: int) -> str:
        ran.append("refund")
        return f"refunded {n}"

    @any_settler.operation(key="order:{n}", principal=P)
    def charge(n: int) -> str:
        ran.append("charge")
        return f"charged {n}"

    assert charge(1) == "charged 1"
    with pytest.raises(FingerprintMismatch):
        refund(1)  # not "charged 1"
    assert ran == ["charge"]
    assert charge(1) == "charged 1"  # its own replay still works


def test_functions_share_an_operation_on_purpose_with_one_name(any_settler: Settler) -> None:
    @any_settler.operation(key="order:{n}", principal=P, name="orders.charge")
    def charge(n: int) -> str:
        return f"charged {n}"

    @any_settler.operation(key="order:{n}", principal=P, name="orders.charge")
    def charge_again(n: int) -> str:
        raise AssertionError("replayed, never run")

    assert charge(2) == "charged 2"
    assert charge_again(2) == "charged 2"


def test_a_bad_name_is_refused_at_decoration(any_settler: Settler) -> None:
    for bad in ("", 3):
        with pytest.raises(InvalidInput, match="name must be a non-empty str"):

            @any_settler.operation(key="k:{n}", principal=P, name=bad)  # type: ignore[arg-type]
            def job(n: int) -> int:
                return n


@dataclasses.dataclass(frozen=True)
class Shipment:
    order_id: str
    weight_g: int
    at: datetime


@dataclasses.dataclass
class Wrapper:
    shipment: Shipment
    tags: tuple[str, ...] = ()


class ShipmentModel(BaseModel):
    order_id: str
    weight_g: int
    at: datetime


def test_dataclass_arguments_are_fingerprinted_like_pydantic_models(
    any_settler: Settler,
) -> None:
    runs: list[Shipment] = []
    at = datetime(2026, 12, 2, 9, 30, tzinfo=UTC)

    @any_settler.operation(key="ship:{s.order_id}", principal=P)
    def ship(s: Shipment) -> str:
        runs.append(s)
        return "shipped"

    assert ship(Shipment("o-1", 500, at)) == "shipped"
    assert ship(Shipment("o-1", 500, at)) == "shipped"  # replayed
    assert len(runs) == 1
    with pytest.raises(FingerprintMismatch):
        ship(Shipment("o-1", 501, at))  # another request under the same id

    from settle.fingerprint import fingerprint  # noqa: PLC0415

    model = ShipmentModel(order_id="o-1", weight_g=500, at=at)
    assert fingerprint(Shipment("o-1", 500, at)) == fingerprint(model)
    nested = Wrapper(Shipment("o-1", 500, at), ("a",))
    assert fingerprint(nested) == fingerprint(
        {"shipment": model.model_dump(mode="json"), "tags": ["a"]}
    )
    with pytest.raises(FingerprintError):
        fingerprint(Wrapper(Shipment("o-1", 500, at), ({"x"},)))  # type: ignore[arg-type]


def test_a_function_without_a_return_annotation_is_refused_up_front(
    any_settler: Settler,
) -> None:
    with pytest.raises(InvalidInput, match="no return annotation"):

        @any_settler.operation(key="k:{n}", principal=P)
        def job(n):  # type: ignore[no-untyped-def]
            return ShipmentModel(order_id=str(n), weight_g=1, at=datetime.now(UTC))

    # result_type= says it instead; the replay is what the first call returned
    @any_settler.operation(key="k:{n}", principal=P, result_type=ShipmentModel)
    def typed(n):  # type: ignore[no-untyped-def]
        return ShipmentModel(order_id=str(n), weight_g=1, at=datetime(2026, 1, 1, tzinfo=UTC))

    first = typed(1)
    assert typed(1) == first
    assert isinstance(typed(1), ShipmentModel)


def test_on_replay_tells_the_caller_a_result_was_replayed(any_settler: Settler) -> None:
    replayed: list[OperationRecord] = []

    class Declined(Exception):
        pass

    @any_settler.operation(key="pay:{n}", principal=P, on_replay=replayed.append)
    def pay(n: int) -> dict[str, Any]:
        if n < 0:
            raise Declined("no")
        return {"paid": n}

    @any_settler.operation(
        key="pay:{n}",
        principal=P,
        name="pay-terminal",
        terminal=Declined,
        on_replay=replayed.append,
    )
    def pay_or_decline(n: int) -> dict[str, Any]:
        raise Declined("no")

    assert pay(5) == {"paid": 5}
    assert replayed == []  # computed, not replayed
    assert pay(5) == {"paid": 5}
    assert [r.operation_id for r in replayed] == ["pay:5"]
    assert replayed[0].state.value == "completed"

    with pytest.raises(OperationFailed):
        pay_or_decline(-1)
    assert len(replayed) == 1
    with pytest.raises(OperationFailed):
        pay_or_decline(-1)  # the stored failure, replayed
    assert [r.operation_id for r in replayed] == ["pay:5", "pay:-1"]

    with pytest.raises(InvalidInput, match="on_replay must be a callable"):
        any_settler.operation(key="x", principal=P, on_replay="no")  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_the_async_decorator_keeps_functions_apart_and_reports_replays() -> None:
    from settle.testing import AsyncMemorySettler  # noqa: PLC0415

    settler = AsyncMemorySettler(namespace="identity-async")
    replayed: list[str] = []

    @settler.operation(
        key="order:{n}", principal=P, on_replay=lambda r: replayed.append(r.operation_id)
    )
    async def charge(n: int) -> str:
        return f"charged {n}"

    @settler.operation(key="order:{n}", principal=P)
    async def refund(n: int) -> str:
        return f"refunded {n}"

    assert await charge(1) == "charged 1"
    assert await charge(1) == "charged 1"
    assert replayed == ["order:1"]
    with pytest.raises(FingerprintMismatch):
        await refund(1)
    with pytest.raises(InvalidInput, match="no return annotation"):

        @settler.operation(key="k:{n}", principal=P)
        async def untyped(n):  # type: ignore[no-untyped-def]
            return n
