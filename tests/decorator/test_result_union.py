"""A result of one arm of a declared union that its replays would read back as another arm
(the union cannot tell their stored JSON apart) is refused on the first call.

``-> Wallet | Card`` returning ``Card(last4="4242")`` stores ``{"last4": "4242"}``, which
pydantic validates into ``Wallet`` (the first arm that fits, with ``provider`` defaulted):
the first call returned the ``Card`` and every replay a ``Wallet`` with a provider nobody
set. The same for ``UUID | str`` returning a str (replayed as a ``UUID``), ``Model | dict``
returning a dict, an enum member under ``Enum | str`` (replayed as the plain str). As for a
result that does not validate (test_result_check.py), the result is stored (the function
ran: a retry must not run it again) and the first call raises the ``InvalidInput`` that says
so, logged as ``settle.operation.result_ambiguous``, instead of returning a value its
replays would not.
"""

from __future__ import annotations

import typing
import uuid
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field
from structlog.testing import capture_logs

from settle import AsyncSettler, Settler, State
from settle.errors import InvalidInput


class Card(BaseModel):
    last4: str


class Wallet(BaseModel):
    last4: str
    provider: str = "applepay"


class Bank(BaseModel):
    iban: str


def test_a_union_arm_replayed_as_another_is_refused_on_the_first_call(settler: Settler) -> None:
    runs: list[str] = []

    @settler.operation(key="method:{order}", principal="tenant:a")
    def method(order: str) -> Wallet | Card:
        runs.append(order)
        return Card(last4="4242")

    with capture_logs() as logs, pytest.raises(InvalidInput, match="cannot tell"):
        method("A-1")
    record = settler.get("method:A-1")
    assert record is not None
    assert record.state is State.COMPLETED  # stored: the function ran, it does not run again
    assert runs == ["A-1"]
    events = [e for e in logs if e["event"] == "settle.operation.result_ambiguous"]
    assert [(e["returned_type"], e["replayed_type"]) for e in events] == [("Card", "Wallet")]


def test_a_str_under_uuid_or_str_is_refused_on_the_first_call(settler: Settler) -> None:
    @settler.operation(key="ref:{order}", principal="tenant:a")
    def reference(order: str) -> uuid.UUID | str:
        return "00000000-0000-4000-8000-000000000001"  # a provider's reference, as text

    with pytest.raises(InvalidInput, match="cannot tell"):
        reference("A-2")


def test_union_arms_their_json_tells_apart_replay_as_themselves(settler: Settler) -> None:
    @settler.operation(key="method:{order}", principal="tenant:a")
    def method(order: str, bank: bool) -> Bank | Card | None:
        return Bank(iban="DE89") if bank else Card(last4="1111")

    for order, bank in (("A-3", True), ("A-4", False)):
        first = method(order, bank)
        again = method(order, bank)
        assert type(first) is type(again)
        assert first == again
    assert method("A-4", False) == Card(last4="1111")


@pytest.mark.asyncio
async def test_an_async_union_arm_replayed_as_another_is_refused_too(
    async_settler: AsyncSettler,
) -> None:
    @async_settler.operation(key="method:{order}", principal="tenant:a")
    async def method(order: str) -> Wallet | Card:
        return Card(last4="4242")

    with pytest.raises(InvalidInput, match="cannot tell") as info:
        await method("A-7")
    assert "Card" in str(info.value)
    assert "Wallet" in str(info.value)
    record = await async_settler.get("method:A-7")
    assert record is not None
    assert record.state is State.COMPLETED


@pytest.mark.parametrize(
    ("declared", "value"),
    [
        # Annotated (a description, a title: not a discriminator) around the union.
        (Annotated[Wallet | Card, Field(description="how it was paid")], Card(last4="4242")),
        (typing.Optional[typing.Union[Wallet, Card]], Card(last4="4242")),  # noqa: UP007, UP045
        (Wallet | dict[str, Any], {"last4": "4242"}),  # an arm of a generic class
        (list[str] | tuple[str, ...], ("ch_1", "ch_2")),  # a tuple's JSON is an array
    ],
    ids=["annotated", "typing-union", "dict-arm", "tuple-arm"],
)
def test_every_spelling_of_the_union_is_checked(
    settler: Settler, declared: Any, value: Any
) -> None:
    runs: list[str] = []

    @settler.operation(key="method:{order}", principal="tenant:a", result_type=declared)
    def method(order: str) -> Any:
        runs.append(order)
        return value

    with pytest.raises(InvalidInput, match="cannot tell"):
        method("A-8")
    assert runs == ["A-8"]
    record = settler.get("method:A-8")
    assert record is not None
    assert record.state is State.COMPLETED
