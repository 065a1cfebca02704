"""A result of the declared model replays as the model it was (SPEC 6: a replay
re-validates the stored result into the declared return type). A model whose JSON dump
pydantic does not read back by default (a field with a ``validation_alias`` to parse a
provider's answer, a ``serialization_alias``, a computed field in a model that forbids
extras, a ``Json[...]`` field) was stored in that dump, and its first call raised
``InvalidInput`` after the charge, every retry too: the function had returned exactly its
declared type, and no ``result_type=`` could repair it. Now a result is stored in the form
pydantic validates back (fields by name, computed fields left out, ``Json`` fields as
their JSON text) and read by name or by alias, so a record stored before, by alias, still
replays. Real Redis, sync and async shells."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, Json, computed_field

from settle import AsyncSettler, OperationRecord, Reserved, Settler, State

P = "customer:c-7"


class ProviderReceipt(BaseModel):
    """Parsed from the provider's answer, whose fields are named otherwise."""

    charge_id: str = Field(validation_alias="id")
    amount: int


class OutboundReceipt(BaseModel):
    """Written for another service in camelCase."""

    charge_id: str = Field(serialization_alias="chargeId")
    amount: int


class StrictReceipt(BaseModel):
    model_config = ConfigDict(extra="forbid")

    net: int
    fee: int

    @computed_field  # type: ignore[prop-decorator]
    @property
    def gross(self) -> int:
        return self.net + self.fee


class RawReceipt(BaseModel):
    charge_id: str
    provider_answer: Json[dict[str, Any]]


class Camel(BaseModel):
    charge_id: str = Field(alias="chargeId")


RESULTS: list[BaseModel] = [
    ProviderReceipt.model_validate({"id": "ch_1", "amount": 4999}),
    OutboundReceipt(charge_id="ch_2", amount=4999),
    StrictReceipt(net=4900, fee=99),
    RawReceipt.model_validate({"charge_id": "ch_3", "provider_answer": '{"status": "ok"}'}),
]
IDS = [type(value).__name__ for value in RESULTS]


@pytest.mark.parametrize("value", RESULTS, ids=IDS)
def test_a_model_whose_dump_does_not_validate_back_is_returned_and_replayed(
    settler: Settler, value: BaseModel
) -> None:
    runs: list[int] = []
    model = type(value)

    @settler.operation(key="charge:{order}", principal=P, result_type=model)
    def charge(order: int) -> Any:
        runs.append(order)
        return value

    assert charge(1) is value
    replayed = charge(1)
    assert type(replayed) is model
    assert replayed == value
    assert runs == [1]
    record = settler.get("charge:1")
    assert record is not None
    assert record.state is State.COMPLETED
    assert record.value(model) == value


@pytest.mark.asyncio
@pytest.mark.parametrize("value", RESULTS, ids=IDS)
async def test_async_a_model_whose_dump_does_not_validate_back_is_returned_and_replayed(
    async_settler: AsyncSettler, value: BaseModel
) -> None:
    runs: list[int] = []
    model = type(value)

    @async_settler.operation(key="charge:{order}", principal=P, result_type=model)
    async def charge(order: int) -> Any:
        runs.append(order)
        return value

    assert await charge(1) is value
    replayed = await charge(1)
    assert type(replayed) is model
    assert replayed == value
    assert runs == [1]


def _stored(settler: Settler, operation_id: str, result: object) -> OperationRecord:
    """The record of ``operation_id`` completed with ``result`` (bytes: stored as they are,
    as an older settle stored a model by alias)."""
    reserved = settler.reserve(operation_id, principal=P, fingerprint="f" * 64)
    assert isinstance(reserved, Reserved)
    settler.complete(reserved.reservation, result)
    record = settler.get(operation_id)
    assert record is not None
    return record


def test_a_result_stored_by_alias_before_still_replays(settler: Settler) -> None:
    """Results used to be stored by alias: such a record still replays."""
    record = _stored(settler, "charge:old", b'{"chargeId": "ch_old"}')
    assert record.value(Camel) == Camel(chargeId="ch_old")
    # and a new one is stored by name, which the model reads back too
    record = _stored(settler, "charge:new", Camel(chargeId="ch_new"))
    assert record.value(Camel) == Camel(chargeId="ch_new")


class Defaulted(BaseModel):
    charge_id: str = Field("", alias="chargeId")
    amount: int = 0


def test_a_result_stored_by_alias_before_keeps_its_defaulted_fields(settler: Settler) -> None:
    """Read by name alone, a record stored by alias (before this version) with a defaulted
    aliased field would silently replay the default: it is read by alias."""
    record = _stored(settler, "charge:old-default", b'{"chargeId": "ch_old", "amount": 5}')
    assert record.value(Defaulted) == Defaulted(chargeId="ch_old", amount=5)


class Labelled(BaseModel):
    charge_id: str = Field(alias="chargeId")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def label(self) -> str:
        return self.charge_id.upper()


def test_a_result_stored_by_alias_before_with_a_computed_field_still_replays(
    settler: Settler,
) -> None:
    """The older settle stored a model by alias with its computed fields: that form is
    recognised as it was written."""
    record = _stored(settler, "charge:old-computed", b'{"chargeId": "ch_old", "label": "CH_OLD"}')
    assert record.value(Labelled) == Labelled(chargeId="ch_old")


class Tagged(BaseModel):
    charge_id: str = Field(alias="chargeId")
    tags: set[str]


def test_a_result_stored_by_alias_before_with_a_set_still_replays(settler: Settler) -> None:
    """A set is dumped in the order its process hashes it: the reading of an older record
    is recognised whatever the order its items were stored in."""
    stored = b'{"chargeId": "ch_old", "tags": ["zeta", "alpha", "mid", "beta", "omega"]}'
    record = _stored(settler, "charge:old-set", stored)
    value = record.value(Tagged)
    assert value.charge_id == "ch_old"
    assert value.tags == {"zeta", "alpha", "mid", "beta", "omega"}
