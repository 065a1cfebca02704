"""settle/_core/layout.py: every value the scripts can store comes back exactly, whatever
its bytes (digests, words, numbers, text that merely looks like hex), and the common values
take the few bytes the memory target relies on."""

from __future__ import annotations

import hashlib
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import settle
from settle import SettleConfig
from settle._core import reference
from settle._core.layout import (
    LOG_MAX,
    WORDS,
    Packed,
    arg_text,
    hexed,
    pack,
    stored_arg,
    stored_digest,
    unpack,
)

TEXT = st.one_of(
    st.binary(max_size=80),
    st.sampled_from([*WORDS, b"", b"0", b"00", b"abc", b"ABC", b"-1", b"0f" * 16]),
    st.text("0123456789abcdef", max_size=70).map(str.encode),
)
TIME = st.integers(0, 2**50)


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


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"\x01",
        b"\x02",
        b"\x02\xd9",
        b"\x02\xc0\xc0\xc3",
        b"\x02\xc0\xc0\xc0\xc0\xc0\xc0\x7f\xc0",
    ],
)
def test_anything_else_is_refused(blob: bytes) -> None:
    with pytest.raises(ValueError, match=r"settle value|truncated|unknown word"):  # corrupt
        unpack(blob)


def test_digests_ids_numbers_and_words_are_packed() -> None:
    created = 1_796_244_273_792
    aid, gen = b"0f" * 16, b"1796244273792574"
    record = {
        b"fp": b"ab" * 32,
        b"fpv": b"1",
        b"bind": b"user-1",
        b"gen": gen,
        b"ver": b"2",
        b"state": b"completed",
        b"n": b"1",
        b"created": b"%d" % created,
        b"updated": b"%d" % (created + 40),
        b"aid": aid,
        b"result": b"x" * 40,
        b"rdig": b"cd" * 32,
    }
    log = [
        b"|".join([aid, gen, b"reserve", b"reserved", b"new", b"%d" % created]),
        b"|".join([aid, gen, b"complete", b"accepted", b"", b"%d" % (created + 40)]),
    ]
    blob = pack(Packed(record, created + 40 + 86_400_000, log, created + 40 + 86_400_000))
    # digests and the attempt id as their bytes, words and small deltas as one byte each
    assert len(blob) <= 182  # 187 with the byte-wise tokens before it
    assert b"x" * 40 in blob  # a result is kept as is
    assert bytes.fromhex("ab" * 32) in blob
    assert unpack(blob) == Packed(record, created + 40 + 86_400_000, log, created + 40 + 86_400_000)


def test_the_scripts_and_layout_py_agree_on_the_largest_log() -> None:
    lua = (Path(settle.__file__).parent / "lua" / "_lib.lua").read_text(encoding="utf-8")
    assert f"local LOG_MAX = {LOG_MAX}\n" in lua
    assert SettleConfig.model_fields["attempt_log_size"].metadata[-1].le == LOG_MAX


@given(st.one_of(st.text(max_size=70), st.text("0123456789abcdefABCDEF", max_size=70)))
def test_an_argument_in_stored_form_stands_for_its_text_and_stores_as_hexed(text: str) -> None:
    """The client sends fingerprints, attempt ids and digests as the scripts store them, so
    no script converts hex: what ``arg_stored`` makes of the argument is ``hexed`` of the
    text, and ``arg_text`` gives the text back (quarantine entries hold it)."""
    if text.startswith("\0"):  # no such argument exists (checked): it would be ambiguous
        with pytest.raises(ValueError, match="NUL"):
            stored_arg(text)
        return
    sent = stored_arg(text)
    wire = sent if isinstance(sent, bytes) else sent.encode()
    assert arg_text(wire) == text.encode()
    as_lua = wire[1:] if wire[:1] == b"\0" else [wire]  # the Lua's arg_stored
    assert as_lua == hexed(text.encode())


@given(st.binary(max_size=200))
def test_a_payload_digest_is_sent_as_the_stored_form_of_its_hex_digest(data: bytes) -> None:
    """A settlement sends its payload's SHA-256 from the digest's bytes: the same argument
    as ``stored_arg`` of the hex digest the record keeps."""
    assert stored_digest(data) == stored_arg(hashlib.sha256(data).hexdigest())


def _pending(created: int, bind: bytes) -> dict[bytes, bytes]:
    """A pending record as reserve stores it."""
    return {
        b"fp": b"ab" * 32,
        b"fpv": b"1",
        b"bind": bind,
        b"gen": b"7",
        b"ver": b"1",
        b"state": b"pending",
        b"n": b"1",
        b"created": b"%d" % created,
        b"updated": b"%d" % created,
        b"lease": b"%d" % (created + 30_000),
        b"aid": b"0f" * 16,
    }


def test_a_value_loaded_twice_is_two_records_whatever_the_first_script_changed() -> None:
    """The reference model remembers what a stored value decodes to (the model checker loads
    the same few values again and again), yet each load is the script's own copy: a script
    that changes the record or log it loaded and then writes nothing (a refusal) leaves the
    next load of that value as stored."""
    created = 1_796_244_273_792
    record = _pending(created, b"user-1")
    log = [b"|".join([b"0f" * 16, b"7", b"reserve", b"reserved", b"new", b"%d" % created])]
    keyspace = reference.MemoryKeyspace(lambda: created)
    key = "{settle:t}:op:order-1"
    keyspace.set(key, created, pack(Packed(dict(record), None, list(log), None)))
    for lazy in (False, True):
        first, st = reference.load_record(keyspace, key, None, created + 1, lazy=lazy)
        assert isinstance(first, dict)
        first[b"state"] = b"completed"
        first.pop(b"lease")
        if st.log is None:
            reference.load_log(st)
        assert st.log is not None
        st.log.append(b"changed")
        again, st2 = reference.load_record(keyspace, key, None, created + 1)
        assert again == {**record, b"op": b"order-1"}
        assert st2.log == log


def test_a_value_loaded_record_then_log_is_remembered_once() -> None:
    """A script loads a value's record, then its attempt log (at once, or lazily when it
    needs it): the reference model remembers the value once, not once for each. It held two
    entries a value (the record alone, then record and log, each decoded from the start), so
    its 1024 remembered values were 512 (half the model checker's values decoded again)."""
    created = 1_796_244_273_792
    log = [b"|".join([b"0f" * 16, b"7", b"reserve", b"reserved", b"new", b"%d" % created])]
    keyspace = reference.MemoryKeyspace(lambda: created)
    keys = ["{settle:t}:op:order-1", "{settle:t}:op:order-2"]
    for key in keys:
        record = _pending(created, key[-7:].encode())
        keyspace.set(key, created, pack(Packed(record, None, list(log), None)))
    reference._unpacked.cache_clear()
    try:
        for key, lazy in zip(keys, (False, True), strict=True):
            for _ in range(2):
                rec, st = reference.load_record(keyspace, key, None, created + 1, lazy=lazy)
                assert isinstance(rec, dict)
                assert reference.load_log(st)
                assert st.log == log
        info = reference._unpacked.cache_info()
        assert (info.currsize, info.misses) == (2, 2), info
    finally:
        reference._unpacked.cache_clear()


def test_a_remembered_value_is_decoded_once_however_often_its_log_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The model checker reads the same few values again and again: each is decoded once
    for its record and once for its log, then served from memory. The branch's one entry a
    value kept its count of entries with the log decoded again on every read (a mutant):
    the speed the cache exists for, lost for every script that reads a log."""
    created = 1_796_244_273_792
    log = [b"|".join([b"0f" * 16, b"7", b"reserve", b"reserved", b"new", b"%d" % created])]
    keyspace = reference.MemoryKeyspace(lambda: created)
    key = "{settle:t}:op:order-1"
    keyspace.set(key, created, pack(Packed(_pending(created, b"user-1"), None, list(log), None)))
    decoded: list[bool] = []
    unpack = reference.layout.unpack

    def counted(blob: bytes, log: bool = True) -> Packed:
        decoded.append(log)
        return unpack(blob, log=log)

    monkeypatch.setattr(reference.layout, "unpack", counted)
    reference._unpacked.cache_clear()
    try:
        for lazy in (False, True, False, True):
            rec, st = reference.load_record(keyspace, key, None, created + 1, lazy=lazy)
            assert isinstance(rec, dict)
            assert reference.load_log(st)
            assert st.log == log
    finally:
        reference._unpacked.cache_clear()
    assert sorted(decoded) == [False, True], decoded


def test_a_log_that_does_not_decode_leaves_the_record_readable() -> None:
    """A value whose attempt log does not decode: its record is read (a lazy load, as
    ``get`` makes), its log refused (ValueError: nothing may be written), every time: what
    the model remembers of the value is the record, not the refusal."""
    created = 1_796_244_273_792
    good = pack(Packed(_pending(created, b"user-1"), None, [], None))
    # One log entry of six values whose time is missing (nil): the Lua refuses the log.
    entry = b"\xc0" * 6
    blob = good + entry
    keyspace = reference.MemoryKeyspace(lambda: created)
    key = "{settle:t}:op:order-1"
    keyspace.set(key, created, blob)
    reference._unpacked.cache_clear()
    try:
        for _ in range(2):
            rec, st = reference.load_record(keyspace, key, None, created + 1, lazy=True)
            assert isinstance(rec, dict)
            assert not reference.load_log(st)
    finally:
        reference._unpacked.cache_clear()


def test_the_remembered_values_of_a_memory_settler_stay_a_few_megabytes() -> None:
    """The decoded values the reference model remembers are process-wide, kept after every
    MemorySettler is gone: with attempt logs as long as ``attempt_log_size`` allows, packed as
    tight as they pack (one attempt retrying), they stay under 12 MB (values of 4 KiB kept 75)."""
    created = 1_796_244_273_792
    entry = [b"0f" * 16, b"7", b"reserve", b"reserved", b"new"]

    def value(i: int, n: int) -> bytes:
        record = _pending(created, b"u%04d" % i)
        log = [b"|".join([*entry, b"%d" % (created + j)]) for j in range(n)]
        return pack(Packed(record, None, log, None))

    values = [value(i, 660 if i % 4 == 0 else 71) for i in range(reference._REMEMBERED)]
    reference._unpacked.cache_clear()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for blob in values:
            reference._unpack(blob)
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        reference._unpacked.cache_clear()
    assert kept < 12_000_000
