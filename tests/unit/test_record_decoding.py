"""What a script hands back is decoded on every call (settle/_core/codec.py): its text fields
strictly as UTF-8 (bytes that are not are a corrupt record or a foreign reply, a typed
error, never text read with replacement characters into an operation id or a binding),
and each record a model of its own (its set fields its own: ``model_copy(update=...)``
works on it and touches no other record). No Redis."""

from __future__ import annotations

from typing import Any

import pytest

from settle._core import codec
from settle.errors import CorruptRecord
from settle.models import OperationRecord

NOW = 1_764_707_000_123
NOT_UTF8 = b"\xff\xfe"


def _row() -> list[Any]:
    """A record row as the scripts reply with it (settle/_core/layout.py)."""
    return [
        b"op-1", bytes.fromhex("f" * 64), 1, b"tenant:acme", 3, 4, b"provisional",
        2, NOW, NOW + 5, None, bytes.fromhex("a" * 32), b"lease_expired", None, None,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("index", "field"),
    [(0, "operation_id"), (3, "binding"), (6, "state"), (12, "reason")],
)
def test_a_record_text_field_that_is_not_utf8_is_a_corrupt_record(index: int, field: str) -> None:
    row = _row()
    codec.decode_record(row, NOW)  # whole, it decodes
    row[index] = NOT_UTF8
    with pytest.raises(CorruptRecord, match="cannot be decoded"):
        codec.decode_record(row, NOW)


@pytest.mark.parametrize("index", [2, 4, 5, 7, 8, 9, 10])
@pytest.mark.parametrize("value", [b"7", "7", 7.0, 7.5, True, [7]], ids=repr)
def test_a_record_number_that_is_not_an_integer_reply_is_a_corrupt_record(
    index: int, value: Any
) -> None:
    """The scripts reply a row's numbers (fpv, gen, ver, n, created, updated, lease) as Redis
    integers: text, a float, a bool or a list there is not a row of theirs, and is refused
    with the typed error, never read as a number (``int()`` took ``b"7"``, ``7.5`` and
    ``True``)."""
    row = _row()
    codec.decode_record(row, NOW)  # whole, it decodes
    row[index] = value
    with pytest.raises(CorruptRecord, match="cannot be decoded"):
        codec.decode_record(row, NOW)


@pytest.mark.parametrize(
    ("index", "value"),
    [(0, NOT_UTF8), (1, NOT_UTF8), (3, NOT_UTF8), (5, b"two"), (6, b"yes")],
    ids=["code", "detail", "quarantine-id", "dropped", "repeated"],
)
def test_a_reply_that_cannot_be_decoded_is_a_corrupt_record(index: int, value: bytes) -> None:
    raw: list[Any] = [b"quarantined", b"conflicting_settlement", NOW, b"1-0", [], 0, 1]
    assert codec.parse_reply(list(raw)).code == "quarantined"  # whole, it parses
    raw[index] = value
    with pytest.raises(CorruptRecord, match="cannot be decoded"):
        codec.parse_reply(raw)


def test_each_decoded_record_has_fields_set_of_its_own() -> None:
    first, second = codec.decode_record(_row(), NOW), codec.decode_record(_row(), NOW)
    assert first.model_fields_set == set(OperationRecord.model_fields)
    assert first.model_fields_set is not second.model_fields_set
    later = first.model_copy(update={"version": 5})
    assert (later.version, first.version, second.version) == (5, 4, 4)
    assert second.model_fields_set == set(OperationRecord.model_fields)
