"""Review of e5c66a8 (replays read a result by field name; one stored by alias before is
recognised and read by alias). SPEC 6: a replay re-validates the stored result into the
declared type and returns what the first call returned. Real Redis, sync shell."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field

from settle import Reserved, Settler
from settle.errors import InvalidInput

P = "customer:c-7"


class Defaulted(BaseModel):
    charge_id: str = Field("", alias="chargeId")
    amount: int = 0


@pytest.mark.parametrize(
    ("declared", "stored", "expected"),
    [
        (
            Defaulted | None,
            b'{"chargeId": "ch_old", "amount": 5}',
            Defaulted(chargeId="ch_old", amount=5),
        ),
        (
            list[Defaulted],
            b'[{"chargeId": "ch_old", "amount": 5}]',
            [Defaulted(chargeId="ch_old", amount=5)],
        ),
    ],
    ids=["optional-model", "list-of-models"],
)
def test_a_result_stored_by_alias_before_under_a_wrapped_model_keeps_its_values(
    settler: Settler, declared: object, stored: bytes, expected: object
) -> None:
    """A record stored by alias by the settle before this change, read under ``Model |
    None`` or ``list[Model]``: the old-form check looks at a bare model class only, so the
    by-name read succeeds with the field's default, silently (104e596 read it right)."""
    reserved = settler.reserve("charge:old-wrapped", principal=P, fingerprint="e" * 64)
    assert isinstance(reserved, Reserved)
    settler.complete(reserved.reservation, stored)
    record = settler.get("charge:old-wrapped")
    assert record is not None
    assert record.value(declared) == expected


class Open(BaseModel):
    """Keeps what the provider sends beyond its fields."""

    model_config = ConfigDict(extra="allow")
    charge_id: str = Field(alias="id")


def test_an_extra_named_like_an_alias_does_not_make_a_new_result_read_as_an_old_one(
    settler: Settler,
) -> None:
    """A new result (stored by name) whose extras hold a key that is an alias is taken for
    the old form and read by alias: the alias's extra value replaces the field's."""
    runs: list[int] = []

    @settler.operation(key="charge:{order}", principal=P)
    def charge(order: int) -> Open:
        runs.append(order)
        receipt = Open.model_validate({"id": "ch_1"})
        receipt.id = "evt_9"  # an extra (extra="allow"), e.g. the event that carried it
        return receipt

    first = charge(1)
    assert first.charge_id == "ch_1"
    replayed = charge(1)
    assert runs == [1]
    assert replayed == first
    assert replayed.charge_id == "ch_1"


class Receipt(BaseModel):
    charge_id: str = Field(alias="id")  # the provider's "id" is the charge
    id: str = Field(alias="receipt_id")  # the receipt's own id


def test_a_bad_value_in_a_model_whose_alias_is_another_fields_name_is_refused(
    settler: Settler,
) -> None:
    """docs/outbound-calls.md: an instance assigned a bad value after it was built is
    refused on its first call (InvalidInput), as its replays would be. Here the by-name read
    fails, the fallback by alias reads ``charge_id`` from the stored ``id``: the first call
    passes the check and returns charge_id=5, every replay returns the receipt id."""

    @settler.operation(key="charge:{order}", principal=P)
    def charge(order: int) -> Receipt:
        receipt = Receipt.model_validate({"id": "ch_1", "receipt_id": "r_1"})
        receipt.charge_id = 5  # type: ignore[assignment]
        return receipt

    with pytest.raises(InvalidInput):
        charge(1)
