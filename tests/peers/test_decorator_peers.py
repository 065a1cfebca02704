"""Cases of aws-lambda-powertools' idempotency suite (``test_idempotency.py``,
``_pydantic/``) run against ``@settler.operation`` on a real Redis: results of every shape
replay as what the function returned, and a call's request is what it was called with."""

from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, Never, NoReturn, Self
from uuid import UUID

import pytest
import tenacity
from pydantic import BaseModel

from settle import FingerprintMismatch, OperationFailed, OperationRecord, Settler
from settle.errors import InvalidInput

P = "tenant:acme"
RETRY = tenacity.Retrying(stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_fixed(0.01))


def test_a_function_returning_none_replays_none_and_on_replay_is_told(settler: Settler) -> None:
    runs: list[str] = []
    replayed: list[OperationRecord] = []

    @settler.operation(key="notify:{order_id}", principal=P, on_replay=replayed.append)
    def notify(order_id: str) -> None:
        runs.append(order_id)

    assert notify("o-1") is None
    assert notify("o-1") is None
    assert runs == ["o-1"]
    assert [r.operation_id for r in replayed] == ["notify:o-1"]


class Status(StrEnum):
    PAID = "paid"


@dataclasses.dataclass(frozen=True)
class Payout:
    payout_id: UUID
    amount: Decimal
    at: datetime
    status: Status


class Invoice(BaseModel):
    invoice_id: UUID
    total: Decimal
    issued: date
    at: datetime
    status: Status
    lines: tuple[str, ...]


def test_dataclass_and_model_results_replay_equal_and_of_their_type(settler: Settler) -> None:
    payout = Payout(
        UUID("12345678-1234-5678-1234-567812345678"),
        Decimal("10.10"),
        datetime(2024, 3, 20, 14, 30, 15, 123456, tzinfo=UTC),
        Status.PAID,
    )
    invoice = Invoice(
        invoice_id=UUID(int=7),
        total=Decimal("0.10"),
        issued=date(2024, 1, 15),
        at=datetime(2024, 1, 15, 10, 30),
        status=Status.PAID,
        lines=("a", "b"),
    )
    runs: list[str] = []

    @settler.operation(key="payout:{n}", principal=P)
    def pay_out(n: int) -> Payout:
        runs.append("payout")
        return payout

    @settler.operation(key="invoice:{n}", principal=P)
    def issue(n: int) -> Invoice:
        runs.append("invoice")
        return invoice

    assert pay_out(1) == payout
    replayed = pay_out(1)
    assert replayed == payout
    assert type(replayed) is Payout
    assert issue(1) == invoice
    again = issue(1)
    assert again == invoice
    assert type(again) is Invoice
    assert runs == ["payout", "invoice"]


def test_an_argument_the_function_mutates_keeps_its_operation(settler: Settler) -> None:
    """powertools' ``test_idempotent_lambda_first_execution_event_mutation``: the request is
    the arguments as called, not as the function left them, on a retry and after."""
    runs: list[int] = []

    @settler.operation(key="order:{order[id]}", principal=P, retry=RETRY)
    def place(order: dict[str, Any]) -> int:
        runs.append(len(runs) + 1)
        order["status"] = "placed"  # the function mutates its input
        if len(runs) == 1:
            raise ConnectionError("provider unreachable")
        return len(runs)

    assert place({"id": "o-1", "amount": 10}) == 2
    assert place({"id": "o-1", "amount": 10}) == 2  # the same request: replayed
    assert runs == [1, 2]


def test_extra_positional_and_keyword_arguments_are_part_of_the_request(
    settler: Settler,
) -> None:
    """powertools' ``test_idempotent_function_arbitrary_args_kwargs``."""
    runs: list[tuple[Any, ...]] = []

    @settler.operation(key="rec:{record[id]}", principal=P)
    def handle(*args: Any, record: dict[str, Any], **kwargs: Any) -> int:
        runs.append(args)
        return len(runs)

    assert handle("a", "b", record={"id": 1}, is_record=True) == 1
    assert handle("a", "b", record={"id": 1}, is_record=True) == 1
    with pytest.raises(FingerprintMismatch):
        handle("a", "c", record={"id": 1}, is_record=True)
    with pytest.raises(FingerprintMismatch):
        handle("a", "b", record={"id": 1}, is_record=False)
    assert runs == [("a", "b")]


class Ledger:
    """Not a pydantic model nor a dataclass: pydantic has no schema for it."""

    def __init__(self, balance: int) -> None:
        self.balance = balance


def test_a_result_type_pydantic_cannot_store_is_refused_when_decorated(settler: Settler) -> None:
    """powertools refuses an output type its serializer cannot handle when the function is
    decorated (``test_idempotent_function_serialization_pydantic_failure_bad_type``). Here
    every call ran the function, could not store its result and left the operation
    provisional, so the next call ran the effect again."""
    runs: list[int] = []

    def post_entry(n: int) -> Ledger:
        runs.append(n)
        return Ledger(n)

    with pytest.raises(InvalidInput, match="Ledger"):
        settler.operation(key="entry:{n}", principal=P)(post_entry)
    with pytest.raises(InvalidInput, match="Ledger"):
        settler.operation(key="entry:{n}", principal=P, result_type=Ledger)(post_entry)
    assert runs == []


class Declined(Exception):
    """The provider's definite no."""


def test_a_function_that_only_ever_fails_definitely_may_declare_never(settler: Settler) -> None:
    """``-> NoReturn`` (or ``Never``): a function that always raises, its definite failures
    (``terminal``) stored and replayed as OperationFailed. No result is ever stored or
    validated, so there is nothing pydantic must have a schema for: decorating it worked,
    and must still."""
    runs: list[str] = []

    @settler.operation(key="void:{payment_id}", principal=P, terminal=(Declined,))
    def void(payment_id: str) -> NoReturn:
        runs.append(payment_id)
        raise Declined("already settled")

    @settler.operation(key="void2:{payment_id}", principal=P, terminal=(Declined,))
    def void2(payment_id: str) -> Never:
        raise Declined("already settled")

    with pytest.raises((Declined, OperationFailed)):
        void("p-1")
    with pytest.raises(OperationFailed):
        void("p-1")
    assert runs == ["p-1"]
    with pytest.raises((Declined, OperationFailed)):
        void2("p-1")


def test_a_result_type_pydantic_rejects_is_refused_with_settles_error(settler: Settler) -> None:
    """``-> Self`` on a decorated method: pydantic cannot validate a replay into it. The
    decoration is refused with settle's InvalidInput (a SettleError, as for every other
    unstorable result type), not pydantic's own PydanticUserError."""
    with pytest.raises(InvalidInput, match="Self"):

        class Ledger:
            @settler.operation(key="renew:{name}", principal=P)
            def renew(self, name: str) -> Self:
                return self
