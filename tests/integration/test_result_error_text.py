"""A stored result that does not validate into the asked type is refused without quoting it.

The error's text used to be pydantic's, which quotes the stored values
(``input_value='4242...'``): an error is read, logged and recorded by others (an error
tracker, a server span), and a receipt's data is not theirs. The text names where and why
it fails; pydantic's error stays the ``__cause__`` for the developer.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pytest
import tenacity
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from settle import Settler
from settle.errors import InvalidInput

SECRET = "4242-4242-4242-4242"


class Receipt(BaseModel):
    charge: int
    amount: int
    currency: str
    note: int
    extra: int


def test_value_names_where_the_result_fails_without_its_values(settler: Settler) -> None:
    stored = {"charge": SECRET, "amount": SECRET, "currency": 1, "note": SECRET}
    refused = _refusal(settler, stored, Receipt)
    text = str(refused)
    assert SECRET not in text
    assert "charge: Input should be a valid integer" in text
    assert "(and 2 more)" in text  # five problems: three named, the count of the rest
    assert isinstance(refused.__cause__, ValidationError)


def _refusal(settler: Settler, stored: Any, type_: Any) -> InvalidInput:
    """What ``record.value(type_)`` raises for a record completed with ``stored``."""
    r = settler.reserve("op-1", {"n": 1}, principal="tenant:a").reservation
    settler.complete(r, stored)
    record = settler.get("op-1")
    assert record is not None
    with pytest.raises(InvalidInput) as raised:
        record.value(type_)
    return raised.value


def _charge(settler: Settler, returns: Any) -> Any:
    """The operation ``charge``, declared to return ``returns`` (its return type changed
    between two deployments); it returns a card number where the receipt wants a charge id."""

    @settler.operation(
        key="charge:{order}",
        principal="tenant:a",
        retry=tenacity.Retrying(stop=tenacity.stop_after_attempt(1)),
        result_type=returns,
    )
    def charge(order: str) -> Any:
        return {"charge": SECRET}

    return charge


def test_a_decorated_replay_names_where_it_fails_without_its_values(settler: Settler) -> None:
    assert _charge(settler, dict)("o-1") == {"charge": SECRET}
    with pytest.raises(InvalidInput, match="does not validate into") as raised:
        _charge(settler, Receipt)("o-1")
    assert SECRET not in str(raised.value)
    assert "charge: Input should be a valid integer" in str(raised.value)


class Charge(BaseModel):
    kind: Literal["charge"]
    amount: int


class Refund(BaseModel):
    kind: Literal["refund"]
    amount: int


class Payer(BaseModel):
    email: str

    @field_validator("email")
    @classmethod
    def _known(cls, value: str) -> str:
        raise ValueError(f"no payer {value}")  # an application's validator quotes its input


class Account(BaseModel):
    email: str

    @field_validator("email")
    @classmethod
    def _known(cls, value: str) -> str:
        raise PydanticCustomError("payer_unknown", "no payer {email}", {"email": value})


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount: int


EMAIL = "alice@example.com"


@pytest.mark.parametrize(
    ("type_", "stored", "says"),
    [
        # a dict's keys are stored data: pydantic names them in the error's location
        (dict[str, int], {EMAIL: SECRET}, "<key>: Input should be a valid integer"),
        (dict[str, list[int]], {EMAIL: [SECRET]}, "<key>.0: Input should be a valid integer"),
        (dict[int, int], {EMAIL: 1}, "<key>.[key]: Input should be a valid integer"),
        # so is a field the model does not have
        (Closed, {"amount": 1, EMAIL: 2}, "<key>: Extra inputs are not permitted"),
        # a tagged union's error quotes the tag it found
        (
            Annotated[Charge | Refund, Field(discriminator="kind")],
            {"kind": SECRET, "amount": 1},
            "(the result): Input tag found using 'kind' does not match any of the expected "
            "tags: 'charge', 'refund'",
        ),
        # an application's validator may quote what it refuses
        (Payer, {"email": EMAIL}, "email: a validator refused it (value_error)"),
        (list[Payer], [{"email": EMAIL}], "0.email: a validator refused it (value_error)"),
        (Account, {"email": EMAIL}, "email: a validator refused it (payer_unknown)"),
        # and nested models and unions keep the names the types declare
        (dict[str, Receipt], {EMAIL: {}}, "<key>.charge: Field required"),
        (int | list[int], SECRET, "int: Input should be a valid integer"),
        # pydantic's own words, as they are (braces and all)
        (
            Annotated[str, Field(pattern="^[0-9]{3}$")],
            SECRET,
            "(the result): String should match pattern '^[0-9]{3}$'",
        ),
    ],
)
def test_no_path_of_the_message_holds_a_stored_value(
    settler: Settler, type_: Any, stored: Any, says: str
) -> None:
    """The location and the message of each problem are pydantic's, and either may hold
    the stored data: a dict's key (an e-mail address, a card number: ``{EMAIL: ...}``), a
    field the model does not have, the tag a tagged union did not know, the text of an
    application's validator. A key the data holds is named ``<key>``; a message that may
    quote the data is said in settle's words."""
    text = str(_refusal(settler, stored, type_))
    assert (SECRET in text, EMAIL in text) == (False, False)
    assert says in text


def test_the_first_call_names_where_it_fails_without_a_stored_key(settler: Settler) -> None:
    """The decorator's first call checks its result by the declared type, and refuses it
    with the same words: no key of the result it refuses."""

    @settler.operation(key="pay:{order}", principal="tenant:a")
    def pay(order: str) -> dict[str, int]:
        return {EMAIL: SECRET}  # type: ignore[dict-item]  # not what it declares

    with pytest.raises(InvalidInput, match="does not validate into") as raised:
        pay("o-2")
    assert EMAIL not in str(raised.value)
    assert SECRET not in str(raised.value)
    assert "<key>: Input should be a valid integer" in str(raised.value)
