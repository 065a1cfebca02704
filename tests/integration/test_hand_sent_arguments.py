"""Write scripts called by hand (redis-cli, another client: not settle's, which checks every
argument) with an argument they cannot use: a lease or retention that is not a number of
milliseconds the expiry can take, a log cap that is not a number, a quarantine maxlen, trim age
or scan budget of another form, a stream id Redis refuses. The script answers an error reply
naming the argument and writes nothing: every key of the namespace keeps its bytes and expiry,
the shard's generation stays, an unclaimed shard stays unclaimed. Before, such a call claimed
the shard, raised the generation or appended to the quarantine (even deleted trimmed entries)
and only then failed: Redis keeps a script's writes before its error.

A call that does not reach the write that would use the argument answers what it answered
before; forms that worked and that settle's own calls use still work.

The quarantine read writes nothing, but refuses what it cannot use the same way, and the
reference model refuses it with the same text: a max matches or scan budget that is not a
whole number of at least 1, a headers flag other than '1' or '0'.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from settle import Reservation, Reserved, Settler
from settle._core.reference import run_script
from settle._core.scripts import SCRIPTS
from settle.testing import MemorySettler

WHO = "tenant:acme"
REQ = {"order": 7}
REASON = "timeout"

#: A lease or a retention (ms): non-numbers, non-finite, not at least 1, beyond 2^62.
BAD_MS = [
    "inf",
    "-inf",
    "nan",
    "0",
    "-1",
    "0.5",
    "",
    "abc",
    "1e400",
    "1e300",
    "4611686018427387904",
]
#: A lease also below 2^52: a lease end past 2^53 would read as corrupt.
BAD_LEASE = [*BAD_MS, "9007199254740993", "4503599627370496"]
#: An attempt log cap: observe() compares with it as a number.
BAD_CAP = ["", "abc"]
#: A quarantine maxlen or a trim's scan budget: a whole number of at least 1.
BAD_COUNT = ["inf", "-inf", "nan", "0", "-1", "1.5", "", "abc", "1e400"]
#: A trim's minimum age: '' for none, or a finite number of ms of at least 0.
BAD_AGE = ["inf", "-inf", "nan", "-1", "abc", "1e400"]
#: A quarantine maxlen: the same, or '' for none.
BAD_MAXLEN = [v for v in BAD_COUNT if v]
#: Stream ids XRANGE refuses.
BAD_ID = ["abc", "", "(abc", "1-2-3"]


@pytest.fixture
def settler(one_shard: Settler) -> Settler:
    return one_shard


Call = tuple[str, tuple[str, ...], list[Any]]


@dataclass
class Ctx:
    """The test's settler, a client of its server, and how a call is sent by hand."""

    settler: Settler
    client: redis.Redis
    send: Callable[[Call], Any]


def _reserved(s: Settler, **kw: Any) -> Reservation:
    got = s.reserve("op", REQ, principal=WHO, **kw)
    assert isinstance(got, Reserved)
    return got.reservation


def _settlement(s: Settler, script: str, r: Reservation) -> Call:
    core = s._core
    if script == "complete":
        call = core.plan_complete(r, {"charge": "ch_1"})
    elif script == "fail":
        call = core.plan_fail(r, ValueError("declined"))
    else:
        call = core.plan_mark_provisional(r, REASON)
    return script, call.keys, list(call.args)


def _new_reserve(c: Ctx) -> Call:
    call = c.settler._core.plan_reserve("op", REQ, principal=WHO)
    return "reserve", call.keys, list(call.args)


def _takeover(c: Ctx) -> Call:
    c.settler.mark_provisional(_reserved(c.settler), REASON)
    return _new_reserve(c)


def _renewal(c: Ctx) -> Call:
    call = c.settler._core.plan_renew(_reserved(c.settler))
    return "renew", call.keys, list(call.args)


def _accepted(script: str) -> Callable[[Ctx], Call]:
    return lambda c: _settlement(c.settler, script, _reserved(c.settler))


def _unknown_operation(script: str) -> Callable[[Ctx], Call]:
    def setup(c: Ctx) -> Call:
        planned = _settlement(c.settler, script, _reserved(c.settler))
        c.client.delete(planned[1][0])  # the record goes: the call meets no operation
        return planned

    return setup


def _stale(script: str) -> Callable[[Ctx], Call]:
    def setup(c: Ctx) -> Call:
        r = _reserved(c.settler).model_copy(update={"generation": 5})
        return _settlement(c.settler, script, r)

    return setup


def _repeated(script: str) -> Callable[[Ctx], Call]:
    """The same settlement again, after it was accepted (absorbed)."""

    def setup(c: Ctx) -> Call:
        planned = _settlement(c.settler, script, _reserved(c.settler))
        assert c.send(planned)[0] == b"accepted"
        return planned

    return setup


def _trim(c: Ctx) -> Call:
    """A trim of a stream holding 300 resolved entries (more than one XRANGE of 256)."""
    stream, resolutions, _ = c.settler._core.keys.quarantine_keys(0)
    pipe = c.client.pipeline(transaction=False)
    for i in range(300):
        pipe.xadd(stream, {"op": f"op{i}", "kind": "stale_generation"})
    ids = pipe.execute()
    c.client.hset(resolutions, mapping=dict.fromkeys(ids, '{"note": "ok"}'))
    call = c.settler._core._trim_call(0, "-", "", False)
    return "quarantine_trim", call.keys, list(call.args)


def _resolve(c: Ctx) -> Call:
    s = c.settler
    s.complete(_reserved(s).model_copy(update={"generation": 5}), {"charge": "ch_2"})
    entry = next(iter(s.quarantine.scan()))
    call = s._core.plan_resolve(entry, "checked")
    return "quarantine_resolve", call.keys, list(call.args)


SETTLEMENTS = ("complete", "fail", "mark_provisional")

#: Starting point -> (its setup, {ARGV index (1-based): the values refused there}).
CASES: dict[str, tuple[Callable[[Ctx], Call], dict[int, list[str]]]] = {
    "a new reserve": (_new_reserve, {5: BAD_LEASE, 6: BAD_MS, 8: BAD_CAP}),
    "a takeover": (_takeover, {5: BAD_LEASE, 6: BAD_MS, 8: BAD_CAP}),
    "a renewal": (_renewal, {5: BAD_LEASE, 6: BAD_MS}),
    **{
        f"{script}, accepted": (_accepted(script), {11: BAD_MS, 12: BAD_CAP})
        for script in SETTLEMENTS
    },
    **{
        f"{script}, repeated": (_repeated(script), {11: BAD_MS, 12: BAD_CAP})
        for script in SETTLEMENTS
    },
    **{
        f"{script}, unknown operation": (
            _unknown_operation(script),
            {11: BAD_MS, 12: BAD_CAP, 14: BAD_MAXLEN},
        )
        for script in SETTLEMENTS
    },
    **{
        f"{script}, stale generation": (_stale(script), {11: BAD_MS, 12: BAD_CAP, 14: BAD_MAXLEN})
        for script in SETTLEMENTS
    },
    "a trim": (_trim, {1: BAD_ID, 2: BAD_AGE, 4: [*BAD_COUNT, "256.5"]}),
    "a resolution": (_resolve, {1: BAD_ID}),
}

#: What each script calls the argument at each index in its error.
NAMES = {
    "reserve": {5: "lease", 6: "retention", 8: "log cap"},
    "renew": {5: "lease", 6: "retention"},
    **{s: {11: "retention", 12: "log cap", 14: "quarantine maxlen"} for s in SETTLEMENTS},
    "quarantine_trim": {1: "lowest id", 2: "minimum age", 4: "scan budget"},
    "quarantine_resolve": {1: "entry id"},
}

PARAMS = [
    pytest.param(case, index, value, id=f"{case}-ARGV[{index}]={value!r}")
    for case, (_, bad) in CASES.items()
    for index, values in bad.items()
    for value in values
]


def _functions(client: redis.Redis) -> bool:
    return int(client.info("server")["redis_version"].split(".")[0]) >= 7


@pytest.fixture
def ctx(settler: Settler, redis_url: str) -> Iterator[Ctx]:
    """Calls sent by hand as settle sends them on the server: FCALL of settle's function
    library on Redis 7+ and Valkey, EVAL of the script's text (what EVALSHA runs) on 6.2.
    The version matrix of .ci/run runs both."""
    client = redis.Redis.from_url(redis_url)
    fcall = _functions(client)
    if fcall:
        client.function_load(SCRIPTS.library, replace=True)

    def send(call: Call) -> Any:
        script, keys, args = call
        if fcall:
            return client.fcall(SCRIPTS.function(script), len(keys), *keys, *args)
        return client.eval(SCRIPTS.source(script), len(keys), *keys, *args)

    yield Ctx(settler, client, send)
    client.close()


def _state(client: redis.Redis, namespace: str) -> dict[bytes, tuple[bytes, int]]:
    """Every key of the namespace: its DUMP and absolute expiry in ms (-1: none)."""
    out: dict[bytes, tuple[bytes, int]] = {}
    for key in client.scan_iter(match="settle:{" + namespace + "*"):
        pipe = client.pipeline(transaction=True)
        pipe.dump(key).pttl(key).time()
        dumped, ttl, (s, us) = pipe.execute()
        out[key] = (dumped, -1 if ttl < 0 else s * 1000 + us // 1000 + ttl)
    return out


def _same(before: dict[bytes, tuple[bytes, int]], after: dict[bytes, tuple[bytes, int]]) -> None:
    assert set(after) == set(before)
    for key, (dumped, expires) in before.items():
        assert after[key][0] == dumped, key
        # the same expiry, read a few ms apart (PTTL counts down)
        assert abs(after[key][1] - expires) <= 5, (key, expires, after[key][1])


def _unclaim(client: redis.Redis, call: Call) -> Call:
    """The call on a shard whose state lost its claim (its generation kept), with the claim
    flag settle sends once it checked the namespace metadata."""
    script, keys, args = call
    client.hdel(keys[-1], "shards")
    return script, keys, [*args[:-1], "1"]


@pytest.mark.parametrize("claimed", [True, False], ids=["claimed", "unclaimed"])
@pytest.mark.parametrize(("case", "index", "value"), PARAMS)
def test_an_argument_a_write_cannot_use_is_refused_and_nothing_is_written(
    ctx: Ctx, namespace: str, case: str, index: int, value: str, claimed: bool
) -> None:
    setup, _ = CASES[case]
    script, keys, args = setup(ctx)
    args[index - 1] = value
    call: Call = (script, keys, args)
    client = ctx.client
    if not claimed:
        call = _unclaim(client, call)
    state_key = keys[-1]
    generation = client.hget(state_key, "gen")
    before = _state(client, namespace)
    with pytest.raises(redis.ResponseError) as info:
        ctx.send(call)
    assert client.hget(state_key, "gen") == generation
    assert client.hexists(state_key, "shards") == claimed
    _same(before, _state(client, namespace))
    said = f"settle: {script}: {NAMES[script][index]} (ARGV[{index}]) must be"
    assert str(info.value).startswith(said), str(info.value)


def _reply(ctx: Ctx, call: Call) -> Any:
    """The reply without its server time."""
    got = ctx.send(call)
    return [got[0], got[1], *got[3:]]


def _replay(s: Settler) -> None:
    s.complete(_reserved(s), {"charge": "ch_1"})


@pytest.mark.parametrize("claimed", [True, False], ids=["claimed", "unclaimed"])
@pytest.mark.parametrize(
    ("name", "setup", "principal", "at"),
    [
        ("a replay", _replay, WHO, {5: "inf", 6: "abc"}),
        ("an operation in progress", _reserved, WHO, {5: "0", 8: ""}),
        ("another binding", _reserved, "tenant:other", {6: "nan"}),
    ],
)
def test_a_reserve_that_writes_nothing_answers_as_before(
    ctx: Ctx,
    namespace: str,
    name: str,
    setup: Callable[[Settler], object],
    principal: str,
    at: dict[int, str],
    claimed: bool,
) -> None:
    """Its lease, retention and log cap are never used: it answers what it answers with
    settle's own, and writes nothing (it claims no shard either)."""
    setup(ctx.settler)
    planned = ctx.settler._core.plan_reserve("op", REQ, principal=principal, attempt_id="a2")
    good: Call = ("reserve", planned.keys, list(planned.args))
    bad: Call = ("reserve", planned.keys, [at.get(i, v) for i, v in enumerate(planned.args, 1)])
    if not claimed:
        good, bad = _unclaim(ctx.client, good), _unclaim(ctx.client, bad)
    before = _state(ctx.client, namespace)
    answer = _reply(ctx, bad)
    assert answer[0] in (b"replay", b"in_progress", b"binding_mismatch"), (name, answer)
    _same(before, _state(ctx.client, namespace))
    assert answer == _reply(ctx, good)


@pytest.mark.parametrize("script", SETTLEMENTS)
@pytest.mark.parametrize("claimed", [True, False], ids=["claimed", "unclaimed"])
def test_a_settlement_that_quarantines_nothing_never_reads_its_maxlen(
    ctx: Ctx, script: str, claimed: bool
) -> None:
    """The quarantine maxlen caps the stream a refused response joins: an accepted settlement
    takes any, and writes (on an unclaimed shard, after claiming it)."""
    planned = _accepted(script)(ctx)
    call: Call = (planned[0], planned[1], [*planned[2][:13], "abc", *planned[2][14:]])
    if not claimed:
        call = _unclaim(ctx.client, call)
    assert ctx.send(call)[0] == b"accepted"
    assert ctx.client.hget(call[1][-1], "shards") == b"1"


@pytest.mark.parametrize("case", ["a trim", "a resolution"])
def test_a_trim_or_resolution_claims_an_unclaimed_shard_as_before(ctx: Ctx, case: str) -> None:
    """The claim waits for the stream id to be checked, then is written as it was."""
    setup, _ = CASES[case]
    call = _unclaim(ctx.client, setup(ctx))
    assert ctx.send(call)[0] in (b"done", b"resolved")
    assert ctx.client.hget(call[1][-1], "shards") == b"1"


ODD_BUT_USABLE = [
    ("a new reserve", 5, ["1.0", "1e3", " 1000", "0x3e8", "1.5", "1099511627776"]),
    ("a new reserve", 6, ["1e6", "1.5", "4e18"]),
    ("a new reserve", 8, ["0", "-1", "nan", "inf", "-inf", "1e400", "0.5"]),
    ("a renewal", 5, ["1e3", "1000.5"]),
    ("a renewal", 6, ["1e6", "1.5"]),
    ("complete, accepted", 11, ["1e6", "1.5"]),
    ("complete, accepted", 12, ["0", "nan", "inf"]),
    ("complete, unknown operation", 14, ["", "1", "1e3", "1e300"]),
    ("a trim", 2, ["", "0", "0.5", "1e15"]),
    ("a trim", 4, ["1", "1e3", "4096"]),
]


@pytest.mark.parametrize(
    ("case", "index", "value"),
    [
        pytest.param(case, index, value, id=f"{case}-ARGV[{index}]={value!r}")
        for case, index, values in ODD_BUT_USABLE
        for value in values
    ],
)
def test_forms_a_script_could_use_still_work(ctx: Ctx, case: str, index: int, value: str) -> None:
    """Forms settle never sends that the scripts could use keep working (tonumber reads them
    as the scripts always did); a trim's age reaching back before the epoch finds nothing that
    old (it failed on the invalid stream id it made)."""
    setup, _ = CASES[case]
    script, keys, args = setup(ctx)
    args[index - 1] = value
    got = ctx.send((script, keys, args))
    assert got[0] in (b"reserved", b"renewed", b"accepted", b"quarantined", b"done", b"more"), got


@pytest.mark.parametrize("flavour", ["redis", "model"])
def test_a_trim_older_than_the_server_clock_finds_nothing(settler: Settler, flavour: str) -> None:
    """settle's own trim takes ages up to 100 years, further back than the epoch: nothing is
    that old (its range ended at a negative stream id, which XRANGE refused; the reference
    model raised on it)."""
    if flavour == "model":
        settler = MemorySettler(namespace="trim", shards=1)
    settler.complete(_reserved(settler).model_copy(update={"generation": 5}), {"charge": "x"})
    entry = next(iter(settler.quarantine.scan()))
    settler.quarantine.resolve(entry.id, note="checked")
    result = settler.quarantine.trim(older_than=100 * 365 * 86_400)
    assert (result.removed, result.unresolved) == (0, 0)
    assert settler.quarantine.get(entry.id).id == entry.id
    time.sleep(0.002)
    assert settler.quarantine.trim(older_than=0.001).removed == 1


@pytest.mark.parametrize(
    ("index", "value"),
    [(5, "1"), (5, "4503599627370495"), (6, "1"), (6, "2305843009213693952")],
    ids=["lease 1 ms", "lease 2^52 - 1 ms", "retention 1 ms", "retention 2^61 ms"],
)
def test_the_bounds_a_reserve_takes_are_taken_by_the_whole_script(
    ctx: Ctx, index: int, value: str
) -> None:
    """At the edges of what arg_refused takes, on an unclaimed shard (the head leaves that
    call to the whole script, so these are its checks): reserved, and the shard claimed."""
    script, keys, args = _new_reserve(ctx)
    args[index - 1] = value
    got = ctx.send(_unclaim(ctx.client, (script, keys, args)))
    assert got[0] == b"reserved", got
    assert ctx.client.hget(keys[-1], "shards") == b"1"


def test_a_lost_renewal_with_a_lease_it_cannot_use_answers_lost(ctx: Ctx, namespace: str) -> None:
    """A renewal whose lease is gone answers lost before it would use its lease: a bad lease
    changes nothing there (the renewal would not have written)."""
    script, keys, args = _renewal(ctx)
    args[3] = str(int(args[3]) + 1)  # another generation: rule N3
    before = _state(ctx.client, namespace)
    bad = _reply(ctx, (script, keys, [*args[:4], "inf", *args[5:]]))
    assert bad[:2] == [b"lost", b"stale_generation"]
    assert bad == _reply(ctx, (script, keys, args))
    _same(before, _state(ctx.client, namespace))


@pytest.mark.parametrize("flag", ["", "2", "yes", "1 "])
def test_a_quarantine_read_refuses_a_headers_flag_it_cannot_use(ctx: Ctx, flag: str) -> None:
    # ARGV[9] '1' reads headers (kind, time, resolved) and '0' or none whole entries; any
    # other value is an error reply naming it, not a read of either kind.
    ref = ctx.settler.complete(_ghost(), b"late").quarantine_id
    assert ref is not None
    call = ctx.settler._core.plan_quarantine_lookup(ref)[0]
    planned: Call = ("quarantine_read", call.keys, list(call.args))
    whole = ctx.send((planned[0], planned[1], planned[2][:8]))
    assert ctx.send(planned)[4] == whole[4]  # settle's own call says "0": whole entries
    assert b"payload" in whole[4][0][1]
    header = ctx.send((planned[0], planned[1], [*planned[2][:8], "1"]))
    assert header[4][0][1][::2] == [b"kind", b"at", b"us"]
    with pytest.raises(redis.ResponseError, match=r"headers flag \(ARGV\[9\]\)"):
        ctx.send((planned[0], planned[1], [*planned[2][:8], flag]))


def _ghost() -> Reservation:
    return Reservation(
        operation_id="ghost",
        fingerprint="a" * 64,
        fingerprint_version=1,
        binding=WHO,
        generation=7,
        attempt_id="w-ghost",
    )


#: A quarantine read's max matches or scan budget sent by hand: not a whole number of at least
#: 1. Before: 0, -1, nan or -inf answered 'more' with nothing examined and no id to resume
#: after; 1.5 matches read 2; a budget of 1.5 failed inside XRANGE ("value is not an
#: integer"); '' or 'abc' failed comparing a number with nil.
BAD_READ_COUNT = [*BAD_COUNT, "2.5", "-0x3"]


def _read_both(ctx: Ctx) -> tuple[Call, Callable[[Call], Any]]:
    """A quarantine read of a shard holding three entries, planned by settle (whole
    entries), and how the reference model answers a call of it (on its own three)."""
    model = MemorySettler(namespace="read", shards=1)
    for n in range(3):
        for s in (ctx.settler, model):
            s.complete(_ghost().model_copy(update={"attempt_id": f"w-{n}"}), b"late")
    call = ctx.settler._core.quarantine_query(limit=3).calls()[0]
    keys = model._core.quarantine_query(limit=3).calls()[0].keys

    def on_model(planned: Call) -> Any:
        return run_script(model._runner.keyspace, planned[0], list(keys), planned[2])  # type: ignore[attr-defined]

    return ("quarantine_read", call.keys, list(call.args)), on_model


@pytest.mark.parametrize("index", [3, 4], ids=["max matches", "scan budget"])
@pytest.mark.parametrize("value", BAD_READ_COUNT)
def test_a_quarantine_read_refuses_a_count_it_cannot_use(ctx: Ctx, index: int, value: str) -> None:
    # The script and the reference model refuse it alike, with an error naming it.
    planned, on_model = _read_both(ctx)
    planned[2][index - 1] = value
    what = {3: "max matches", 4: "scan budget"}[index]
    said = f"settle: quarantine_read: {what} (ARGV[{index}]) must be a whole number of at least 1"
    _both_refuse(ctx, planned, on_model, said)


def _both_refuse(ctx: Ctx, planned: Call, on_model: Callable[[Call], Any], said: str) -> None:
    """The script and the reference model refuse ``planned`` alike, saying ``said``."""
    with pytest.raises(redis.ResponseError) as info:
        ctx.send(planned)
    assert str(info.value).startswith(said), str(info.value)
    with pytest.raises(ValueError, match=re.escape(said)):
        on_model(planned)


@pytest.mark.parametrize("value", ["3", "3.0", "1e3", " 3", "3 ", "0x3", "4096"])
@pytest.mark.parametrize("index", [3, 4], ids=["max matches", "scan budget"])
def test_a_quarantine_read_takes_any_form_of_a_whole_count(
    ctx: Ctx, index: int, value: str
) -> None:
    # What tonumber reads as a whole number of at least 1 still reads, on both alike: the
    # three entries ('more' where the budget ended on the last: no chunk came back short).
    planned, on_model = _read_both(ctx)
    planned[2][index - 1] = value
    real, model = ctx.send(planned), on_model(planned)
    assert (real[0], len(real[4])) == (model[0], len(model[4])), (real, model)
    assert len(real[4]) == 3


@pytest.mark.parametrize("flag", ["", "2", "yes", "1 "])
def test_the_model_refuses_a_headers_flag_as_the_script_does(ctx: Ctx, flag: str) -> None:
    planned, on_model = _read_both(ctx)
    bad: Call = (planned[0], planned[1], [*planned[2][:8], flag])
    with pytest.raises(redis.ResponseError) as info:
        ctx.send(bad)
    with pytest.raises(ValueError, match=r"headers flag \(ARGV\[9\]\) must be") as refused:
        on_model(bad)
    assert f"ERR {info.value}" == str(refused.value)


@pytest.mark.parametrize("value", ["nan", "abc", "-nan", "1..2"])
@pytest.mark.parametrize("index", [10, 11], ids=["since", "until"])
def test_a_quarantine_read_refuses_a_window_bound_it_cannot_use(
    ctx: Ctx, index: int, value: str
) -> None:
    # ARGV[10]/[11], the window by the entries' own time, take a number of ms or '' (open):
    # nan would compare false with every time and read nothing, silently.
    planned, on_model = _read_both(ctx)
    planned[2][index - 1] = value
    what = {10: "since", 11: "until"}[index]
    said = f"settle: quarantine_read: {what} (ARGV[{index}]) must be a number of milliseconds"
    _both_refuse(ctx, planned, on_model, said)
