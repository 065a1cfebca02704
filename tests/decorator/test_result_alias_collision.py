"""A result of the declared model replays as the model it was (SPEC 6), also when one
field's alias is another field's name (a provider's ``id`` read into ``charge_id``, next
to the receipt's own ``id``, which the provider calls ``receipt_id``). Such a model was
stored by alias and replayed right; stored by field name and read by alias first, its
replay silently took ``charge_id`` from the stored ``id``: the caller of a replay got
the receipt id as the charge id, with no error and no ``result_mismatch``. Real Redis."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from settle import AsyncSettler, Settler

P = "customer:c-7"


class Receipt(BaseModel):
    charge_id: str = Field(alias="id")  # the provider's "id" is the charge
    id: str = Field(alias="receipt_id")  # the receipt's own id


ANSWER = {"id": "ch_1", "receipt_id": "r_1"}  # the provider's answer


def test_a_model_whose_alias_is_another_fields_name_replays_as_itself(
    settler: Settler,
) -> None:
    runs: list[int] = []

    @settler.operation(key="charge:{order}", principal=P)
    def charge(order: int) -> Receipt:
        runs.append(order)
        return Receipt.model_validate(ANSWER)

    first = charge(1)
    assert (first.charge_id, first.id) == ("ch_1", "r_1")
    replayed = charge(1)
    assert runs == [1]
    assert (replayed.charge_id, replayed.id) == ("ch_1", "r_1")
    record = settler.get("charge:1")
    assert record is not None
    assert record.value(Receipt) == first


@pytest.mark.asyncio
async def test_async_a_model_whose_alias_is_another_fields_name_replays_as_itself(
    async_settler: AsyncSettler,
) -> None:
    @async_settler.operation(key="charge:{order}", principal=P)
    async def charge(order: int) -> Receipt:
        return Receipt.model_validate(ANSWER)

    first = await charge(2)
    replayed = await charge(2)
    assert (replayed.charge_id, replayed.id) == (first.charge_id, first.id) == ("ch_1", "r_1")
