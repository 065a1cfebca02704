"""A stored result that does not validate into the asked type is refused without quoting it.

The error's text used to be pydantic's, which quotes the stored values
(``input_value='4242...'``): an error is read, logged and recorded by others (an error
tracker, a server span), and a receipt's data is not theirs. The text names where and why
it fails; pydantic's error stays the ``__cause__`` for the developer.
"""

from __future__ import annotations

from typing import Any

import pytest
import tenacity
from pydantic import BaseModel, ValidationError

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
    r = settler.reserve("op-1", {"n": 1}, principal="tenant:a").reservation
    settler.complete(r, {"charge": SECRET, "amount": SECRET, "currency": 1, "note": SECRET})
    record = settler.get("op-1")
    assert record is not None
    with pytest.raises(InvalidInput) as raised:
        record.value(Receipt)
    text = str(raised.value)
    assert SECRET not in text
    assert "charge: Input should be a valid integer" in text
    assert "(and 2 more)" in text  # five problems: three named, the count of the rest
    assert isinstance(raised.value.__cause__, ValidationError)


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
