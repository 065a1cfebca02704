"""settle/_core/layout.py: every value the scripts can store comes back exactly, whatever
its bytes (digests, words, numbers, text that merely looks like hex), and the common values
take the few bytes the memory target relies on."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from settle._core.layout import WORDS, Packed, pack, token, unpack, untoken

TEXT = st.one_of(
    st.binary(max_size=80),
    st.sampled_from([*WORDS, b"", b"0", b"00", b"abc", b"ABC", b"-1", b"0f" * 16]),
    st.text("0123456789abcdef", max_size=70).map(str.encode),
)
TIME = st.integers(0, 2**50)


@given(TEXT, st.booleans())
def test_a_token_reads_back_as_the_value_it_was(value: bytes, plain: bool) -> None:
    assert untoken(token(value, plain) + b"rest", 0) == (value, len(token(value, plain)))


@st.composite
def packed(draw: st.DrawFn) -> Packed:
    record = None
    if draw(st.booleans()):
        created = draw(TIME)
        updated = created + draw(st.integers(-5, 10**9))
        record = {
            b"fp": draw(TEXT),
            b"fpv": b"1",
            b"bind": draw(TEXT),
            b"gen": b"%d" % draw(TIME),
            b"ver": b"%d" % draw(st.integers(1, 10**6)),
            b"state": draw(st.sampled_from(WORDS[:4])),
            b"n": b"%d" % draw(st.integers(1, 99)),
            b"created": b"%d" % created,
            b"updated": b"%d" % updated,
        }
        for name in (b"lease", b"aid", b"reason", b"result", b"rdig"):
            if draw(st.booleans()):
                record[name] = b"%d" % (updated + 30_000) if name == b"lease" else draw(TEXT)
    log = [
        b"|".join([aid, b"%d" % gen, action, verdict, detail, b"%d" % at])
        for aid, gen, action, verdict, detail, at in draw(
            st.lists(
                st.tuples(
                    st.sampled_from([b"", b"0f" * 16, b"my-attempt.1"]),
                    TIME,
                    st.sampled_from(WORDS),
                    st.sampled_from(WORDS),
                    st.sampled_from([*WORDS, b""]),
                    TIME,
                ),
                max_size=5,
            )
        )
    ]
    record_expires = draw(st.none() | TIME) if record is not None else None
    return Packed(record, record_expires, log, draw(TIME) if log else None)


@given(packed())
def test_a_value_reads_back_as_it_was_stored(value: Packed) -> None:
    assert unpack(pack(value)) == value


@pytest.mark.parametrize("blob", [b"", b"\x02", b"\x01\x83", b"\x01\x00\x00\x00\xfc\x7f"])
def test_anything_else_is_refused(blob: bytes) -> None:
    with pytest.raises(ValueError, match=r"settle value|truncated|unknown word"):  # corrupt
        unpack(blob)


def test_digests_ids_numbers_and_words_are_packed() -> None:
    assert len(token(b"ab" * 32)) == 34  # a SHA-256 hex digest: its 32 bytes and a header
    assert len(token(b"1796244273792574")) == 9  # a generation
    assert len(token(b"completed")) == 1
    assert token(b"x" * 40, plain=True) == b"\xa1\x01" + b"x" * 40  # a result is kept as is
