"""Settings refuse a bool for a number (pydantic's lax mode reads ``True`` as 1) and take
one for a bool, also where the field may be None (``bool | None``)."""

from __future__ import annotations

import pytest

from settle._input import InputModel
from settle.errors import InvalidInput


class Settings(InputModel):
    strict: bool | None = None
    enabled: bool = False
    limit: int | None = None
    ratio: float = 1.0


@pytest.mark.parametrize("value", [True, False, None])
def test_a_bool_or_none_setting_takes_a_bool_or_none(value: bool | None) -> None:
    assert Settings(strict=value).strict is value
    assert Settings.model_validate({"strict": value}).strict is value


def test_a_bool_setting_takes_a_bool() -> None:
    assert Settings(enabled=True).enabled is True


@pytest.mark.parametrize("field", ["limit", "ratio"])
@pytest.mark.parametrize("value", [True, False])
def test_a_number_setting_refuses_a_bool_naming_the_field(field: str, value: bool) -> None:
    with pytest.raises(InvalidInput, match=f"{field}: .*must not be a bool"):
        Settings(**{field: value})
    with pytest.raises(InvalidInput, match=f"{field}: .*must not be a bool"):
        Settings.model_validate({field: value})


def test_a_number_setting_still_reads_a_number_written_as_text() -> None:
    assert Settings(limit="4", ratio="2.5").model_dump(include={"limit", "ratio"}) == {
        "limit": 4,
        "ratio": 2.5,
    }
