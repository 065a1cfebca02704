"""``value()`` of a record or a replay (SPEC §2 "Replay (the stored result)", §11): the
stored result as the caller asks for it, or settle's typed error naming the operation.

Found by the core's acceptance hunt: a result completed as bytes (stored as they are) could
not be read back with ``value(bytes)`` (pydantic parsed the bytes as JSON and raised its own
``ValidationError``), and ``value()`` of a failed or pending record raised a bare
``ValueError``, outside the ``SettleError`` root.
"""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from pydantic import BaseModel, ValidationError

from settle import Replay, SettleError
from settle.errors import InvalidInput

WHO = "tenant:acme"
PNG = b"\x89PNG\r\n\x1a\n\x00\xff"


class Receipt(BaseModel):
    charge_id: str


@pytest.mark.asyncio
@pytest.mark.parametrize("stored", [PNG, b"hello", b"", b'"quoted"', b"123"])
async def test_a_result_completed_as_bytes_reads_back_as_those_bytes(
    api: Any, stored: bytes
) -> None:
    r = (await api.reserve("op-bytes", {"n": 1}, principal=WHO)).reservation
    await api.complete(r, stored)
    replay = await api.reserve("op-bytes", {"n": 1}, principal=WHO)
    assert isinstance(replay, Replay)
    assert replay.value(bytes) == stored
    assert (await api.get("op-bytes")).value(bytes) == stored


@pytest.mark.asyncio
async def test_value_of_a_failed_operation_is_a_settle_error_pointing_at_the_failure(
    api: Any,
) -> None:
    r = (await api.reserve("op-failed", {"n": 1}, principal=WHO)).reservation
    await api.fail(r, ValueError("card declined"))
    replay = await api.reserve("op-failed", {"n": 1}, principal=WHO)
    with pytest.raises(InvalidInput, match=r"'op-failed' is failed.*\.failure") as raised:
        replay.value()
    assert raised.value.operation_id == "op-failed"
    assert replay.failure is not None
    assert replay.failure.message == "card declined"


@pytest.mark.asyncio
async def test_value_of_an_unsettled_operation_is_a_settle_error(api: Any) -> None:
    r = (await api.reserve("op-open", {"n": 1}, principal=WHO)).reservation
    with pytest.raises(InvalidInput, match=r"'op-open' is pending, not completed") as raised:
        (await api.get("op-open")).value()
    assert raised.value.operation_id == "op-open"
    await api.mark_provisional(r, reason="timeout")
    with pytest.raises(SettleError, match=r"'op-open' is provisional, not completed"):
        (await api.get("op-open")).value(Receipt)


@pytest.mark.asyncio
async def test_a_result_that_does_not_fit_the_type_is_a_settle_error_naming_it(
    api: Any,
) -> None:
    r = (await api.reserve("op-typed", {"n": 1}, principal=WHO)).reservation
    await api.complete(r, {"charge": "ch_1"})
    record = await api.get("op-typed")
    assert record.value() == {"charge": "ch_1"}
    with pytest.raises(InvalidInput, match="'op-typed' does not validate into") as raised:
        record.value(Receipt)
    assert raised.value.operation_id == "op-typed"
    assert isinstance(raised.value.__cause__, ValidationError)
    assert isinstance(raised.value, ValueError)  # as pydantic's ValidationError was


@pytest.mark.asyncio
async def test_a_type_expression_that_cannot_be_hashed_reads_the_result_too(api: Any) -> None:
    """A type no cache can key (``Annotated`` with a list among its metadata) is read as
    any other, not refused with the ``TypeError`` of its hash."""
    r = (await api.reserve("op-unhashable", {"n": 1}, principal=WHO)).reservation
    await api.complete(r, {"charge_id": "ch_1"})
    open_ = Annotated[dict[str, Any], ["a note"]]
    model = Annotated[Receipt, ["a note"]]
    with pytest.raises(TypeError):
        hash(open_)
    record = await api.get("op-unhashable")
    assert record.value(open_) == {"charge_id": "ch_1"}
    assert record.value(model) == Receipt(charge_id="ch_1")
    replay = await api.reserve("op-unhashable", {"n": 1}, principal=WHO)
    assert isinstance(replay, Replay)
    assert replay.value(open_) == {"charge_id": "ch_1"}
