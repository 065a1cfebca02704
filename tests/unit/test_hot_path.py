"""The per-call shortcuts build exactly what the general paths build: models made without
``model_construct``, cached datetimes, and log events skipped only when they would be
dropped."""

from __future__ import annotations

import json
import logging
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
import structlog
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from redis.asyncio.connection import Connection as AsyncConnection
from redis.connection import Connection
from structlog.testing import capture_logs

from settle._core import codec
from settle._core.codec import AsJson, encode_result
from settle._core.engine import Core
from settle._log import STDLIB_LOGGER, enabled
from settle._runtime.packing import pack_command
from settle.config import SettleConfig
from settle.decorator._plan import (
    _parses_back,
    _parses_back_scalar,
    _replayed,
    _replays_as_is,
    _uuid4_hex,
)
from settle.models import (
    Action,
    InProgress,
    OperationRecord,
    Replay,
    Reserved,
    Settlement,
    State,
    Verdict,
    _once,
    _refuse_repeated_keys,
    _RepeatedKey,
    ms_to_datetime,
)

NOW = 1_764_707_000_123
FP = "f" * 64


def _row(state: bytes = b"pending", lease: int | None = 1764707030123) -> list[Any]:
    """A record row as the scripts reply with it: digests and the attempt id in their stored
    form, raw bytes (settle/_core/layout.py), the numbers Redis integers."""
    result = b'{"ok":true}' if state == b"completed" else None
    rdig = bytes.fromhex(codec.digest(result)) if result is not None else None
    return [
        b"op-1", bytes.fromhex(FP), 1, b"tenant:acme", 3, 4, state, 2, NOW, NOW + 5, lease,
        bytes.fromhex("a" * 32), None, result, rdig,
    ]  # fmt: skip


def _same(built: Any, general: Any) -> None:
    """Equal, and equal in every way a user can see: field order, set fields, repr, JSON."""
    assert built == general
    assert type(built) is type(general)
    assert list(built.__dict__) == list(type(built).model_fields)
    assert built.model_fields_set == general.model_fields_set
    assert repr(built) == repr(general)
    assert built.model_dump_json() == general.model_dump_json()
    assert built.__pydantic_extra__ is None
    assert built.__pydantic_private__ is None


def _record(row: list[Any], now_ms: int) -> OperationRecord:
    """The record as the general path builds it: full pydantic validation."""
    (op, fp, fpv, bind, gen, ver, state, n, created, updated, lease, aid, reason, result,
     rdig) = row  # fmt: skip
    effective = State(state.decode())
    expired = effective is State.PENDING and lease is not None and int(lease) <= now_ms
    return OperationRecord.model_validate(
        {
            "operation_id": op.decode(),
            "fingerprint": fp.hex(),
            "fingerprint_version": int(fpv),
            "binding": bind.decode(),
            "generation": int(gen),
            "version": int(ver),
            "state": State.PROVISIONAL if expired else effective,
            "reason": "lease_expired" if expired else reason,
            "lease_expires_at": ms_to_datetime(int(lease)) if lease is not None else None,
            "result": result,
            "result_digest": rdig.hex() if rdig is not None else None,
            "attempt_id": aid.hex(),
            "reservations": int(n),
            "created_at": datetime.fromtimestamp(int(created) / 1000, UTC),
            "updated_at": datetime.fromtimestamp(int(updated) / 1000, UTC),
        }
    )


@pytest.mark.parametrize(
    ("state", "lease", "now_ms"),
    [
        (b"pending", 1764707030123, NOW),
        (b"pending", 1764707030123, NOW + 60_000),  # L1: reads as provisional
        (b"completed", None, NOW),
    ],
)
def test_decoded_records_equal_validated_ones(state: bytes, lease: int | None, now_ms: int) -> None:
    row = _row(state, lease)
    _same(codec.decode_record(row, now_ms), _record(row, now_ms))


def test_decoded_records_accept_str_values() -> None:
    """Text fields may come as str (fp, aid and rdig stay in their stored form: bytes)."""
    stored = {1, 11, 14}
    row = [
        v.decode() if isinstance(v, bytes) and i not in stored else v for i, v in enumerate(_row())
    ]
    _same(codec.decode_record(row, NOW), _record(_row(), NOW))


@pytest.fixture
def core() -> Core:
    return Core(SettleConfig(namespace="hot"))


def _reply(code: bytes, detail: bytes, row: list[Any]) -> list[Any]:
    return [code, detail, str(NOW).encode(), b"", row]


def test_reserve_outcomes_equal_model_construct(core: Core) -> None:
    call = core.plan_reserve("op-1", {"a": 1}, principal="tenant:acme", attempt_id="a" * 32)
    record = codec.decode_record(_row(), NOW)

    reserved = core.decode_reserve(call, _reply(b"reserved", b"provisional", _row()))
    assert isinstance(reserved, Reserved)
    _same(reserved.reservation, reserved.reservation.model_validate(reserved.reservation))
    _same(
        reserved,
        Reserved.model_construct(
            reservation=reserved.reservation, record=record, takeover="provisional"
        ),
    )

    done = _row(b"completed", None)
    replay = core.decode_reserve(call, _reply(b"replay", b"", done))
    _same(replay, Replay.model_construct(record=codec.decode_record(done, NOW)))

    busy = core.decode_reserve(call, _reply(b"in_progress", b"", _row()))
    assert record.lease_expires_at is not None
    _same(
        busy,
        InProgress.model_construct(
            operation_id="op-1", generation=3, lease_expires_at=record.lease_expires_at,
            record=record,
        ),
    )  # fmt: skip


def test_settlements_equal_model_construct(core: Core) -> None:
    call = core.plan_reserve("op-1", {"a": 1}, principal="tenant:acme", attempt_id="a" * 32)
    reserved = core.decode_reserve(call, _reply(b"reserved", b"new", _row()))
    assert isinstance(reserved, Reserved)
    complete = core.plan_complete(reserved.reservation, {"ok": True})
    done = _row(b"completed", None)
    settlement = core.decode_settlement(complete, _reply(b"accepted", b"", done))
    _same(
        settlement,
        Settlement.model_construct(
            verdict=Verdict.ACCEPTED, action=Action.COMPLETE, operation_id="op-1",
            record=codec.decode_record(done, NOW), quarantine_id=None, kind=None,
            quarantine_repeated=False,
        ),
    )  # fmt: skip


@given(st.integers(min_value=0, max_value=253_402_300_799_999))  # up to 9999-12-31
def test_ms_to_datetime_is_exact(ms: int) -> None:
    expected = datetime.fromtimestamp(ms // 1000, tz=UTC) + timedelta(milliseconds=ms % 1000)
    assert ms_to_datetime(ms) == expected
    assert ms_to_datetime(ms).tzinfo is UTC


@pytest.mark.parametrize("ms", [253_402_300_800_000, -62_135_596_800_001, 10**20])
def test_ms_to_datetime_out_of_range_is_a_value_error(ms: int) -> None:
    """A time no datetime holds (a corrupt record) is a ValueError, which the decoders turn
    into ``CorruptRecord``, whatever form the milliseconds are handed to ``timedelta`` in."""
    ms_to_datetime.cache_clear()
    with pytest.raises(ValueError, match="out of range"):
        ms_to_datetime(ms)


@pytest.fixture
def stdlib_level() -> Iterator[logging.Logger]:
    """structlog unconfigured (settle's events go to the stdlib logger), restored after."""
    log = logging.getLogger(STDLIB_LOGGER)
    level = log.level
    configured, config = structlog.is_configured(), structlog.get_config()
    structlog.reset_defaults()
    yield log
    log.setLevel(level)
    if configured:
        structlog.configure(**config)


def test_events_are_skipped_only_when_the_stdlib_logger_would_drop_them(
    stdlib_level: logging.Logger,
) -> None:
    stdlib_level.setLevel(logging.WARNING)
    assert not enabled(logging.INFO)
    assert enabled(logging.WARNING)
    stdlib_level.setLevel(logging.INFO)
    assert enabled(logging.INFO)
    stdlib_level.setLevel(logging.WARNING)
    with capture_logs():  # a structlog configuration: its processors decide
        assert enabled(logging.INFO)


def test_skipped_events_are_the_dropped_ones(
    core: Core, stdlib_level: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    call = core.plan_reserve("op-1", {"a": 1}, principal="tenant:acme", attempt_id="a" * 32)
    reply = _reply(b"reserved", b"new", _row())
    with caplog.at_level(logging.WARNING, logger=STDLIB_LOGGER):
        core.decode_reserve(call, reply)
    assert not [r for r in caplog.records if r.name == STDLIB_LOGGER]
    with caplog.at_level(logging.INFO, logger=STDLIB_LOGGER):
        core.decode_reserve(call, reply)
    events = [getattr(r, "settle_event", None) for r in caplog.records if r.name == STDLIB_LOGGER]
    assert events == ["settle.reserve.reserved"]


def test_a_structlog_filtering_logger_skips_only_the_levels_it_drops(
    core: Core, stdlib_level: logging.Logger
) -> None:
    del stdlib_level  # restores the configuration
    call = core.plan_reserve("op-1", {"a": 1}, principal="tenant:acme", attempt_id="a" * 32)
    reply = _reply(b"reserved", b"new", _row())
    seen = {}
    for level in (logging.INFO, logging.WARNING):
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))
        assert enabled(logging.INFO) is (level == logging.INFO)
        assert enabled(logging.WARNING)
        with capture_logs() as logs:
            core.decode_reserve(call, reply)
        seen[level] = [e["event"] for e in logs]
    assert seen == {logging.INFO: ["settle.reserve.reserved"], logging.WARNING: []}
    structlog.configure(wrapper_class=structlog.stdlib.BoundLogger)
    assert enabled(logging.DEBUG)  # another wrapper class: its processors decide


ARG = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=40),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.binary(max_size=40).map(memoryview),
)


@given(st.lists(ARG, max_size=12))
def test_the_lanes_packing_sends_what_redis_py_would(args: list[Any]) -> None:
    """The lane packs a script call with hiredis directly: the same bytes as the
    connection's own ``pack_command``, and the same error for what it cannot send."""
    conn = Connection()
    command = ("EVALSHA", "0" * 40, 1, *args)
    assert pack_command(conn, command) == conn.pack_command(*command)
    for odd in (bytearray(b"x"), memoryview(b"abcdef")[::2]):  # converted by redis-py
        assert pack_command(conn, (*command, odd)) == conn.pack_command(*command, odd)
    for bad in (True, None, object()):
        with pytest.raises(redis.DataError):
            conn.pack_command(*command, bad)
        with pytest.raises(redis.DataError):
            pack_command(conn, (*command, bad))


def _wire(packed: list[Any]) -> bytes:
    """What goes on the socket: an asyncio connection may pack a command in several parts."""
    return b"".join(bytes(part) for part in packed)


@given(st.lists(ARG, max_size=12))
def test_the_async_lanes_packing_sends_what_redis_py_would(args: list[Any]) -> None:
    """An asyncio connection packs in Python through its encoder; where hiredis gives the
    same bytes (UTF-8, strict) the lane packs with hiredis. The same bytes on the wire, and
    the same error for what it cannot send, for redis-py's default encoder and two others."""
    for conn in (
        AsyncConnection(),
        AsyncConnection(encoding_errors="replace"),
        AsyncConnection(encoding="latin-1", encoding_errors="replace"),
    ):
        command = ("FCALL", "settle_0_core_reserve", 1, *args)
        assert _wire(pack_command(conn, command)) == _wire(conn.pack_command(*command))
        for odd in (bytearray(b"x"), memoryview(b"abcdef")[::2], "\u00e9\ud800"):
            try:
                expected: bytes | type[Exception] = _wire(conn.pack_command(*command, odd))
            except UnicodeEncodeError:
                expected = UnicodeEncodeError
            if expected is UnicodeEncodeError:
                with pytest.raises(UnicodeEncodeError):
                    pack_command(conn, (*command, odd))
            else:
                assert _wire(pack_command(conn, (*command, odd))) == expected
        for bad in (True, None, object()):
            with pytest.raises(redis.DataError):
                conn.pack_command(*command, bad)
            with pytest.raises(redis.DataError):
                pack_command(conn, (*command, bad))


def test_the_async_lane_packs_with_hiredis_only_for_utf8_strict_encoders() -> None:
    """Text goes as the connection's encoder would write it: UTF-8 by hiredis, latin-1 by
    the encoder itself."""
    text = "caf\u00e9"
    assert _wire(pack_command(AsyncConnection(), ("FCALL", text))) == (
        b"*2\r\n$5\r\nFCALL\r\n$5\r\ncaf\xc3\xa9\r\n"
    )
    assert _wire(pack_command(AsyncConnection(encoding="latin-1"), ("FCALL", text))) == (
        b"*2\r\n$5\r\nFCALL\r\n$4\r\ncaf\xe9\r\n"
    )


def test_an_integer_beyond_64_bits_is_packed_as_its_text_and_a_huge_one_raises() -> None:
    """hiredis crashes the process on an integer of over 4,300 digits (redis-py's own sync
    serializer with it): the lanes send an integer beyond 64 bits as its text, the bytes
    redis-py's Python packer sends, and one too long to write raises Python's ValueError,
    on either side of zero (the lower bound is its own constant)."""
    for conn in (Connection(), AsyncConnection()):
        for big in (2**63, -(2**63) - 1, 10**40, -(10**40)):
            command = ("FCALL", "f", 0, big, 7)
            assert _wire(pack_command(conn, command)) == _wire(
                AsyncConnection().pack_command(*command)
            )
        for huge in (10**5000, -(10**5000)):
            with pytest.raises(ValueError, match="digits"):
                pack_command(conn, ("FCALL", "f", 0, huge))


def test_a_decorated_calls_attempt_id_is_a_version_4_uuid() -> None:
    """Made from 16 random bytes without a UUID object: the shape uuid4().hex has."""
    made = {_uuid4_hex() for _ in range(200)}
    assert len(made) == 200
    for hexed in made:
        parsed = uuid.UUID(hexed)
        assert parsed.hex == hexed
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


results = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.binary(max_size=4).map(lambda b: b.hex().encode()),  # bytes that are UTF-8 text
    lambda children: (
        st.lists(children, max_size=3)
        | st.tuples(children, children)
        | st.dictionaries(st.text(max_size=4) | st.integers(), children, max_size=3)
    ),
    max_leaves=12,
)
DECLARED = [Any, dict, dict[str, Any], list, list[Any], str, int, float, bool, type(None)]


@given(value=results, declared=st.sampled_from(DECLARED))
def test_a_result_the_first_call_does_not_check_validates_into_its_type(
    value: Any, declared: Any
) -> None:
    """The first call skips the result check only where its JSON certainly validates
    into the declared type (as a replay reads it back); the check would have passed. Bytes
    are stored as JSON (a base64 string) as ``Plan._complete`` stores them for any type
    but ``bytes``: stored as they are, ``b""`` is no JSON (this test failed on it)."""
    if not _replays_as_is(declared, value):
        return
    data = encode_result(AsJson(value) if isinstance(value, bytes) else value, sys.maxsize, "op")
    if _parses_back_scalar(value) or _parses_back(data):
        _replayed(declared, data)


def test_a_container_declared_of_something_else_is_checked() -> None:
    assert _replays_as_is(dict[str, Any], {"a": 1})
    assert _replays_as_is(list, [1])
    for declared, value in [
        (dict[str, int], {"a": 1}),
        (dict[int, Any], {1: 1}),
        (list[int], [1]),
        (list[Any], (1,)),
        (dict[str, Any], [("a", 1)]),
        (list, {"a": 1}),
        (Any | None, 1),
    ]:
        assert not _replays_as_is(declared, value), (declared, value)


def _refused_by_json_loads(data: bytes | str) -> bool:
    """The repeated-key check as it was: ``json.loads`` with the hook."""
    try:
        json.loads(data, object_pairs_hook=_once)
    except _RepeatedKey:
        return True
    except ValueError:
        return False
    return False


def _named_twice(value: dict[str, int]) -> bytes:
    """``value`` as JSON with its first key named twice (as it is when empty)."""
    text = json.dumps(value)
    return (text if not value else text[:-1] + ", " + text[1:]).encode()


#: Stored results the repeated-key check must read as ``json.loads`` with the hook did, each
#: tried on every run (hypothesis may not draw every sampled one).
_JSON_EDGES: list[bytes | str] = [
    b'{"a":1,"a":2}',
    b'{"a":{"b":1,"b":1}}',
    b'[{"x":1},{"x":1,"y":2,"x":3}]',
    b'{"a":1}',
    b"\xef\xbb\xbf{}",
    "\ufeff{}",
    b"\xff\xfe{",
    b"{\x00",
    b"[",
    b"not json",
    b'{"a":NaN,"a":1}',
    '{"é":1,"é":2}',
    '{"é":1}'.encode("utf-16"),
    '{"k":1,"k":2}'.encode("utf-16-le"),
    '{"k":1,"k":2}'.encode("utf-32-le"),
    '["k"]'.encode("utf-16-be"),
    # JSON's whitespace before the first value, then a key named twice in it
    b' {"a":1,"a":2}',
    b'\r\n\t[{"x":1,"x":2}]',
    b" \n",
    b"\x0c{}",
    # only the first value is read: a key named twice after it is extra data
    b'{"a":1} {"a":1,"a":2}',
    b'{"a":1,"a":2} x',
]


@given(
    st.one_of(
        st.sampled_from(_JSON_EDGES),
        st.binary(max_size=40),
        st.binary(max_size=40).map(lambda b: b"{" + b),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=4).map(_named_twice),
    )
)
def test_the_repeated_key_check_refuses_what_json_loads_with_the_hook_refused(
    data: bytes | str,
) -> None:
    _check_refused_as_json_loads(data)


@pytest.mark.parametrize("data", _JSON_EDGES)
def test_the_repeated_key_check_refuses_each_edge_as_json_loads_with_the_hook_did(
    data: bytes | str,
) -> None:
    _check_refused_as_json_loads(data)


def _check_refused_as_json_loads(data: bytes | str) -> None:
    try:
        _refuse_repeated_keys(data)  # type: ignore[arg-type]  # str as well as bytes
        refused = False
    except ValidationError:
        refused = True
    assert refused is _refused_by_json_loads(data)


def test_a_call_holds_each_field_it_is_given_and_the_dataclass_defaults() -> None:
    """``Call``'s own ``__init__`` (each slot set through its descriptor) is the dataclass's:
    its parameters are the fields, in order, with their defaults; each value lands in its own
    field, by position and by keyword; the call stays frozen, equal and hashed by value."""
    import dataclasses  # noqa: PLC0415 - this test's alone
    import inspect  # noqa: PLC0415

    from settle._runtime.calls import Call  # noqa: PLC0415

    params = inspect.signature(Call).parameters
    declared = dataclasses.fields(Call)
    assert list(params) == [f.name for f in declared]
    for f in declared:
        default = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        assert params[f.name].default == default, f.name
    values = {f.name: object() for f in declared}
    by_keyword = Call(**values)
    by_position = Call(*values.values())
    for name, value in values.items():
        assert getattr(by_keyword, name) is value, name
        assert getattr(by_position, name) is value, name
    short = Call("reserve", ("k",), ("a", 1))
    assert {f.name: getattr(short, f.name) for f in declared} == {
        "script": "reserve",
        "keys": ("k",),
        "args": ("a", 1),
        **{f.name: f.default for f in declared[3:]},
    }
    assert short == Call("reserve", ("k",), ("a", 1)) != dataclasses.replace(short, args=())
    assert hash(short) == hash(Call("reserve", ("k",), ("a", 1)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        short.script = "complete"  # type: ignore[misc]


@pytest.mark.parametrize("maxlen", [None, 99])
def test_the_calls_carry_the_configs_values_the_core_read_once(maxlen: int | None) -> None:
    """The core reads the config's per-call values once (``__post_init__``): a reserve and
    a settlement still send each of them in its own place, and the result's bound is the
    config's."""
    from settle.errors import InvalidInput  # noqa: PLC0415 - this test's alone

    config = SettleConfig(
        namespace="cached",
        shards=3,
        attempt_log_size=17,
        quarantine_payload_bytes=1234,
        quarantine_maxlen=maxlen,
        max_result_bytes=70,
        lease=7,
        retention=11,
    )
    core = Core(config)
    reserve = core.plan_reserve("op", {"a": 1}, principal="p")
    assert reserve.args[4:6] == (7000, 11000)
    assert reserve.args[-3:] == (17, 3, "0")
    assert reserve.keys[-1].startswith("settle:{cached:")
    reserved = core.decode_reserve(reserve, _reply(b"reserved", b"new", _row()))
    assert isinstance(reserved, Reserved)
    reservation = reserved.reservation
    settle = core.plan_complete(reservation, {"ok": True})
    assert settle.args[-6:] == (11000, 17, 1234, "" if maxlen is None else maxlen, 3, "0")
    # each of the reservation's fields in its own place, in every settlement and a renewal
    r = reservation.model_copy(update={"generation": 5, "fingerprint_version": 2})
    for planned in (
        core.plan_complete(r, {"ok": True}),
        core.plan_fail(r, ValueError("no")),
        core.plan_mark_provisional(r, "unsure", expected_version=9),
    ):
        assert planned.args[0] == planned.operation_id == r.operation_id
        assert planned.args[2:5] == (2, r.binding, 5)
        assert planned.attempt_id == r.attempt_id
    renew = core.plan_renew(r)
    assert renew.args[1:4] == (2, r.binding, 5)
    assert renew.attempt_id == r.attempt_id
    assert renew.operation_id == r.operation_id
    with pytest.raises(InvalidInput):
        core.plan_complete(reservation, {"big": "x" * 70})


@pytest.mark.parametrize("public", [False, True])
def test_enabled_follows_structlog_as_its_public_functions_say(
    public: bool,
    stdlib_level: logging.Logger,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``enabled`` reads structlog's own configuration object (not a copy: a configuration
    made at any time counts at once) and answers as ``is_configured()`` and
    ``get_config()`` would; on a structlog without that object (``public``), it asks them."""
    import settle._log  # noqa: PLC0415 - this test's alone

    assert settle._log._STRUCTLOG is not None  # this structlog's: the per-call path
    if public:
        monkeypatch.setattr(settle._log, "_STRUCTLOG", None)
    stdlib_level.setLevel(logging.WARNING)
    assert not enabled(logging.INFO)  # unconfigured: the stdlib logger's level
    stdlib_level.setLevel(logging.INFO)
    assert enabled(logging.INFO)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    assert not enabled(logging.WARNING)
    assert enabled(logging.ERROR)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    assert enabled(logging.DEBUG)
    structlog.reset_defaults()
    stdlib_level.setLevel(logging.ERROR)
    assert not enabled(logging.INFO)  # unconfigured again
