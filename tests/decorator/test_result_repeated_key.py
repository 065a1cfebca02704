"""A model that keeps extras (``extra="allow"``), built from a provider's answer that held
both a field's alias and its name, keeps the name as an extra: dumped by field name, its
JSON names that key twice. It was stored so, and every replay read the extra's value into
the field (a parser keeps the last of the two), where the first call had returned the
alias's: the caller of a replay got another amount, with no error. No stored form reads
back as that model, and the paid call has run: the decorator stores the result (the
function does not run again) and its first call and every replay raise ``InvalidInput``;
``complete()`` refuses it before anything is written. Real Redis (docs/outbound-calls.md)."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from settle import AsyncSettler, Reserved, Settler, State
from settle.errors import FingerprintError, InvalidInput

P = "customer:c-7"


class Charge(BaseModel):
    """Keeps what the provider sends beyond its fields; the provider calls ``amount``
    ``amt``."""

    model_config = ConfigDict(extra="allow")
    amount: int = Field(alias="amt")


ANSWER = {"amt": 500, "amount": 7}  # the provider's answer: both the alias and the name


def test_a_result_naming_a_key_twice_is_stored_and_refused_on_every_call(
    settler: Settler,
) -> None:
    runs: list[int] = []

    @settler.operation(key="charge:{order}", principal=P)
    def charge(order: int) -> Charge:
        runs.append(order)
        return Charge.model_validate(ANSWER)

    with pytest.raises(InvalidInput, match=r"names a key twice") as first:
        charge(1)
    with pytest.raises(InvalidInput, match=r"names a key twice") as replay:
        charge(1)
    assert runs == [1]  # stored: the paid call is not run again
    assert str(replay.value) == str(first.value)
    record = settler.get("charge:1")
    assert record is not None
    assert record.state is State.COMPLETED
    with pytest.raises(InvalidInput, match=r"names a key twice"):
        record.value(Charge)


@pytest.mark.asyncio
async def test_async_a_result_naming_a_key_twice_is_stored_and_refused_on_every_call(
    async_settler: AsyncSettler,
) -> None:
    runs: list[int] = []

    @async_settler.operation(key="charge:{order}", principal=P)
    async def charge(order: int) -> list[Charge]:
        runs.append(order)
        return [Charge.model_validate(ANSWER)]

    for _ in range(2):
        with pytest.raises(InvalidInput, match=r"names a key twice"):
            await charge(2)
    assert runs == [2]


def test_complete_refuses_a_result_naming_a_key_twice_and_writes_nothing(
    settler: Settler,
) -> None:
    reserved = settler.reserve("charge:direct", principal=P, fingerprint="e" * 64)
    assert isinstance(reserved, Reserved)
    with pytest.raises(FingerprintError, match=r"Charge\.amount is both a field and an extra"):
        settler.complete(reserved.reservation, {"charge": Charge.model_validate(ANSWER)})
    record = settler.get("charge:direct")
    assert record is not None
    assert record.state is State.PENDING
    assert record.result is None


def test_a_model_with_an_alias_and_extras_still_replays_as_itself(settler: Settler) -> None:
    runs: list[int] = []

    @settler.operation(key="charge:{order}", principal=P)
    def charge(order: int) -> Charge:
        runs.append(order)
        return Charge.model_validate({"amt": 500, "currency": "eur"})

    first = charge(3)
    assert charge(3) == first
    assert (first.amount, first.model_extra) == (500, {"currency": "eur"})
    assert runs == [3]


@dataclasses.dataclass
class Receipt:
    charge: Charge


@pytest.mark.parametrize(
    "holder",
    [
        lambda c: OrderedDict(charge=c),
        lambda c: defaultdict(list, charges=[c]),
        Receipt,
        lambda c: deque([c]),
    ],
    ids=["OrderedDict", "defaultdict", "dataclass", "deque"],
)
def test_complete_refuses_the_model_inside_any_container_pydantic_stores(
    settler: Settler, holder: Callable[[Charge], object]
) -> None:
    # pydantic stores a dict subclass, a dataclass or a deque as JSON like a dict or a list:
    # the model inside names its key twice all the same.
    reserved = settler.reserve("charge:held", principal=P, fingerprint="f" * 64)
    assert isinstance(reserved, Reserved)
    with pytest.raises(FingerprintError, match=r"Charge\.amount is both a field and an extra"):
        settler.complete(reserved.reservation, holder(Charge.model_validate(ANSWER)))
    record = settler.get("charge:held")
    assert record is not None
    assert record.state is State.PENDING


class Holder(BaseModel):
    """A model with no extras, whose field takes any value."""

    charge: Any


class Batch(BaseModel):
    """Keeps extras, and holds its charges in a field of its own."""

    model_config = ConfigDict(extra="allow")
    charges: list[Any]


@pytest.mark.parametrize(
    "holder",
    [
        lambda c: Holder(charge=c),
        lambda c: Envelope(id=1, charge=c),
        lambda c: Batch(charges=[c], note="kept"),
    ],
    ids=["model-field", "model-extra", "model-with-extras-field"],
)
def test_complete_refuses_the_model_inside_another_model(
    settler: Settler, holder: Callable[[Charge], object]
) -> None:
    """The walk steps into a model's fields, and into its extras, whether it keeps extras
    or not: the model inside names its key twice all the same."""
    reserved = settler.reserve("charge:nested", principal=P, fingerprint="a" * 64)
    assert isinstance(reserved, Reserved)
    with pytest.raises(FingerprintError, match=r"Charge\.amount is both a field and an extra"):
        settler.complete(reserved.reservation, holder(Charge.model_validate(ANSWER)))
    record = settler.get("charge:nested")
    assert record is not None
    assert record.state is State.PENDING


def test_complete_stores_models_whose_extras_name_no_field(settler: Settler) -> None:
    """Extras named like no field, and a charge built from its alias alone, are stored."""
    reserved = settler.reserve("charge:clean", principal=P, fingerprint="b" * 64)
    assert isinstance(reserved, Reserved)
    clean = Charge.model_validate({"amt": 500, "currency": "eur"})
    settler.complete(
        reserved.reservation,
        Batch(charges=[clean], note="kept", envelope=Envelope(id=2, memo="m")),
    )
    record = settler.get("charge:clean")
    assert record is not None
    assert record.state is State.COMPLETED


class Envelope(BaseModel):
    """Keeps what it is given beyond its fields, and has no alias of its own."""

    model_config = ConfigDict(extra="allow")
    id: int


def _charge() -> Charge:
    return Charge.model_validate(ANSWER)


# Declared types that name no aliased model but take any value somewhere: the function may
# return such a model there. The first call returned it (amount 500) and every replay read
# the extra's value (amount 7), with no error.
_OPEN = [
    pytest.param(Any, _charge, id="Any"),
    pytest.param(dict[str, Any], lambda: {"charge": _charge()}, id="dict[str, Any]"),
    pytest.param(list, lambda: [_charge()], id="list"),
    pytest.param(Envelope, lambda: Envelope(id=1, charge=_charge()), id="model-extras"),
]


@pytest.mark.parametrize(("declared", "build"), _OPEN)
def test_a_result_naming_a_key_twice_where_any_value_goes_is_refused_on_every_call(
    settler: Settler, declared: Any, build: Callable[[], object]
) -> None:
    runs: list[int] = []

    @settler.operation(key="open:{order}", principal=P, result_type=declared)
    def charge(order: int) -> Any:
        runs.append(order)
        return build()

    for _ in range(2):
        with pytest.raises(InvalidInput, match=r"names a key twice"):
            charge(4)
    assert runs == [4]
    record = settler.get("open:4")
    assert record is not None
    with pytest.raises(InvalidInput, match=r"names a key twice"):
        record.value(declared)


@pytest.mark.asyncio
async def test_async_a_result_naming_a_key_twice_declared_any_is_refused(
    async_settler: AsyncSettler,
) -> None:
    @async_settler.operation(key="open:{order}", principal=P)
    async def charge(order: int) -> dict[str, Any]:
        return {"charge": _charge()}

    for _ in range(2):
        with pytest.raises(InvalidInput, match=r"names a key twice"):
            await charge(5)
