"""The fingerprint and the attempt id are checked as they are converted to the bytes the
scripts store (``layout.hex_arg``): the texts next to the valid ones (a hex fingerprint of
another length, a hex attempt id past 64 characters, blanks ``bytes.fromhex`` skips, a str
whose own ``==`` says yes) are refused, or stored as the text they are, on every entry point:
reserve and the four settlements, on Redis and on the in-memory model."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from settle import Settler
from settle._core.layout import unpack
from settle.errors import InvalidInput

WHO = "tenant:acme"


class _Lenient(str):
    """A str whose ``==`` ignores case (as case-insensitive str types do)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and self.lower() == other.lower()

    __hash__ = str.__hash__


_NEAR_HEX: list[dict[str, Any]] = [
    {"fingerprint": "ab" * 31},
    {"fingerprint": "ab" * 33},
    {"fingerprint": "ab" * 31 + "  "},
    {"fingerprint": " " + "ab" * 31 + "a"},
    {"fingerprint": "AB" * 32},
    {"fingerprint": _Lenient("AB" * 32)},
    {"attempt_id": ""},
    {"attempt_id": "ab" * 33},
    {"attempt_id": "ab cd"},
]


@pytest.mark.parametrize("given", _NEAR_HEX, ids=repr)
def test_reserve_refuses_a_fingerprint_or_attempt_id_next_to_a_valid_one(
    settler: Settler, redis_client: redis.Redis, namespace: str, given: dict[str, Any]
) -> None:
    """A hex fingerprint of 62 or 66 digits was refused by ``[0-9a-f]{64}`` and a hex attempt
    id of 66 characters by the attempt id's pattern: they must not reach the scripts."""
    with pytest.raises(InvalidInput):
        settler.reserve("op", {"a": 1}, principal=WHO, **given)
    assert set(redis_client.scan_iter(match=f"settle:{{{namespace}:*")) == set()


@pytest.mark.parametrize("given", _NEAR_HEX, ids=repr)
def test_every_settlement_refuses_a_hand_built_reservation_next_to_a_valid_one(
    any_settler: Settler, given: dict[str, Any]
) -> None:
    s = any_settler
    r = s.reserve("op", {"a": 1}, principal=WHO).reservation
    before = s.get("op"), s.attempts("op")
    bad = r.model_copy(update=given)
    for call in (
        lambda: s.complete(bad, {"n": 1}),
        lambda: s.fail(bad, ValueError("declined")),
        lambda: s.renew(bad),
        lambda: s.mark_provisional(bad, reason="timeout"),
    ):
        with pytest.raises(InvalidInput):
            call()
    assert (s.get("op"), s.attempts("op")) == before


@pytest.mark.parametrize("attempt_id", ["AB", _Lenient("AB"), "ab" * 32, "a" * 64])
def test_an_attempt_id_is_stored_as_the_text_it_is(any_settler: Settler, attempt_id: str) -> None:
    """Only an even number of lowercase hex digits is stored as the bytes they spell; any
    other attempt id (``'AB'``, also in a str whose ``==`` ignores case) reads back as given."""
    s = any_settler
    r = s.reserve("op", {"a": 1}, principal=WHO, attempt_id=attempt_id).reservation
    s.complete(r, {"n": 1})
    assert [a.attempt_id for a in s.attempts("op")] == [str.__str__(attempt_id)] * 2


def test_a_drawn_attempt_id_is_stored_as_the_bytes_its_hex_spells(
    settler: Settler, redis_client: redis.Redis
) -> None:
    """The attempt id settle draws is sent as its 16 bytes (``stored_arg`` of its hex), as
    one given by the caller is: the record holds 16 bytes, not the 32 characters, and
    reads back as the hex."""
    r = settler.reserve("op", {"a": 1}, principal=WHO).reservation
    blob = redis_client.get(settler._core.keys.record("op"))
    assert isinstance(blob, bytes)
    assert bytes.fromhex(r.attempt_id) in blob
    assert r.attempt_id.encode() not in blob
    record = unpack(blob).record
    assert record is not None
    assert record[b"aid"] == r.attempt_id.encode()
