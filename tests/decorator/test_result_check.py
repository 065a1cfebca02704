"""A first call returns what every replay of it will (SPEC 6: a replay re-validates the
stored result into the declared return type). A result that does not validate into that
type used to reach its first caller and be stored, and every retry of it (a timeout, a
duplicate delivery) then raised ``InvalidInput``: a fault no test calling once could see.
Now the result is checked when the function returns, by the replay's own rule: it is
stored all the same (the effect happened; a retry must not run the function again), the
first call raises the replay's ``InvalidInput``, and a warning names the operation, never
the value. Real Redis, sync and async shells."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field
from structlog.testing import capture_logs

from settle import AsyncSettler, OperationRecord, Settler, State
from settle._log import operation_digest
from settle.errors import InvalidInput
from settle.testing import MemorySettler

P = "tenant:acme"
MISMATCH = "settle.operation.result_mismatch"


class Charge(BaseModel):
    id: str
    amount: int


class Gold(Charge):
    tier: str = "gold"


#: Results that do not validate into ``Charge``: a required field missing, a str for an int.
WRONG: list[dict[str, Any]] = [{"id": "ch_secret_1"}, {"id": "ch_1", "amount": "secret-lots"}]


def _check_refused(error: pytest.ExceptionInfo[InvalidInput], operation_id: str) -> None:
    message = str(error.value)
    assert error.value.operation_id == operation_id
    assert "does not validate into" in message
    assert "Charge" in message
    assert "the result is stored" in message.lower()
    assert "will not run again" in message
    assert "result_type=" in message


def _check_logged(
    logs: list[dict[str, Any]], record: OperationRecord, wrong: dict[str, Any]
) -> None:
    (event,) = [e for e in logs if e["event"] == MISMATCH]
    assert event["log_level"] == "warning"
    operation_id = record.operation_id
    assert event["operation_digest"] == operation_digest(operation_id)
    assert event["generation"] == record.generation
    assert event["function"] == "charge"
    assert operation_id not in repr(event)
    for value in wrong.values():
        assert str(value) not in repr(event)  # never the result


@pytest.mark.parametrize("wrong", WRONG)
def test_a_result_that_its_replays_would_refuse_is_stored_and_refused_at_once(
    settler: Settler, wrong: dict[str, Any]
) -> None:
    runs: list[str] = []

    @settler.operation(key="charge:{order}", principal=P)
    def charge(order: str) -> Charge:
        runs.append(order)
        return wrong  # type: ignore[return-value]  # the fault under test

    with capture_logs() as logs, pytest.raises(InvalidInput) as first:
        charge("o1")
    _check_refused(first, "charge:o1")
    record = settler.get("charge:o1")
    assert record is not None
    _check_logged(logs, record, wrong)
    assert record.state is State.COMPLETED  # stored: a retry does not run it again
    assert record.value(dict[str, Any]) == wrong
    with capture_logs() as logs, pytest.raises(InvalidInput) as replay:
        charge("o1")
    assert str(replay.value) == str(first.value)  # the same error, every call
    assert runs == ["o1"]
    assert [e for e in logs if e["event"] == MISMATCH] == []  # told once, when stored


@pytest.mark.asyncio
@pytest.mark.parametrize("wrong", WRONG)
async def test_async_a_result_that_its_replays_would_refuse_is_stored_and_refused_at_once(
    async_settler: AsyncSettler, wrong: dict[str, Any]
) -> None:
    runs: list[str] = []

    @async_settler.operation(key="charge:{order}", principal=P)
    async def charge(order: str) -> Charge:
        runs.append(order)
        return wrong  # type: ignore[return-value]  # the fault under test

    with capture_logs() as logs, pytest.raises(InvalidInput) as first:
        await charge("o1")
    _check_refused(first, "charge:o1")
    record = await async_settler.get("charge:o1")
    assert record is not None
    _check_logged(logs, record, wrong)
    assert record.state is State.COMPLETED
    assert record.value(dict[str, Any]) == wrong
    with pytest.raises(InvalidInput) as replay:
        await charge("o1")
    assert str(replay.value) == str(first.value)
    assert runs == ["o1"]


def test_the_memory_settler_refuses_it_at_once_too() -> None:
    s = MemorySettler()
    runs: list[str] = []

    @s.operation(key=lambda order: order, principal="t")
    def charge(order: str) -> Charge:
        runs.append(order)
        return {"id": "ch_1"}  # type: ignore[return-value]  # the fault under test

    with pytest.raises(InvalidInput) as first:
        charge("o1")
    with pytest.raises(InvalidInput) as replay:
        charge("o1")
    assert str(replay.value) == str(first.value)
    assert runs == ["o1"]


def test_result_type_given_is_the_type_checked(settler: Settler) -> None:
    @settler.operation(key="loose:{n}", principal=P, result_type=dict[str, Any])
    def loose(n: int) -> Charge:
        return {"id": "ch_1"}  # type: ignore[return-value]  # stored and replayed as a dict

    @settler.operation(key="strict:{n}", principal=P, result_type=Charge)
    def strict(n: int) -> dict[str, Any]:
        return {"id": "ch_1"}

    assert loose(1) == loose(1) == {"id": "ch_1"}
    with pytest.raises(InvalidInput, match="Charge"):
        strict(1)


def test_results_that_validate_behave_as_before(settler: Settler) -> None:
    """A model instance is returned as it is (the same object), a dict that validates
    into the model as the dict (its replays give the model), primitives, None and bytes
    as they are; each is stored once and replayed."""
    runs: list[str] = []
    model = Charge(id="ch_1", amount=5)
    gold = Gold(id="ch_2", amount=7)

    @settler.operation(key="model:{n}", principal=P)
    def as_model(n: int) -> Charge:
        runs.append("model")
        return model if n == 1 else gold

    @settler.operation(key="dict:{n}", principal=P)
    def as_dict(n: int) -> Charge:
        runs.append("dict")
        return {"id": "ch_1", "amount": "5"}  # type: ignore[return-value]  # validates

    @settler.operation(key="count:{n}", principal=P)
    def count(n: int) -> int:
        runs.append("count")
        return n * 2

    @settler.operation(key="ratio:{n}", principal=P)
    def ratio(n: int) -> float:
        runs.append("ratio")
        return n  # an int validates into float

    @settler.operation(key="nothing:{n}", principal=P)
    def nothing(n: int) -> None:
        runs.append("nothing")

    @settler.operation(key="raw:{n}", principal=P)
    def raw(n: int) -> bytes:
        runs.append("raw")
        return b"%PDF \x00\xff"

    @settler.operation(key="items:{n}", principal=P)
    def items(n: int) -> list[Charge]:
        runs.append("items")
        return [model, {"id": "ch_3", "amount": 1}]  # type: ignore[list-item]  # validates

    assert as_model(1) is model
    assert as_model(1) == model
    assert as_model(2) is gold
    assert as_model(2) == Charge(id="ch_2", amount=7)  # replayed as the declared model
    assert as_dict(1) == {"id": "ch_1", "amount": "5"}  # the first call: as returned
    assert as_dict(1) == Charge(id="ch_1", amount=5)
    assert count(3) == count(3) == 6
    assert ratio(3) == ratio(3) == 3
    assert nothing(1) is None
    assert nothing(1) is None
    assert raw(1) == raw(1) == b"%PDF \x00\xff"
    assert items(1)[1] == {"id": "ch_3", "amount": 1}
    assert items(1) == [model, Charge(id="ch_3", amount=1)]
    assert runs == ["model", "model", "dict", "count", "ratio", "nothing", "raw", "items"]


@pytest.mark.asyncio
async def test_async_results_that_validate_behave_as_before(async_settler: AsyncSettler) -> None:
    model = Charge(id="ch_1", amount=5)

    @async_settler.operation(key="model:{n}", principal=P)
    async def as_model(n: int) -> Charge:
        return model

    @async_settler.operation(key="dict:{n}", principal=P)
    async def as_dict(n: int) -> Charge:
        return {"id": "ch_1", "amount": 5}  # type: ignore[return-value]  # validates

    @async_settler.operation(key="text:{n}", principal=P)
    async def text(n: int) -> str:
        return f"t{n}"

    assert await as_model(1) is model
    assert await as_model(1) == model
    assert await as_dict(1) == {"id": "ch_1", "amount": 5}
    assert await as_dict(1) == model
    assert await text(1) == await text(1) == "t1"


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str


class ClosedPlus(Closed):
    note: str = "extra"


class Hidden(BaseModel):
    id: str
    secret: str = Field(exclude=True)  # never serialized: the stored JSON lacks it


def test_an_instance_of_the_declared_model_its_replays_refuse_is_refused_at_once(
    settler: Settler,
) -> None:
    """An instance of the declared model is no proof its replays validate: a subclass's
    extra field into a model that forbids extras, a required field left out of the JSON
    (``exclude=True``), an instance built with ``model_construct`` (never validated).
    Each is stored, and its first call raises what its replays raise."""
    runs: list[str] = []

    @settler.operation(key="closed:{n}", principal=P)
    def closed(n: int) -> Closed:
        runs.append("closed")
        return ClosedPlus(id="ch_1")

    @settler.operation(key="hidden:{n}", principal=P)
    def hidden(n: int) -> Hidden:
        runs.append("hidden")
        return Hidden(id="ch_1", secret="s")

    @settler.operation(key="built:{n}", principal=P)
    def built(n: int) -> Charge:
        runs.append("built")
        return Charge.model_construct(id="ch_1")

    for call, operation_id in ((closed, "closed:1"), (hidden, "hidden:1"), (built, "built:1")):
        with capture_logs() as logs, pytest.raises(InvalidInput) as first:
            call(1)
        assert first.value.operation_id == operation_id
        assert [e["event"] for e in logs if e["event"] == MISMATCH] == [MISMATCH]
        record = settler.get(operation_id)
        assert record is not None
        assert record.state is State.COMPLETED
        with pytest.raises(InvalidInput) as replay:
            call(1)
        assert str(replay.value) == str(first.value)
    assert runs == ["closed", "hidden", "built"]


def test_a_return_type_that_cannot_be_resolved_is_not_checked_at_the_first_call(
    settler: Settler,
) -> None:
    """An annotation naming a class that does not exist cannot be checked: the function
    ran, so its result is stored and returned, and the replay says what is wrong with the
    type (not that the result fails to validate into some other type)."""

    @settler.operation(key="unresolved:{n}", principal=P)
    def unresolved(n: int) -> NoSuchCharge:  # type: ignore[name-defined]  # noqa: F821
        return {"id": "ch_1"}

    assert unresolved(1) == {"id": "ch_1"}
    record = settler.get("unresolved:1")
    assert record is not None
    assert record.state is State.COMPLETED
    with pytest.raises(InvalidInput, match="cannot resolve the return annotation"):
        unresolved(1)


def _nested(depth: int, leaf: Any = 1) -> Any:
    """``depth`` containers one in another, dicts and lists in turn."""
    value = leaf
    for level in range(depth):
        value = {"n": value} if level % 2 else [value]
    return value


#: What pydantic's JSON parser (a replay's) refuses although pydantic writes it: containers
#: nested more than 200 deep, an integer of more than 4300 digits.
UNREADABLE: list[tuple[Any, Any]] = [
    (dict[str, Any], {"deep": _nested(201)}),
    (dict, {"deep": _nested(201)}),
    (list[Any], [_nested(201)]),
    (list, [_nested(201)]),
    (Any, _nested(201)),
    (dict[str, Any], {"n": 10**4300}),
    (list[Any], [10**4300]),
    (int, 10**4300),
    (Any, -(10**4300)),
]
#: The most they read back.
READABLE: list[tuple[Any, Any]] = [
    (dict[str, Any], {"deep": _nested(199)}),
    (list[Any], [_nested(199)]),
    (Any, _nested(200)),
    (dict[str, Any], {"n": 10**4300 - 1}),
    (int, 10**4300 - 1),
    (Any, -(10**4300) + 1),
]


@pytest.mark.parametrize(("declared", "wrong"), UNREADABLE, ids=range(len(UNREADABLE)))
def test_a_result_a_replay_cannot_parse_is_stored_and_refused_at_once(
    settler: Settler, declared: Any, wrong: Any
) -> None:
    """A first call whose result (of its declared type, even ``Any``, ``dict[str, Any]``
    or ``list``, whose checks are skipped) a replay cannot read back raises what its replays
    raise; it used to return the value, and every retry then raised ``InvalidInput``."""
    runs: list[str] = []

    @settler.operation(key="deep:{order}", principal=P, result_type=declared)
    def deep(order: str) -> Any:
        runs.append(order)
        return wrong

    with pytest.raises(InvalidInput, match="does not validate into") as first:
        deep("o1")
    assert first.value.operation_id == "deep:o1"
    record = settler.get("deep:o1")
    assert record is not None
    assert record.state is State.COMPLETED  # stored: a retry does not run it again
    with pytest.raises(InvalidInput) as replay:
        deep("o1")
    assert str(replay.value) == str(first.value)
    assert runs == ["o1"]


@pytest.mark.parametrize(("declared", "value"), READABLE, ids=range(len(READABLE)))
def test_a_result_at_the_most_a_replay_parses_is_returned_and_replayed(
    settler: Settler, declared: Any, value: Any
) -> None:
    @settler.operation(key="deep:{order}", principal=P, result_type=declared)
    def deep(order: str) -> Any:
        return value

    assert deep("o1") == value
    assert deep("o1") == value  # the replay
