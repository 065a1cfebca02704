"""Settings refuse a bool for a number (pydantic's lax mode reads ``True`` as 1) and take
one for a bool, also where the field may be None (``bool | None``)."""

from __future__ import annotations

import pytest

from settle import SettleConfig
from settle._input import InputModel
from settle.cursor import ProviderContract
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


# A bool of a setting or a provider contract is a promise: lax mode read "yes", "1", 1 and
# 1.0 as True (and "no", "off", 0 as False), so a typo or a number meant for another field
# became a guarantee the checks then relied on.
_NOT_A_BOOL = ["yes", "no", "on", "1", "true", 1, 0, 1.0, "", b"true"]


@pytest.mark.parametrize("value", _NOT_A_BOOL)
@pytest.mark.parametrize(
    ("model", "field"),
    [
        (ProviderContract, "rotation_allowed"),
        (ProviderContract, "stable_snapshots"),
        (ProviderContract, "coverage_watermarks"),
        (SettleConfig, "allow_eviction"),
        (Settings, "strict"),
        (Settings, "enabled"),
    ],
)
def test_a_bool_setting_refuses_anything_but_a_bool(
    model: type[InputModel], field: str, value: object
) -> None:
    for build in (lambda: model(**{field: value}), lambda: model.model_validate({field: value})):
        with pytest.raises(InvalidInput, match=f"{field}: .*must be True or False"):
            build()


@pytest.mark.parametrize("text", ["1", "0", "yes", "on"])
def test_a_bool_setting_refuses_a_json_number_or_text(text: str) -> None:
    value = text if text.isdigit() else f'"{text}"'
    with pytest.raises(InvalidInput, match=r"rotation_allowed: .*must be True or False"):
        ProviderContract.model_validate_json(f'{{"rotation_allowed": {value}}}')
    assert ProviderContract.model_validate_json('{"rotation_allowed": true}').rotation_allowed


def test_a_bool_setting_read_from_text_takes_true_or_false_only() -> None:
    read = ProviderContract.model_validate_strings
    assert read({"rotation_allowed": "true", "cursor_ttl": "30"}).rotation_allowed is True
    assert read({"stable_snapshots": "False"}).stable_snapshots is False
    for text in ("yes", "1", "on", "t"):
        with pytest.raises(InvalidInput, match=r"rotation_allowed: .*must be True or False"):
            read({"rotation_allowed": text})
    assert SettleConfig.model_validate_strings({"allow_eviction": "false"}).allow_eviction is False
