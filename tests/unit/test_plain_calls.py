"""A reserve's and a settlement's script calls are marked ``plain``: the lane packs them with
hiredis without looking at each argument (the twenty-fifth round, docs/benchmarks.md).
What is sent must stay what the look would have sent, and a config number hiredis cannot
pack must still be looked at: hiredis crashes the process on an integer of over 4,300
digits, where the look makes its text and raises Python's ValueError."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio.connection import Connection as AsyncConnection
from redis.connection import Connection

from settle._core.engine import Core
from settle._runtime.calls import Call, packs_plain
from settle._runtime.packing import pack_command
from settle.config import SettleConfig
from settle.models import Reservation

PRINCIPAL = "svc"


def _reservation(core: Core) -> Reservation:
    """A reservation as reserve() would hand it out, of the call ``core`` plans."""
    call = core.plan_reserve("op-1", {"a": 1}, principal=PRINCIPAL)
    return Reservation.model_construct(
        operation_id="op-1",
        fingerprint="ab" * 32,
        fingerprint_version=1,
        binding=call.args[3],
        generation=2**53 - 1,
        attempt_id=call.attempt_id,
    )


def _calls(core: Core) -> list[Call]:
    reservation = _reservation(core)
    return [
        core.plan_reserve("op-1", {"a": 1}, principal=PRINCIPAL),
        core.plan_reserve("op-1", {"a": 1}, principal=PRINCIPAL, lease=86_400, attempt_id="a:1"),
        core.plan_reserve("op-1", None, principal=PRINCIPAL, fingerprint="0" * 64),
        core.plan_complete(reservation, {"ok": [1, 2.5, "x"]}),
        core.plan_complete(reservation, memoryview(b"abcdef")[::2], expected_version=2**53 - 1),
        core.plan_fail(reservation, ValueError("no")),
        core.plan_mark_provisional(reservation, "waiting"),
    ]


def test_a_reserves_and_a_settlements_calls_are_plain_and_packed_alike() -> None:
    for config in (
        SettleConfig(),
        SettleConfig(quarantine_payload_bytes=2**63 - 1, quarantine_maxlen=2**53),
    ):
        for call in _calls(Core(config)):
            assert call.plain, call.script
            assert packs_plain((*call.keys, *call.args)), call.script  # what the mark says
            command = ("EVALSHA", "0" * 40, len(call.keys), *call.keys, *call.args)
            for conn in (Connection(), AsyncConnection()):
                assert pack_command(conn, command, plain=True) == pack_command(conn, command)
                assert b"".join(map(bytes, pack_command(conn, command, plain=True))) == (
                    b"".join(map(bytes, conn.pack_command(*command)))
                )


@pytest.mark.parametrize("number", [2**63, -(2**63) - 1, 10**50])
def test_a_config_number_beyond_64_bits_leaves_the_calls_looked_at(number: int) -> None:
    config = SettleConfig(quarantine_payload_bytes=abs(number))
    assert not any(call.plain for call in _calls(Core(config)))
    assert packs_plain((2**63 - 1, -(2**63), "x", b"y", memoryview(b"z")[:0])) is False
    assert packs_plain((2**63 - 1, -(2**63), "x", b"y")) is True
    assert packs_plain((number,)) is False


_HUGE = """
import asyncio, os, sys
from settle import AsyncSettler, Reserved

async def main() -> None:
    settler = AsyncSettler.from_url(
        sys.argv[1], namespace="huge-" + os.urandom(4).hex(), quarantine_payload_bytes=10**4400
    )
    try:
        got = await settler.reserve("op-" + os.urandom(4).hex(), {"a": 1}, principal="svc")
        assert isinstance(got, Reserved)
        try:
            await settler.complete(got.reservation, {"ok": 1})
        except ValueError as exc:
            print("refused:", str(exc)[:40])
    finally:
        await settler.aclose()

asyncio.run(main())
"""


def test_a_config_number_hiredis_cannot_pack_is_refused_not_a_crash(redis_url: str) -> None:
    """An integer of over 4,300 digits in the config: each settlement refuses it with
    Python's ValueError (the look makes its text), as before the mark; marked plain, hiredis
    packed it and the process died of a segmentation fault."""
    assert "refused: Exceeds the limit (4300 digits)" in _survived(_HUGE, redis_url)


def _survived(script: str, redis_url: str) -> str:
    """What ``script`` printed, run in a process of its own (a crash in hiredis ends it)
    that must end well."""
    done: Any = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), redis_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return str(done.stdout)


# -- every argument of every plain call, over odd inputs -------------------------------------


class _MulInt(int):
    """An int whose arithmetic answers what it likes: ``lease * 1000`` is 10**5000."""

    def __mul__(self, other: object) -> Any:
        return 10**5000


class _MulFloat(float):
    def __mul__(self, other: object) -> Any:
        return 10**5000


class _ViewFloat(float):
    def __mul__(self, other: object) -> Any:
        return memoryview(b"abcdef")[::2]


class _RoundFloat(float):
    """``round(lease * 1000)`` of its own: a product of its own class rounds to 10**5000."""

    def __mul__(self, other: object) -> Any:
        return _RoundFloat(float(self) * 1000)

    def __round__(self, ndigits: object = None) -> Any:
        return 10**5000


class _Lying(int):
    """An int that is within every bound it is compared with, whatever it holds."""

    def __lt__(self, other: object) -> bool:
        return True

    def __le__(self, other: object) -> bool:
        return True

    def __gt__(self, other: object) -> bool:
        return True

    def __ge__(self, other: object) -> bool:
        return True


class _OddInt(int):
    def __index__(self) -> int:
        return 10**5000

    def __str__(self) -> str:
        return "x" * 5000

    __repr__ = __str__


class _OddStr(str):
    def __str__(self) -> str:
        return "other"


class _OddBytes(bytes):
    def __bytes__(self) -> bytes:
        return b"other"


_NUMBERS = st.one_of(
    st.integers(),
    st.floats(),
    st.booleans(),
    st.sampled_from(
        [
            None,
            2**63,
            -(2**63) - 1,
            10**5000,
            _MulInt(5),
            _MulFloat(30.0),
            _ViewFloat(30.0),
            _RoundFloat(30.0),
            _Lying(10**5000),
            _Lying(2**70),
            _OddInt(7),
            memoryview(b"12"),
            bytearray(b"12"),
            "12",
            _OddStr("12"),
        ]
    ),
)
_TEXTS = st.one_of(
    st.text(min_size=1, max_size=8),
    st.sampled_from(["op-1", _OddStr("op-1"), "a:1", _OddStr("a:1"), "ab" * 32]),
)
_RESULTS = st.one_of(
    st.binary(max_size=8),
    st.sampled_from(
        [
            memoryview(b"abcdef")[::2],
            memoryview(b"abcdef"),
            bytearray(b"abc"),
            _OddBytes(b"abc"),
            {"n": 10**5000},
            {"n": 2**70},
            [1, 2.5, "x"],
        ]
    ),
)
_CONFIG_FIELDS = (
    "lease",
    "retention",
    "attempt_log_size",
    "shards",
    "quarantine_payload_bytes",
    "quarantine_maxlen",
)


def _planned(core: Core, data: Any) -> Call:
    """One reserve or settlement planned from drawn inputs (of any type: a planner refuses
    what it cannot send)."""
    op = data.draw(_TEXTS)
    kind = data.draw(st.sampled_from(["reserve", "complete", "fail", "mark_provisional"]))
    if kind == "reserve":
        return core.plan_reserve(
            op,
            data.draw(_RESULTS),
            principal=data.draw(_TEXTS),
            lease=data.draw(_NUMBERS),
            fingerprint=data.draw(st.sampled_from([None, "0" * 64, _OddStr("0" * 64)])),
            attempt_id=data.draw(st.one_of(st.none(), _TEXTS)),
        )
    reservation = Reservation.model_construct(
        operation_id=op,
        fingerprint=data.draw(st.sampled_from(["ab" * 32, _OddStr("ab" * 32)])),
        fingerprint_version=data.draw(_NUMBERS),
        binding=data.draw(_TEXTS),
        generation=data.draw(_NUMBERS),
        attempt_id=data.draw(_TEXTS),
    )
    expected = data.draw(_NUMBERS)
    if kind == "complete":
        return core.plan_complete(reservation, data.draw(_RESULTS), expected_version=expected)
    if kind == "fail":
        return core.plan_fail(reservation, ValueError(data.draw(_TEXTS)), expected_version=expected)
    return core.plan_mark_provisional(reservation, data.draw(_TEXTS), expected_version=expected)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_no_input_reaches_a_plain_call_in_a_form_the_look_would_change(data: Any) -> None:
    """Whatever a caller passes (numbers of any class, text and bytes subclasses, views)
    and whatever the config holds (``model_copy(update=...)`` skips its checks), a call the
    core marks plain holds nothing the lane's look would convert or send another way (an
    integer beyond 64 bits, a memoryview): packed unlooked, it is the same bytes as looked
    at. A float whose ``__mul__`` answered 10**5000 made a reserve's lease that integer,
    sent unlooked, and hiredis crashed the process."""
    config = SettleConfig()
    if data.draw(st.booleans()):
        field = data.draw(st.sampled_from(_CONFIG_FIELDS))
        config = config.model_copy(update={field: data.draw(_NUMBERS)})
    try:
        core = Core(config)
        call = _planned(core, data)
    except Exception:
        return
    if not call.plain:
        return
    command = ("EVALSHA", "0" * 40, len(call.keys), *call.keys, *call.args)
    assert packs_plain(command), [type(a).__name__ for a in command]
    for conn in (Connection(), AsyncConnection()):
        try:
            looked = pack_command(conn, command)
        except Exception as exc:
            with pytest.raises(type(exc)):
                pack_command(conn, command, plain=True)
            continue
        assert pack_command(conn, command, plain=True) == looked


@pytest.mark.parametrize("field", _CONFIG_FIELDS)
@pytest.mark.parametrize(
    "value",
    [2**63, -(2**63) - 1, 10**5000, memoryview(b"12")],
    ids=["2**63", "-2**63-1", "10**5000", "memoryview"],
)
def test_each_config_number_a_call_sends_is_looked_at_when_hiredis_cannot_pack_it(
    field: str, value: Any
) -> None:
    """``model_copy(update=...)`` skips the config's checks: whichever number a reserve or a
    settlement sends holds what hiredis would crash on or send another way, such a call is
    not marked plain (it is looked at, as before the mark)."""
    try:
        calls = _calls(Core(SettleConfig().model_copy(update={field: value})))
    except TypeError:  # a view where a number is computed with: refused, nothing sent
        return
    for call in calls:
        assert packs_plain((*call.keys, *call.args)) or not call.plain, (field, call.script)


def test_a_config_copied_with_a_number_beyond_64_bits_marks_nothing() -> None:
    """A config's numbers are read once, when the core is made: a number set on it after
    (``object.__setattr__`` past the frozen model) is not what its calls send."""
    config = SettleConfig().model_copy(update={"lease": _MulFloat(30.0)})
    assert config.lease_ms == 10**5000
    assert not any(call.plain for call in _calls(Core(config)))
    config = SettleConfig()
    core = Core(config)
    object.__setattr__(config, "quarantine_payload_bytes", 10**5000)
    for call in _calls(core):
        assert call.plain
        assert 10**5000 not in call.args


_LEASE = """
import asyncio, os, sys
from settle import AsyncSettler, Reserved, Settler
from settle.errors import InvalidInput

class Lease(float):
    def __mul__(self, other):
        return 10**5000

class Lying(int):
    __lt__ = __le__ = __gt__ = __ge__ = lambda self, other: True

def sync() -> None:
    settler = Settler.from_url(sys.argv[1], namespace="lease-" + os.urandom(4).hex())
    try:
        got = settler.reserve("op-1", {"a": 1}, principal="svc", lease=Lease(30.0))
        print("reserved:", isinstance(got, Reserved))
        try:
            settler.reserve("op-2", {"a": 1}, principal="svc", lease=Lying(10**5000))
        except InvalidInput as exc:
            print("refused:", type(exc).__name__)
    finally:
        settler.close()

async def main() -> None:
    settler = AsyncSettler.from_url(sys.argv[1], namespace="lease-" + os.urandom(4).hex())
    try:
        got = await settler.reserve("op-1", {"a": 1}, principal="svc", lease=Lease(30.0))
        print("reserved:", isinstance(got, Reserved))
        try:
            await settler.reserve("op-2", {"a": 1}, principal="svc", lease=Lying(10**5000))
        except InvalidInput as exc:
            print("refused:", type(exc).__name__)
    finally:
        await settler.aclose()

sync()
asyncio.run(main())
"""


def test_a_lease_whose_own_arithmetic_is_huge_is_not_a_crash(redis_url: str) -> None:
    """A lease of a float subclass whose ``__mul__`` answers 10**5000 passed the bounds
    check and became the lease's ms: sent in a plain reserve, hiredis crashed the process
    (sync and async). Its ms are those of the number it is (30 s), and an int that lies
    in every comparison is refused with InvalidInput, nothing sent."""
    lines = _survived(_LEASE, redis_url).splitlines()
    assert lines.count("reserved: True") == 2, lines
    assert lines.count("refused: InvalidInput") == 2, lines


_LANES = """
import asyncio, os, sys
from settle import AsyncSettler, Settler

ECHO = "return ARGV[1]"

async def batch() -> None:
    settler = AsyncSettler.from_url(sys.argv[1], namespace="lane-" + os.urandom(4).hex())
    try:
        lane = settler._runner._lane  # white box: the lane's own execute
        got = await asyncio.gather(
            *(
                lane.execute("EVAL", ECHO, 0, 10**5000) if n == 5 else
                lane.execute("EVAL", ECHO, 0, b"x", plain=True)
                for n in range(16)
            ),
            return_exceptions=True,
        )
        print("async:", [g if isinstance(g, bytes) else type(g).__name__ for g in got])
    finally:
        await settler.aclose()

settler = Settler.from_url(sys.argv[1], namespace="lane-" + os.urandom(4).hex())
try:
    settler._runner._lane.execute("EVAL", ECHO, 0, 10**5000)
except ValueError as exc:
    print("sync:", type(exc).__name__)
finally:
    settler.close()
asyncio.run(batch())
"""


def test_each_lane_looks_at_an_unmarked_call_in_a_batch_of_marked_ones(redis_url: str) -> None:
    """The mark is each call's own: an unmarked call is looked at, on the sync lane and in
    an asyncio lane's pipelined batch of marked ones (the calls tasks issue while another
    is on the wire), and its integer of over 4,300 digits is refused with ValueError, alone;
    sent unlooked, hiredis crashes the process."""
    lines = _survived(_LANES, redis_url).splitlines()
    assert "sync: ValueError" in lines
    assert f"async: {[b'x'] * 5 + ['ValueError'] + [b'x'] * 10}" in lines
