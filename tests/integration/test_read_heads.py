"""The read fast paths (``lua/_head.lua``, ``get_head.lua``, ``reserve_head.lua``) answer only
what the whole script would answer, and write nothing.

Each stored value below, written by settle or crafted byte by byte (odd forms the head must
leave alone: the previous layout, a fingerprint or attempt id kept as text, a reason word,
floats, wrong types, expired parts, truncation), is read on a real server three ways: by the
head alone (a script that ends where the head falls through), by the script settle runs (head
then the whole script) and by the whole script without its head. Where the head answers, its
reply is the whole script's, and the value is left as it was; the cases settle's own calls
hit most (a replay, a get of a live record) must be answered by the head. (A reserve of a
provisional record or an ended lease is a takeover, which the head writes:
test_write_heads.py holds those writes to the whole script's.)
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from settle import Settler
from settle._core import codec
from settle._core.layout import MAGIC, WORDS, _mp
from settle._core.scripts import SCRIPTS
from settle._runtime.scripts import ScriptSet
from settle.errors import CorruptRecord

WHO = "tenant:acme"
REQ = {"order": 7}
FELL_THROUGH = b"head fell through"

WHOLE = ScriptSet("settle", SCRIPTS.scripts, writing=SCRIPTS.writing, read_only=SCRIPTS.read_only)


def _head_only(name: str) -> str:
    """The script settle runs, cut where its head falls through."""
    source = SCRIPTS.source(name)
    whole = WHOLE.source(name)
    prelude_and_head = source[: len(source) - len(whole) + whole.index("\n-- _lib.lua: ")]
    assert prelude_and_head.startswith(whole[: whole.index("\n-- _lib.lua: ")].split("\n")[0])
    return prelude_and_head + f"\nreturn '{FELL_THROUGH.decode()}'\n"


def _word(w: bytes) -> int:
    return WORDS.index(w) + 1


def _value(*tokens: Any) -> bytes:
    return MAGIC + b"".join(t if isinstance(t, _Raw) else _mp(t) for t in tokens)


class _Raw(bytes):
    """Bytes put into a crafted value as they are (a float, a map: what _mp never writes)."""


def _float(x: float) -> _Raw:
    return _Raw(b"\xcb" + struct.pack(">d", x))


@pytest.fixture
def settler(redis_url: str, namespace: str) -> Iterator[Settler]:
    s = Settler.from_url(redis_url, namespace=namespace, shards=1)
    yield s
    s.close()


def _record(fp: Any, *, state: Any = 3, created: Any = None, **over: Any) -> bytes:
    """A packed value with a record (field order of _lib.lua) and a one-entry log, created
    a second ago unless ``created`` says otherwise."""
    if created is None:
        created = int(time.time() * 1000) - 1000
    fields: dict[str, Any] = {
        "fp": fp,
        "fpv": 1,
        "bind": WHO.encode(),
        "gen": 1_796_000_000_000_001,
        "ver": 2,
        "state": state,
        "n": 1,
        "created": created,
        "updated": 5,
        "lease": None,
        "aid": bytes.fromhex("0f" * 16),
        "reason": None,
        "result": b'{"ok":true}',
        "rdig": bytes.fromhex("ab" * 32),
        "rexp": 86_400_000,
        "lexp": 86_400_010,
    }
    fields.update(over)
    log = [None, None, _word(b"reserve"), _word(b"reserved"), _word(b"new"), 0]
    return _value(*fields.values(), *log)


def _cases(settler: Settler) -> dict[str, Callable[[], None] | bytes]:
    """Case name -> a crafted value, or a function that makes it through settle."""
    sent = settler._core.plan_reserve("x", REQ, principal=WHO).args[1]
    assert isinstance(sent, bytes)
    assert sent[:1] == b"\0"  # the fingerprint in stored form
    fp = sent[1:]

    def through_settle(*steps: str) -> Callable[[], None]:
        def make() -> None:
            got = settler.reserve("op", REQ, principal=WHO)
            r = got.reservation  # type: ignore[union-attr]
            for step in steps:
                if step == "complete":
                    settler.complete(r, {"charge": "ch_1"})
                elif step == "fail":
                    settler.fail(r, ValueError("declined"))
                elif step == "provisional":
                    settler.mark_provisional(r, "timeout: no answer")
                elif step == "provisional-word":
                    settler.mark_provisional(r, "lease_expired")

        return make

    def text_attempt() -> None:
        got = settler.reserve("op", REQ, principal=WHO, attempt_id="attempt-1")
        settler.complete(got.reservation, {"charge": "ch_1"})  # type: ignore[union-attr]

    return {
        "completed": through_settle("complete"),
        "failed": through_settle("fail"),
        "pending": through_settle(),
        "provisional": through_settle("provisional"),
        "provisional with a word for a reason": through_settle("provisional-word"),
        "attempt id kept as text": text_attempt,
        "crafted completed": _record(fp),
        "fingerprint kept as text": _record([b"not-hex"]),
        "a short fingerprint": _record(fp[:16]),
        "record expired, log alive": _record(fp, created=1_000, rexp=1),
        "no expiry": _record(fp, rexp=None, lexp=None),
        "state out of range": _record(fp, state=9),
        "state as text": _record(fp, state=b"completed"),
        "a float for created": _record(fp, created=_float(time.time() * 1000 + 0.5)),
        "a whole float for created": _record(fp, created=_float(float(int(time.time() * 1000)))),
        "a text reason": _record(fp, state=2, reason=b"timeout"),
        "text for a number": _record(fp, ver=b"2"),
        "pending without a lease": _record(fp, state=1),
        "pending with a lease": _record(fp, state=1, lease=30_000),
        "a bind that is a number": _record(fp, bind=7),
        "a reason word": _record(fp, state=2, reason=_word(b"lease_expired")),
        "a log entry short": _record(fp)[:-1],
        "only a log": _value(None, 86_400_010, None, None, 5, 10, 13, 0),
        "another magic": b"\x03" + _record(fp)[1:],
        "not msgpack": MAGIC + b"\xc1\xc1",
        "empty": b"",
        "a map inside": _value(_Raw(b"\x81\xa1a\x01"), *([None] * 15)),
        # Numbers a double holds but int64 does not: the whole script's %d writes them all
        # alike, so a head that added them itself would answer otherwise.
        "an expiry of 1e300": _record(fp, rexp=_float(1e300)),
        "an expiry past 2^63": _record(fp, rexp=2**63 - 1),
        "created past 2^63": _record(fp, created=_float(2.0**63), updated=-(2**62), rexp=None),
        # Sums past 2^53: unrel_int calls the record corrupt.
        "a lease end past 2^53": _record(fp, state=1, lease=2**53 - 1),
        "updated past 2^53": _record(fp, updated=2**53 - 1, rexp=None),
        # A number at the edges of what whole() takes (a double exact: above -2^53, below
        # 2^53, no fraction, not NaN or an infinity) and the optional text fields in another
        # type: the whole script calls the record corrupt, so a head must leave it alone.
        "a generation of -2^53": _record(fp, gen=-(2**53)),
        "a generation of 2^53": _record(fp, gen=2**53),
        "a generation of -2^53 + 1": _record(fp, gen=-(2**53) + 1),
        "a generation of 2^53 - 1": _record(fp, gen=2**53 - 1),
        "a version of -0.5": _record(fp, ver=_float(-0.5)),
        "a version that is NaN": _record(fp, ver=_float(float("nan"))),
        "a version of -infinity": _record(fp, ver=_float(float("-inf"))),
        "a result that is a number": _record(fp, result=5),
        "a result digest that is a number": _record(fp, rdig=5),
        "an attempt id that is a number": _record(fp, aid=5),
    }


def _store(client: redis.Redis, key: str, case: Callable[[], None] | bytes) -> None:
    if isinstance(case, bytes):
        client.set(key, case)
    else:
        case()


def _load_libraries(client: redis.Redis) -> bool:
    """Load both FUNCTION libraries (with and without heads) where the server has
    functions; False on Redis 6.2."""
    if int(client.info("server")["redis_version"].split(".")[0]) < 7:
        return False
    for library in (SCRIPTS, WHOLE):
        try:
            client.function_load(library.library)
        except redis.ResponseError as exc:
            if "already exists" not in str(exc):
                raise
    return True


def _plan(settler: Settler, script: str) -> Any:
    """settle's call of ``script`` (get or reserve) for the operation "op"."""
    if script == "get":
        return settler._core.plan_get("op")
    return settler._core.plan_reserve("op", REQ, principal=WHO)


def _three_ways(client: redis.Redis, script: str) -> tuple[Any, Any, Any]:
    """The head alone, the whole script without its head, and the script settle runs."""
    return (
        client.register_script(_head_only(script)),
        client.register_script(WHOLE.source(script)),
        client.register_script(SCRIPTS.source(script)),
    )


@pytest.mark.parametrize("script", ["get", "reserve"])
def test_a_head_answers_only_as_the_whole_script_would_and_writes_nothing(
    settler: Settler, redis_client: redis.Redis, script: str
) -> None:
    settler.check()  # claims the shard: a replay on an unclaimed shard is the whole script's
    key = settler._core.keys.record("op")
    head, whole, settled = _three_ways(redis_client, script)
    answered, taken_over = set(), set()
    functions = _load_libraries(redis_client)
    for name, case in _cases(settler).items():
        for other in redis_client.scan_iter(match=key.split("}")[0] + "}*"):
            if not other.endswith(b":gen"):
                redis_client.delete(other)
        _store(redis_client, key, case)
        call = _plan(settler, script)
        before = redis_client.get(key) if redis_client.type(key) == b"string" else None
        fast = head(keys=call.keys, args=call.args)
        if fast == FELL_THROUGH:
            continue
        if script == "reserve" and fast[0] == b"reserved":
            # a takeover of a provisional record or an ended lease: a write, which
            # test_write_heads.py holds to the whole script's (value, expiry, generation)
            taken_over.add(name)
            continue
        answered.add(name)
        assert redis_client.get(key) == before, name  # the head wrote nothing
        by_settle = settled(keys=call.keys, args=call.args)
        slow = whole(keys=call.keys, args=call.args)
        replies = [by_settle, slow]
        if functions:  # Redis 7+, Valkey: the FUNCTION library's head and whole script too
            n = len(call.keys)
            for library in (SCRIPTS, WHOLE):
                fcall = library.function(script)
                replies.append(redis_client.fcall(fcall, n, *call.keys, *call.args))
        assert redis_client.get(key) == before, name  # nor did the whole script here
        for reply in replies:
            assert reply[:2] + reply[3:] == fast[:2] + fast[3:], name  # [2] is the clock
    must = {"completed", "failed", "crafted completed", "no expiry"}
    must |= {"a generation of -2^53 + 1", "a generation of 2^53 - 1"}  # exact: the rules' too
    if script == "get":
        must |= {"pending", "provisional", "pending with a lease", "a text reason"}
    assert must <= answered
    never = {
        "fingerprint kept as text",
        "record expired, log alive",
        "state out of range",
        "state as text",
        "a float for created",
        "text for a number",
        "pending without a lease",
        "a bind that is a number",
        "a reason word",
        "a log entry short",
        "only a log",
        "another magic",
        "not msgpack",
        "empty",
        "a map inside",
        "attempt id kept as text",
        "provisional with a word for a reason",
        "an expiry of 1e300",
        "an expiry past 2^63",
        "created past 2^63",
        "a lease end past 2^53",
        "updated past 2^53",
        "a generation of -2^53",
        "a generation of 2^53",
        "a version of -0.5",
        "a version that is NaN",
        "a version of -infinity",
        "a result that is a number",
        "a result digest that is a number",
        "an attempt id that is a number",
    }
    if script == "reserve":  # a digest that is not 32 bytes is compared by the whole script
        never.add("a short fingerprint")
    assert not (answered | taken_over) & never, (answered | taken_over) & never
    assert taken_over <= {"pending", "provisional", "a text reason"}, taken_over


def test_a_replay_whose_caller_does_not_match_is_left_to_the_whole_script(
    settler: Settler, redis_client: redis.Redis
) -> None:
    """A changed request, another principal, another fingerprint version or another shard
    count: the head never answers them (reserve.lua does, with the rules' verdicts)."""
    got = settler.reserve("op", REQ, principal=WHO)
    settler.complete(got.reservation, {"charge": "ch_1"})  # type: ignore[union-attr]
    head = redis_client.register_script(_head_only("reserve"))
    base = settler._core.plan_reserve("op", REQ, principal=WHO)
    assert head(keys=base.keys, args=base.args) != FELL_THROUGH
    changed = {
        "request": settler._core.plan_reserve("op", {"order": 8}, principal=WHO).args,
        "principal": settler._core.plan_reserve("op", REQ, principal="tenant:other").args,
        "fingerprint version": [*base.args[:2], "2", *base.args[3:]],
        "shard count": [*base.args[:-2], "9", base.args[-1]],
    }
    for what, args in changed.items():
        assert head(keys=base.keys, args=args) == FELL_THROUGH, what


@pytest.mark.parametrize("number", [0, 1, 9, 10, 11, 99, 100, 2**53 - 1])
def test_a_records_small_and_large_numbers_read_back_as_stored(
    settler: Settler, redis_client: redis.Redis, number: int
) -> None:
    """A version, reservation count and fingerprint version read back as stored, by the head
    (get) and by the whole scripts (get_many, which has none): the prelude's int() writes a
    digit its own way and every other number with %d, so 9, 10 and the numbers around them
    are where the two could part."""
    redis_client.set(
        settler._core.keys.record("op"), _record(bytes(32), fpv=number, ver=number, n=number)
    )
    for got in (settler.get("op"), settler.get_many(["op"])[0]):
        assert got is not None
        assert (got.version, got.reservations, got.fingerprint_version) == (number,) * 3


@pytest.mark.parametrize("script", ["get", "reserve"])
def test_a_rows_numbers_are_replied_as_redis_integers(
    settler: Settler, redis_client: redis.Redis, script: str
) -> None:
    """The record row's numbers (fpv, gen, ver, n, created, updated, lease) are Redis integer
    replies, not decimal text, from the head, the script settle runs, the whole script and
    (Redis 7+, Valkey) both FUNCTION libraries: for a packed value at the edges of what a
    double holds exactly (2^53 - 1) and for a record of the previous layout (a HASH of text,
    which only the whole scripts read). Each is the integer stored, exactly."""
    settler.check()
    key = settler._core.keys.record("op")
    fp = settler._core.plan_reserve("x", REQ, principal=WHO).args[1][1:]  # type: ignore[index]
    now = int(time.time() * 1000)
    top = 2**53 - 1
    created = 2**53 - 10
    legacy = {
        "op": "op", "fp": bytes(fp).hex(), "fpv": "1", "bind": WHO, "gen": str(top),
        "ver": "12", "state": "completed", "n": "3", "created": str(now - 1000),
        "updated": str(now - 995), "aid": "0f" * 16, "result": '{"ok":true}', "rdig": "ab" * 32,
    }  # fmt: skip

    def previous_layout() -> None:
        redis_client.hset(key, mapping=legacy)

    cases: dict[str, tuple[Callable[[], None] | bytes, list[int | None]]] = {
        # fpv gen ver n created updated lease
        "pending": (
            _record(fp, state=1, lease=30_000, created=now - 1000, ver=9, n=10),
            [1, 1_796_000_000_000_001, 9, 10, now - 1000, now - 995, now + 29_005],
        ),
        "numbers at 2^53 - 1": (
            _record(fp, gen=top, ver=top, n=top, created=created, rexp=None, lexp=None),
            [1, top, top, top, created, created + 5, None],
        ),
        "previous layout": (
            previous_layout,
            [1, top, 12, 3, now - 1000, now - 995, None],
        ),
    }
    head, whole, settled = _three_ways(redis_client, script)
    functions = _load_libraries(redis_client)
    for name, (case, numbers) in cases.items():
        redis_client.delete(key)
        _store(redis_client, key, case)
        call = _plan(settler, script)
        replies = [settled(keys=call.keys, args=call.args), whole(keys=call.keys, args=call.args)]
        fast = head(keys=call.keys, args=call.args)
        if fast != FELL_THROUGH:
            replies.append(fast)
        if functions:
            for library in (SCRIPTS, WHOLE):
                fcall = library.function(script)
                replies.append(redis_client.fcall(fcall, len(call.keys), *call.keys, *call.args))
        for reply in replies:
            row = reply[4]
            assert len(row) == 15, (name, reply)
            got = [row[2], row[4], row[5], row[7], row[8], row[9], row[10]]
            assert [type(v) for v in got] == [type(v) for v in numbers], (name, got)
            assert got == numbers, name


@pytest.mark.parametrize(
    "fpv",
    [b"007", b"-0", b" 7", b"7 ", b"+7", b"0x10", b"7e2", b"inf", b"nan", b"9007199254740992"],
    ids=repr,
)
def test_a_hand_sent_fingerprint_version_is_replied_as_later_reads_decode_it(
    settler: Settler, redis_client: redis.Redis, fpv: bytes
) -> None:
    """A new record's fingerprint version is the caller's text, stored as sent (settle sends
    1). reserve's reply decodes to the record a later get reads, or both are CorruptRecord:
    decimal digits below 2^53 are replied as the integer they spell, anything else as the
    text, which the client refuses (the text reply took " 7", "+7" and 2^53, which no read
    after it decodes)."""
    settler.check()
    call = _plan(settler, "reserve")
    args = list(call.args)
    args[2] = fpv
    reply = redis_client.register_script(SCRIPTS.source("reserve"))(keys=call.keys, args=args)
    assert reply[0] == b"reserved"
    try:
        later: Any = settler.get("op")
    except CorruptRecord:
        later = CorruptRecord
    try:
        now: Any = codec.decode_record(reply[4], reply[2])
    except CorruptRecord:
        now = CorruptRecord
    assert now == later
