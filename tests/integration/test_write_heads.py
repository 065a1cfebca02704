"""The write fast paths (``reserve_head.lua`` for a new operation and a takeover,
``complete_head.lua``, ``fail_head.lua`` and ``mark_provisional_head.lua`` for the accepted
settlement of the attempt holding the operation, ``renew_head.lua`` for its heartbeat)
write exactly what the whole script writes and reply what it replies.

Each case sets up a real server (through settle, or by changing one argument or one stored
value), then runs the call from that same starting point several ways: the head alone (a
script that ends where the head falls through), the script settle runs (head, then the whole
script), the whole script without its head and, on Redis 7+ and Valkey, both as FUNCTION
libraries. The server clock is pinned in every one of them (``TIME`` reads a test key) and
every SET is logged with its arguments, so the values written, down to the byte, the keys'
expiries, the shard's last generation and the replies can be held equal. Where the head
answers, every way must give what the whole script gives; where it falls through, it must
have written nothing, and the other ways must still agree (the script behind the head reuses
what the head read). The cases settle's own calls hit most must be answered by the head, and
no other case is (the heads are built for those and refuse the rest).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from settle import Reservation, Reserved, Settler
from settle._core.scripts import SCRIPTS
from tests.integration.test_read_heads import FELL_THROUGH, WHOLE, _float, _head_only, _value, _word

WHO = "tenant:acme"
REQ = {"order": 7}
TIME_CALL = "redis.call('TIME')"
SET_CALL = "redis.call('SET', "


@dataclass
class Case:
    """Starts from a clean namespace: sets the server up, returns the call's KEYS and ARGV
    (and the server clock to pin, in ms, when the case needs one)."""

    setup: Callable[[], tuple[Any, ...]]
    #: The pinned server clock, in ms after the real one when the case is set up.
    ahead_ms: int = 1_000


@pytest.fixture
def settler(one_shard: Settler, redis_url: str, namespace: str) -> Iterator[Settler]:
    yield one_shard
    client = redis.Redis.from_url(redis_url)
    try:  # the pinned libraries the test loaded (named after its namespace)
        if _functions(client):
            for library in client.function_list(library=f"*{namespace}*"):
                fields = dict(zip(library[::2], library[1::2], strict=True))
                client.function_delete(fields[b"library_name"].decode())
        client.delete(*_test_keys(namespace))
    finally:
        client.close()


def _test_keys(namespace: str) -> tuple[str, str]:
    """The pinned clock and the log of SETs, in the namespace's shard 0 slot."""
    return f"settle:{{{namespace}:0}}:test:clock", f"settle:{{{namespace}:0}}:test:writes"


def _pinned(source: str, namespace: str) -> str:
    """``source`` with the server clock read from the namespace's test clock key and every
    SET it makes also appended, arguments and all (the expiry with them), to its log of
    SETs. The text depends on the namespace only, so each way is loaded once per test."""
    clock, writes = _test_keys(namespace)
    assert TIME_CALL in source
    assert SET_CALL in source
    body = source.replace(TIME_CALL, f"redis.call('HMGET', '{clock}', 's', 'us')")
    body = body.replace(SET_CALL, "test_set(")
    shim = (
        "local function test_set(...)\n"
        f"  redis.call('RPUSH', '{writes}', cmsgpack.pack(...))\n"
        f"  return {SET_CALL}...)\n"
        "end\n"
    )
    if body.startswith("#!lua"):  # a library: its first line names it
        first, rest = body.split("\n", 1)
        return f"{first}\n{shim}{rest}"
    return shim + body


def _snapshot(client: redis.Redis, keys: tuple[str, ...]) -> dict[str, tuple[bytes, int] | None]:
    out: dict[str, tuple[bytes, int] | None] = {}
    for key in keys:
        dumped = client.dump(key)
        out[key] = None if dumped is None else (dumped, max(0, client.pttl(key)))
    return out


def _restore(client: redis.Redis, snap: dict[str, tuple[bytes, int] | None]) -> None:
    client.delete(*snap)
    for key, kept in snap.items():
        if kept is not None:
            client.restore(key, kept[1], kept[0])


def _state(client: redis.Redis, keys: tuple[str, ...]) -> list[tuple[str, Any, int]]:
    """What each key holds: its type and DUMP, read in one MULTI with whether it expires
    (-1: no, -2: no key, 0: yes; the expiry a script set is compared exactly in the log of
    its SETs)."""
    pipe = client.pipeline(transaction=True)
    for key in keys:
        pipe.type(key).dump(key).pttl(key)
    got = pipe.execute()
    return [
        (got[i].decode(), got[i + 1], max(-2, min(0, got[i + 2]))) for i in range(0, len(got), 3)
    ]


def _same_state(a: list[tuple[str, Any, int]], b: list[tuple[str, Any, int]]) -> bool:
    """Equal; a key that expired between a write and the read counts as the key written
    (its SET, with the expiry, is in the log of SETs all the same)."""

    def gone(x: tuple[str, Any, int], y: tuple[str, Any, int]) -> bool:
        return x[2] == -2 and y[2] == 0

    return all(x == y or gone(x, y) or gone(y, x) for x, y in zip(a, b, strict=True))


def _without_quarantine_ids(
    outcome: tuple[Any, list[tuple[str, Any, int]]], keys: tuple[str, ...]
) -> tuple[Any, list[tuple[str, Any, int]]]:
    """A refusal's quarantine entry id comes from the real clock: its reply's id, the stream
    and the identities hash (its values are ids) are left out where two runs are compared."""
    reply, state = outcome
    if isinstance(reply, list) and len(reply) > 3:
        reply = [*reply[:3], None, *reply[4:]]
    ids = (":quarantine", ":quarantine:seen")
    return reply, [
        (kind, None, ttl) if key.endswith(ids) else (kind, value, ttl)
        for key, (kind, value, ttl) in zip(keys, state, strict=True)
    ]


ENTRY = [None, None, _word(b"reserve"), _word(b"reserved"), _word(b"new"), 0]
#: A crafted record's result digest that is the digest its settlement's call sends.
SAME_DIGEST = object()
#: The attempt id and generation of every crafted record (``_Starts.crafted``).
AID = bytes.fromhex("0c" * 16)
GEN = 77


def _pending(
    r: Reservation, log: list[list[Any]] | None = None, *, created: int, **over: Any
) -> bytes:
    """A packed value holding ``r``'s pending record as settle writes it (field order of
    _lib.lua), with ``over`` in place of its fields and ``log`` of its attempt log (one
    reserve entry)."""
    fields: dict[str, Any] = {
        "fp": bytes.fromhex(r.fingerprint),
        "fpv": r.fingerprint_version,
        "bind": r.binding.encode(),
        "gen": r.generation,
        "ver": 1,
        "state": _word(b"pending"),
        "n": 1,
        "created": created,
        "updated": 0,
        "lease": 30_000,
        "aid": bytes.fromhex(r.attempt_id),
        "reason": None,
        "result": None,
        "rdig": None,
        "rexp": 30_000 + 86_400_000,
        "lexp": 30_000 + 86_400_000,
    }
    fields.update(over)
    return _value(*fields.values(), *(v for e in (log or [ENTRY]) for v in e))


def _functions(client: redis.Redis) -> bool:
    return int(client.info("server")["redis_version"].split(".")[0]) >= 7


def _ways(client: redis.Redis, script: str, namespace: str) -> dict[str, Callable[..., Any]]:
    """Each way to run ``script`` with the clock pinned and its SETs logged (see _pinned),
    head alone first."""

    def evaluated(source: str) -> Callable[..., Any]:
        pinned = _pinned(source, namespace)
        return lambda keys, args: client.eval(pinned, len(keys), *keys, *args)

    ways = {
        "head alone": evaluated(_head_only(script)),
        "as settle runs it": evaluated(SCRIPTS.source(script)),
        "whole script": evaluated(WHOLE.source(script)),
    }
    if _functions(client):
        for label, library in (("library", SCRIPTS), ("library without heads", WHOLE)):
            name = f"{library.library_name}_{namespace}"  # deleted with the namespace
            text = _pinned(library.library, namespace).replace(library.library_name, name)
            client.function_load(text, replace=True)
            fn = library.function(script).replace(library.library_name, name)
            ways[label] = lambda keys, args, fn=fn: client.fcall(fn, len(keys), *keys, *args)
    return ways


def _run(settler: Settler, client: redis.Redis, script: str, cases: dict[str, Case]) -> set[str]:
    """Runs every case every way, each from the namespace's metadata and its claimed shard as
    they were at the start; returns the cases the head answered."""
    namespace = settler.config.namespace
    pattern = "settle:{" + namespace + "*"
    kept = (b":meta", b":gen")  # the namespace's metadata, the shard's state
    initial = _snapshot(
        client, tuple(k.decode() for k in client.scan_iter(match=pattern) if k.endswith(kept))
    )
    clock, writes = _test_keys(namespace)
    ways = _ways(client, script, namespace)
    answered = set()
    for name, case in cases.items():
        client.delete(*(k.decode() for k in client.scan_iter(match=pattern)))
        _restore(client, initial)
        keys, args, *pin = case.setup()
        seconds, ms = divmod(pin[0] if pin else int(time.time() * 1000) + case.ahead_ms, 1000)
        client.hset(clock, mapping={"s": seconds, "us": ms * 1000 + 123})
        watched = (*dict.fromkeys(keys), writes)
        start, before = _snapshot(client, watched), _state(client, watched)
        outcomes = {}
        for label, run in ways.items():
            _restore(client, start)
            try:
                reply: Any = run(keys, args)
            except redis.ResponseError as exc:
                # the error's own words, without where the server says it was raised
                reply = ("error", str(exc).split(" script: ")[0].rsplit(": ", 1)[-1])
            outcomes[label] = (reply, _state(client, watched))
        _restore(client, start)
        head_reply, head_state = outcomes.pop("head alone")
        expected = outcomes["whole script"]
        if head_reply == FELL_THROUGH:
            assert _same_state(head_state, before), f"{name}: a head that fell through wrote"
            # the script behind the head (it reuses what the head read) as the whole one
            for label, outcome in outcomes.items():
                got = _without_quarantine_ids(outcome, watched)
                want = _without_quarantine_ids(expected, watched)
                assert got[0] == want[0], (name, label, got[0], want[0])
                assert _same_state(got[1], want[1]), (name, label, got[1], want[1])
            continue
        answered.add(name)
        assert head_reply == expected[0], name
        assert _same_state(head_state, expected[1]), (name, head_state, expected[1])
        for label, (reply, state) in outcomes.items():
            assert reply == expected[0], (name, label)
            assert _same_state(state, expected[1]), (name, label, state, expected[1])
    return answered


def _exactly(answered: set[str], must: set[str]) -> None:
    """The head answered every case in ``must`` (settle's own calls) and no other."""
    assert must <= answered, must - answered
    assert answered == must, answered - must


def _with(args: tuple[Any, ...], **at: Any) -> list[Any]:
    """``args`` with ARGV[n] replaced by ``argv<n>=`` (1-based, as the scripts number them)."""
    out = list(args)
    for name, value in at.items():
        out[int(name.removeprefix("argv")) - 1] = value
    return out


def _reshaped(setup: Callable[[], tuple[Any, ...]], *, keys: int = 0, args: int = 0) -> Case:
    """``setup``'s call with ``keys`` extra keys before its last (the shard state's) or,
    with a negative ``args``, its last arguments cut off: a call in another shape than
    settle's, which every head must leave to the whole script."""

    def reshaped() -> tuple[Any, ...]:
        got_keys, got_args, *pin = setup()
        extra = tuple(f"{got_keys[0]}:extra{i}" for i in range(keys))
        got_keys = (*got_keys[:-1], *extra, got_keys[-1])
        return (got_keys, list(got_args)[: len(got_args) + args], *pin)

    return Case(reshaped)


#: The shapes _reshaped makes, the names of their cases (never answered by a head).
RESHAPED = {
    "an extra key": {"keys": 1},
    "the last argument left out": {"args": -1},
    "two arguments left out": {"args": -2},
}


class _Starts:
    """Starting points the settlement and renewal cases share: the caller's reservation
    made several ways, and its record replaced by a crafted one. ``plan`` gives the call's
    KEYS and ARGV for a reservation (and keyword arguments of the planner); ``crafted_at``
    are the ARGV overrides a crafted record's call needs."""

    def __init__(
        self,
        settler: Settler,
        client: redis.Redis,
        plan: Callable[..., tuple[tuple[str, ...], tuple[Any, ...]]],
        **crafted_at: Any,
    ) -> None:
        self.settler, self.client, self.plan, self.crafted_at = settler, client, plan, crafted_at

    def reserved(self, **kw: Any) -> Reservation:
        got = self.settler.reserve("op", REQ, principal=WHO, **kw)
        assert isinstance(got, Reserved)
        return got.reservation

    def misbound_response(self, r: Reservation) -> Reservation:
        """``r``, after a response of another attempt presenting another principal was
        quarantined (its log then holds an entry naming that attempt)."""
        other = r.model_copy(update={"binding": "tenant:other", "attempt_id": "0b" * 16})
        refused = self.settler.complete(other, {"charge": "ch_2"})
        assert refused.verdict.value == "quarantined", refused
        return r

    def resumed(self) -> Reservation:
        """The first reservation of an attempt that reserved again (rule R9)."""
        first = self.reserved(attempt_id="0a" * 8)
        self.reserved(attempt_id="0a" * 8)
        return first

    def taken_over(self) -> Reservation:
        """The reservation of the attempt that took over an expired lease."""
        self.reserved(lease=0.05)
        time.sleep(0.1)
        return self.reserved()

    def stale(self) -> Reservation:
        """The reservation of the attempt another one took over from."""
        first = self.reserved(lease=0.05)
        time.sleep(0.1)
        self.reserved()
        return first

    def call(
        self,
        before: Callable[[], Reservation] | None = None,
        *,
        after: Callable[[Reservation], object] = lambda r: None,
        planned: dict[str, Any] | None = None,
        **at: Any,
    ) -> Callable[[], tuple[Any, ...]]:
        """The call of the reservation ``before`` gives (a new one by default), after
        ``after``, with ARGV overridden by ``at`` (argvN=)."""

        def setup() -> tuple[Any, ...]:
            r = (before or self.reserved)()
            after(r)
            keys, args = self.plan(r, **(planned or {}))
            return keys, _with(args, **at)

        return setup

    @staticmethod
    def crafted_call(
        setup: Callable[[], tuple[Any, ...]], **at: Any
    ) -> Callable[[], tuple[Any, ...]]:
        """A crafted record's call (``setup``, from crafted()) with ARGV overridden by ``at``."""

        def changed() -> tuple[Any, ...]:
            keys, args, *pin = setup()
            return (keys, _with(args, **at), *pin)

        return changed

    def crafted(
        self,
        log: list[list[Any]] | None = None,
        pin: Callable[[int], int] | None = None,
        **over: Any,
    ) -> Callable[[], tuple[Any, ...]]:
        """The caller's pending record, stored as crafted (attempt AID, generation GEN),
        created a second ago; ``pin`` gives the server clock from its creation time."""

        def setup() -> tuple[Any, ...]:
            r = self.reserved(attempt_id=AID.hex())
            r = r.model_copy(update={"generation": GEN})
            keys, args = self.plan(r)
            created = int(time.time() * 1000) - 1_000
            if over.get("rdig") is SAME_DIGEST:  # a settlement's own digest (ARGV[9])
                over["rdig"] = bytes(args[8])[1:]
            self.client.set(keys[0], _pending(r, log, created=created, **over))
            args = _with(args, **self.crafted_at)
            return (keys, args) if pin is None else (keys, args, pin(created))

        return setup


#: The crafted starting points the settlement, renewal and takeover heads all answer.
CRAFTED_ANSWERED = {
    "crafted",
    "crafted, a detail of ''",
    "crafted, a result and digest while pending",
    "crafted, 400 entries",
    "crafted, an entry naming its attempt",
    "crafted, an entry naming its generation",
    "crafted, another attempt's entry, then its own",
}


def _crafted_cases(
    crafted: Callable[..., Callable[[], tuple[Any, ...]]], doing: str
) -> dict[str, Case]:
    """The crafted records both write heads on a record take (a settlement, a renewal,
    ``doing`` it): those in CRAFTED_ANSWERED, and fields or logs in forms they refuse."""
    big = 2**53 - 1
    at_40s = {"pin": lambda created: created + 40_000}
    other = bytes.fromhex("0f" * 16)
    # another attempt's entry, then one naming the record's attempt and generation (the
    # crafted record's attempt id is AID, its generation GEN)
    own_last = [[other, 5, *ENTRY[2:]], [AID, GEN, *ENTRY[2:]]]
    own_first = [[AID, *ENTRY[1:]]]
    return {
        "crafted": Case(crafted()),
        "crafted, a detail of ''": Case(crafted([[*ENTRY[:4], b"", 0]])),
        "crafted, a result and digest while pending": Case(
            crafted(result=b"x", rdig=bytes.fromhex("ab" * 32))
        ),
        "crafted, 400 entries": Case(crafted([ENTRY] * 400)),
        "crafted, 401 entries": Case(crafted([ENTRY] * 401)),
        "crafted, a lease end past 2^53": Case(crafted(lease=big)),
        "crafted, updated past 2^53, no expiry": Case(crafted(updated=big, rexp=None)),
        "crafted, an entry's time past 2^53": Case(crafted([[*ENTRY[:5], big]])),
        "crafted, an entry naming its attempt": Case(
            crafted([[bytes.fromhex("0f" * 16), *ENTRY[1:]]])
        ),
        "crafted, an entry naming its generation": Case(crafted([[None, 5, *ENTRY[2:]]])),
        "crafted, another attempt's entry, then its own": Case(crafted(own_last)),
        "crafted, the first entry naming the record's attempt": Case(crafted(own_first)),
        "crafted, the first entry naming the record's generation": Case(
            crafted([[None, GEN, *ENTRY[2:]]])
        ),
        "crafted, an entry's attempt id kept as text": Case(crafted([[[b"x"], *ENTRY[1:]]])),
        "crafted, an entry's attempt id empty": Case(crafted([[b"", *ENTRY[1:]]])),
        "crafted, an entry's generation as text": Case(crafted([[None, b"5", *ENTRY[2:]]])),
        "crafted, an entry's generation as a float": Case(
            crafted([[None, _float(5.5), *ENTRY[2:]]])
        ),
        "crafted, a word kept as text": Case(crafted([[None, None, b"reserve", *ENTRY[3:]]])),
        # a word's index past the ends of WORDS, or not whole: the rules call it corrupt
        "crafted, a word stored as 0": Case(crafted([[None, None, 0, *ENTRY[3:]]])),
        "crafted, a word stored as 21": Case(crafted([[None, None, *ENTRY[2:4], 21, 0]])),
        "crafted, a word stored as 5.5": Case(crafted([[None, None, _float(5.5), *ENTRY[3:]]])),
        "crafted, the log expired": Case(crafted(lexp=1)),
        "crafted, no log expiry": Case(crafted(lexp=None)),
        "crafted, the record expired": Case(crafted(rexp=1)),
        f"crafted, the record expiring as it {doing}": Case(crafted(rexp=40_000, **at_40s)),
        f"crafted, the log expiring as it {doing}": Case(crafted(lexp=40_000, **at_40s)),
        f"crafted, the lease ending as it {doing}": Case(crafted(lease=40_000, **at_40s)),
    }


def test_a_new_operation_is_written_by_the_head_as_reserve_writes_it(
    settler: Settler, redis_client: redis.Redis
) -> None:
    core = settler._core

    def reserve(**at: Any) -> Callable[[], tuple[tuple[str, ...], list[Any]]]:
        def setup() -> tuple[tuple[str, ...], list[Any]]:
            call = core.plan_reserve("op", REQ, principal=WHO)
            return call.keys, _with(call.args, **at)

        return setup

    def then(
        before: Callable[[redis.Redis, tuple[str, ...]], object], **at: Any
    ) -> Callable[[], tuple[tuple[str, ...], list[Any]]]:
        def setup() -> tuple[tuple[str, ...], list[Any]]:
            keys, args = reserve(**at)()
            before(redis_client, keys)
            return keys, args

        return setup

    def settled(_c: redis.Redis, _k: tuple[str, ...]) -> None:
        got = settler.reserve("op", REQ, principal=WHO)
        assert isinstance(got, Reserved)
        settler.complete(got.reservation, {"charge": "ch_1"})

    def pending(_c: redis.Redis, _k: tuple[str, ...]) -> None:
        settler.reserve("op", REQ, principal=WHO)

    text_aid = core.plan_reserve("op", REQ, principal=WHO, attempt_id="attempt-1").args[6]
    cases = {
        "a new operation": Case(reserve()),
        **{name: _reshaped(reserve(), **shape) for name, shape in RESHAPED.items()},
        "another fingerprint version": Case(reserve(argv3="2")),
        "a log cap of one": Case(reserve(argv8=1)),
        "no last generation": Case(then(lambda c, k: c.hdel(k[-1], "gen"))),
        "a last generation that is not a number": Case(
            then(lambda c, k: c.hset(k[-1], "gen", "x"))
        ),
        "a last generation ahead of the clock": Case(
            then(lambda c, k: c.hset(k[-1], "gen", str(2**52)))
        ),
        "a fingerprint kept as text": Case(reserve(argv2="not-hex")),
        "an attempt id kept as text": Case(reserve(argv7=text_aid)),
        "a fingerprint version of 01": Case(reserve(argv3="01")),
        "a lease of 0": Case(reserve(argv5=0)),
        "a lease of 1.5 ms": Case(reserve(argv5="1.5")),
        "a log cap of 0": Case(reserve(argv8=0)),
        "a log cap of -inf": Case(reserve(argv8="-inf")),  # observe() ends (it looped)
        "an unclaimed shard": Case(then(lambda c, k: c.delete(k[-1]))),
        "an unclaimed shard, claiming": Case(then(lambda c, k: c.delete(k[-1]), argv10="1")),
        "another shard count": Case(reserve(argv9=9)),
        "the previous layout at the key": Case(then(lambda c, k: c.hset(k[0], "fp", "x"))),
        "another string at the key": Case(then(lambda c, k: c.set(k[0], "hello"))),
        "a settled operation": Case(then(settled)),
        "an operation in progress": Case(then(pending)),
    }
    answered = _run(settler, redis_client, "reserve", cases)
    must = {
        "a settled operation",  # the replay: the head's read path, which writes nothing
        "a new operation",
        "another fingerprint version",
        "a log cap of one",
        "no last generation",
        "a last generation that is not a number",
        "a last generation ahead of the clock",
    }
    _exactly(answered, must)


def test_a_takeover_is_written_by_the_head_as_reserve_writes_it(
    settler: Settler, redis_client: redis.Redis
) -> None:
    core = settler._core

    def plan(_r: Reservation | None, **kw: Any) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        """A reserve of the operation by a new attempt (its own id unless ``attempt_id``)."""
        call = core.plan_reserve("op", REQ, principal=WHO, **kw)
        return call.keys, call.args

    shard = plan(None)[0][-1]
    # a crafted record's call with a log cap of 1000 to hold its log
    starts = _Starts(settler, redis_client, plan, argv8=1000)
    reserved, take = starts.reserved, starts.call

    def provisional(**kw: Any) -> Callable[[], Reservation]:
        def before() -> Reservation:
            r = reserved(**kw)
            assert settler.mark_provisional(r, "timeout").verdict.value == "accepted"
            return r

        return before

    def crafted(
        log: list[list[Any]] | None = None,
        pin: Callable[[int], int] | None = None,
        **over: Any,
    ) -> Callable[[], tuple[Any, ...]]:
        """A crafted record that was marked provisional (see _Starts.crafted)."""
        marked = {"state": _word(b"provisional"), "lease": None, "reason": b"timeout"}
        return starts.crafted(log, pin, **{**marked, **over})

    def twice_taken_over() -> Reservation:
        first = reserved(lease=0.05)
        time.sleep(0.1)
        reserved(lease=0.5)
        return first

    def quarantined_then_provisional() -> Reservation:
        return starts.misbound_response(provisional()())

    def settled() -> Reservation:
        r = reserved()
        settler.complete(r, {"charge": "ch_1"})
        return r

    def stale_response_then_provisional() -> Reservation:
        """The log's last entry is the first attempt's (its stale completion, quarantined)."""
        first = reserved(lease=0.05, attempt_id=same)
        time.sleep(0.1)
        second = reserved()
        assert settler.mark_provisional(second, "timeout").verdict.value == "accepted"
        assert settler.complete(first, {"charge": "ch_1"}).verdict.value == "quarantined"
        return first

    def shard_gen(setup: Callable[[], tuple[Any, ...]], gen: int) -> Callable[[], tuple[Any, ...]]:
        """``setup``, then the shard's last generation set to ``gen``."""

        def wrapped() -> tuple[Any, ...]:
            out = setup()
            redis_client.hset(shard, "gen", str(gen))
            return out

        return wrapped

    same = "0a" * 16
    cases = {
        **_crafted_cases(crafted, "is taken over"),
        "crafted, pending, updated after created, its lease ending just after": Case(
            starts.crafted(updated=500, lease=40_000, pin=lambda created: created + 40_499)
        ),
        "crafted, pending, updated after created, its lease ending as it is taken over": Case(
            starts.crafted(updated=500, lease=40_000, pin=lambda created: created + 40_500)
        ),
        "crafted, provisional holding a live lease": Case(crafted(lease=40_000)),
        # an entry naming the generation the takeover issues: stored as nil after it
        "crafted, the last entry naming the next generation": Case(
            shard_gen(crafted([ENTRY, [None, 2**52 + 1, *ENTRY[2:]]]), 2**52)
        ),
        "an attempt id of no bytes": Case(take(provisional(), argv7=b"\0")),
        "a log cap that is not a number": Case(take(provisional(), argv8="")),
        "the first attempt again after its stale response": Case(
            take(stale_response_then_provisional, planned={"attempt_id": same})
        ),
        "crafted, pending, its lease ended": Case(starts.crafted(lease=500)),
        "crafted, pending, its lease live": Case(starts.crafted()),
        "crafted, pending, its lease ending as it is taken over": Case(
            starts.crafted(lease=40_000, pin=lambda created: created + 40_000)
        ),
        "crafted, pending, its lease ending just after": Case(
            starts.crafted(lease=40_000, pin=lambda created: created + 39_999)
        ),
        "crafted, no attempt id": Case(crafted(aid=None)),
        "crafted, an empty attempt id": Case(crafted(aid=b"")),
        "crafted, a reason word": Case(crafted(reason=_word(b"lease_expired"))),
        "after a provisional report": Case(take(provisional())),
        **{name: _reshaped(take(provisional()), **s) for name, s in RESHAPED.items()},
        **{
            f"a settled operation, {name}": _reshaped(take(settled), **s)
            for name, s in RESHAPED.items()
        },
        "after the lease ran out": Case(take(lambda: reserved(lease=0.5)), ahead_ms=2_000),
        "the same attempt after its lease ran out": Case(
            take(lambda: reserved(lease=0.5, attempt_id=same), planned={"attempt_id": same}),
            ahead_ms=2_000,
        ),
        "a second takeover": Case(take(twice_taken_over), ahead_ms=2_000),
        "after a quarantined response": Case(take(quarantined_then_provisional)),
        "the log at its cap": Case(take(provisional(), argv8=2)),
        "the log one below its cap": Case(take(provisional(), argv8=3)),
        "the shard's last generation lost": Case(
            take(provisional(), after=lambda r: redis_client.hdel(shard, "gen"))
        ),
        "a last generation ahead of the clock": Case(
            take(provisional(), after=lambda r: redis_client.hset(shard, "gen", str(2**52)))
        ),
        "a settled operation": Case(take(settled)),
        "an operation in progress": Case(take()),
        "the same attempt again": Case(
            take(lambda: reserved(attempt_id=same), planned={"attempt_id": same})
        ),
        "an attempt id kept as text": Case(
            take(provisional(), planned={"attempt_id": "attempt-2"})
        ),
        "a lease of 0": Case(take(provisional(), argv5=0)),
        "a retention of 1.5 ms": Case(take(provisional(), argv6="1.5")),
        "a log cap of 0": Case(take(provisional(), argv8=0)),
        "another principal": Case(take(provisional(), argv4="tenant:other")),
        "another fingerprint version": Case(take(provisional(), argv3="2")),
        "another shard count": Case(take(provisional(), argv9=9)),
        "an unclaimed shard": Case(take(provisional(), after=lambda r: redis_client.delete(shard))),
        "an unclaimed shard, claiming": Case(
            take(provisional(), after=lambda r: redis_client.delete(shard), argv10="1")
        ),
    }
    answered = _run(settler, redis_client, "reserve", cases)
    must = {
        *CRAFTED_ANSWERED,
        "crafted, the lease ending as it is taken over",
        "crafted, pending, its lease ended",
        "crafted, pending, its lease ending as it is taken over",
        "after a provisional report",
        "after the lease ran out",
        "the same attempt after its lease ran out",
        "a second takeover",
        "after a quarantined response",
        "the log one below its cap",
        "the shard's last generation lost",
        "a last generation ahead of the clock",
        "a settled operation",  # the replay: the head's read path, which writes nothing
        "crafted, pending, updated after created, its lease ending as it is taken over",
        "crafted, provisional holding a live lease",
        "crafted, the last entry naming the next generation",
        "the first attempt again after its stale response",
    }
    _exactly(answered, must)


#: The reason the settlement tests' mark_provisional reports (the decorator's for a call
#: that timed out).
REASON = "timeout"


def _plan_settlement(
    settler: Settler, script: str, r: Reservation, **kw: Any
) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """The KEYS and ARGV of ``script`` (complete, fail or mark_provisional) for ``r``."""
    core = settler._core
    if script == "complete":
        call = core.plan_complete(r, {"charge": "ch_1"}, **kw)
    elif script == "fail":
        call = core.plan_fail(r, ValueError("declined"), **kw)
    else:
        call = core.plan_mark_provisional(r, REASON, **kw)
    return call.keys, call.args


SETTLEMENTS = ["complete", "fail", "mark_provisional"]


@pytest.mark.parametrize("script", SETTLEMENTS)
def test_an_accepted_settlement_is_written_by_the_head_as_the_rules_write_it(
    settler: Settler, redis_client: redis.Redis, script: str
) -> None:
    core = settler._core

    def plan(r: Reservation, **kw: Any) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        return _plan_settlement(settler, script, r, **kw)

    # a crafted record's call with a log cap of 1000 to hold its log
    starts = _Starts(settler, redis_client, plan, argv12=1000)
    reserved, crafted = starts.reserved, starts.crafted
    resumed, taken_over, stale = starts.resumed, starts.taken_over, starts.stale

    def settle(
        before: Callable[[], Reservation] | None = None,
        *,
        after: Callable[[Reservation], object] = lambda r: None,
        version: int | None = None,
        **at: Any,
    ) -> Callable[[], tuple[Any, ...]]:
        return starts.call(before, after=after, planned={"expected_version": version}, **at)

    # the settlement this script's call repeats (a report of an uncertain outcome repeats
    # none: every settlement absorbs it), the other one, the same one with another payload
    def same(r: Reservation) -> object:
        if script == "fail":
            return settler.fail(r, ValueError("declined"))
        return settler.complete(r, {"charge": "ch_1"})

    def other(r: Reservation) -> object:
        if script == "fail":
            return settler.complete(r, {"charge": "ch_1"})
        return settler.fail(r, ValueError("declined"))

    def another(r: Reservation) -> object:
        if script == "fail":
            return settler.fail(r, ValueError("another"))
        return settler.complete(r, {"charge": "ch_2"})

    terminal = {
        "state": _word(b"failed" if script == "fail" else b"completed"),
        "lease": None,
        "result": b"x",
        "rdig": SAME_DIGEST,
    }

    def digest_behind(setup: Callable[[], tuple[Any, ...]]) -> Callable[[], tuple[Any, ...]]:
        """``setup``'s call with its digest's bytes sent as text, after another first byte."""

        def changed() -> tuple[Any, ...]:
            keys, args, *pin = setup()
            return (keys, _with(args, argv9=b"x" + bytes(args[8])[1:]), *pin)

        return changed

    def renamed(setup: Callable[[], tuple[Any, ...]]) -> Callable[[], tuple[Any, ...]]:
        """``setup``'s call with its record moved to a key without ``}:op:`` (a hand-made
        call; the shard's guard refuses it before any rule reads the key)."""

        def moved() -> tuple[Any, ...]:
            keys, args, *pin = setup()
            other = keys[0].replace("}:op:", "}:xx:")
            redis_client.rename(keys[0], other)
            return ((other, *keys[1:]), args, *pin)

        return moved

    def settled_crafted(**over: Any) -> Callable[[], tuple[Any, ...]]:
        """A crafted record that the settlement this call repeats made terminal."""
        return crafted(**{**terminal, **over})

    def misbound_first() -> Reservation:
        return starts.misbound_response(reserved())

    cases = {
        **_crafted_cases(crafted, "settles"),
        "crafted, provisional with a reason": Case(
            crafted(state=_word(b"provisional"), lease=None, reason=REASON.encode())
        ),
        "crafted, provisional with another reason": Case(
            crafted(state=_word(b"provisional"), lease=None, reason=b"cancelled")
        ),
        "crafted, provisional with no reason": Case(
            crafted(state=_word(b"provisional"), lease=None)
        ),
        "crafted, 700 entries": Case(crafted([ENTRY] * 700)),
        "crafted, an entry's time as a float": Case(crafted([[*ENTRY[:5], _float(0.5)]])),
        "crafted, a word out of range": Case(crafted([[None, None, 99, *ENTRY[3:]]])),
        "after a misbound response was quarantined": Case(settle(misbound_first)),
        "crafted, a reason word": Case(
            crafted(state=_word(b"provisional"), lease=None, reason=_word(b"lease_expired"))
        ),
        "the attempt's settlement": Case(settle()),
        **{name: _reshaped(settle(), **shape) for name, shape in RESHAPED.items()},
        "crafted, an empty attempt id, another attempt's entry": Case(
            starts.crafted_call(
                crafted([[bytes.fromhex("0f" * 16), *ENTRY[1:]]], aid=b""), argv7=b"\0"
            )
        ),
        "with the version it saw": Case(settle(version=1)),
        "after the lease ran out": Case(settle(lambda: reserved(lease=0.5)), ahead_ms=2_000),
        "after the attempt marked it provisional": Case(
            settle(after=lambda r: settler.mark_provisional(r, "timeout: no answer"), version=2)
        ),
        "after the attempt marked it provisional for the same reason": Case(
            settle(after=lambda r: settler.mark_provisional(r, REASON), version=2)
        ),
        "after the same attempt reserved again": Case(settle(resumed)),
        "a reason of ''": Case(settle(argv10="")),
        "a reason holding a word and a bar": Case(settle(argv10="failed|x")),
        "a reason that is a word": Case(settle(argv10="failed")),
        "a reason that is the last word": Case(settle(argv10="conflicting_settlement")),
        "a reason that is the first word": Case(settle(argv10="pending")),
        "a reason with pattern characters": Case(settle(argv10="[timeout")),
        "crafted, pending with a reason": Case(crafted(reason=REASON.encode())),
        "crafted, an attempt id of no bytes": Case(
            starts.crafted_call(crafted(aid=b""), argv7=b"\0")
        ),
        "a log cap of two": Case(settle(argv12=2)),
        "a retention of 5 s": Case(settle(argv11=5_000)),
        "a log cap of one": Case(settle(argv12=1)),
        "the attempt that took over": Case(settle(taken_over)),
        "a stale generation": Case(settle(stale)),
        "settled already": Case(settle(after=lambda r: settler.complete(r, {"charge": "ch_1"}))),
        **{
            f"settled the same way already{name}": Case(settle(after=same, **at))
            for name, at in {
                "": {},
                ", with the version it saw": {"version": 1},
                ", by another attempt": {"argv7": b"\0" + b"\x0b" * 16},
                ", the log at its cap": {"argv12": 2},
                ", the log one below its cap": {"argv12": 3},
                ", a digest kept as text": {"argv9": "not-hex"},
                ", an attempt id kept as text": {"argv7": "attempt-1"},
                ", an attempt id of no bytes": {"argv7": b"\0"},
                ", a retention of 0": {"argv11": 0},
                ", a retention of 1.5 ms": {"argv11": "1.5"},
                ", another shard count": {"argv15": 9},
                ", another generation": {"argv5": "5"},
            }.items()
        },
        "settled the same way twice already": Case(settle(after=lambda r: [same(r), same(r)])),
        "settled the other way already": Case(settle(after=other)),
        "settled the same way with another payload already": Case(settle(after=another)),
        "crafted, settled the same way": Case(settled_crafted()),
        "crafted, settled the same way, holding a lease": Case(settled_crafted(lease=40_000)),
        "crafted, settled the same way, expiring after the retention": Case(
            settled_crafted(rexp=10 * 86_400_000)
        ),
        "crafted, settled the same way, expiring before the retention": Case(
            settled_crafted(rexp=5_000)
        ),
        "crafted, settled the same way, no record expiry": Case(settled_crafted(rexp=None)),
        "crafted, settled the same way, with a reason": Case(
            settled_crafted(reason=REASON.encode())
        ),
        "crafted, settled the same way, its expiry past 2^53": Case(
            settled_crafted(rexp=2**53 - 1)
        ),
        "crafted, settled the same way, its log expired": Case(settled_crafted(lexp=1)),
        "crafted, settled the same way, updated after created": Case(settled_crafted(updated=500)),
        # the other terminal state holding this call's own digest: conflicting (S9)
        "crafted, settled the other way with the same digest": Case(
            settled_crafted(state=_word(b"completed" if script == "fail" else b"failed"))
        ),
        "crafted, settled the same way, the digest's bytes after another first byte": Case(
            digest_behind(settled_crafted())
        ),
        # the new entry names the record's generation after an entry naming another
        "crafted, settled the same way, the last entry naming another generation": Case(
            settled_crafted(log=[ENTRY, [None, 5, *ENTRY[2:]]])
        ),
        # an empty digest stored (S9 for another digest), or none stored (S9 for '')
        "crafted, settled with an empty digest": Case(settled_crafted(rdig=b"")),
        "crafted, settled the same way, an empty digest sent as empty": Case(
            starts.crafted_call(settled_crafted(rdig=b""), argv9=b"\0")
        ),
        "crafted, settled with no digest, an empty digest sent": Case(
            starts.crafted_call(settled_crafted(rdig=None), argv9=b"\0")
        ),
        # a cap tonumber does not read, on a shard the guard refuses (no error there)
        "a log cap that is not a number, another shard count": Case(settle(argv12="", argv15=9)),
        "a record at a key that is not a record's, another shard count": Case(
            renamed(settle(after=same, argv15=9))
        ),
        "another version": Case(settle(version=5)),
        "another principal": Case(settle(argv4="tenant:other")),
        "another fingerprint": Case(settle(argv2=b"\0" + b"\x01" * 32)),
        "another attempt id": Case(settle(argv7=b"\0" + b"\x0b" * 16)),
        "an attempt id kept as text": Case(settle(lambda: reserved(attempt_id="attempt-1"))),
        "a digest kept as text": Case(settle(argv9="not-hex")),
        "a retention of 0": Case(settle(argv11=0)),
        "another shard count": Case(settle(argv15=9)),
        "no record": Case(settle(after=lambda r: redis_client.delete(core.keys.record("op")))),
    }
    answered = _run(settler, redis_client, script, cases)
    must = {
        *CRAFTED_ANSWERED,
        "crafted, provisional with a reason",
        "crafted, the lease ending as it settles",
        "the attempt's settlement",
        "with the version it saw",
        "after the lease ran out",
        "after the attempt marked it provisional",
        "after the same attempt reserved again",
        "a log cap of two",
        "a retention of 5 s",
        "a reason of ''",
        "a reason holding a word and a bar",
        "crafted, provisional with another reason",
        "crafted, provisional with no reason",
        # the log holds another attempt's entries
        "after a misbound response was quarantined",
        "the attempt that took over",
        "a reason with pattern characters",
        "crafted, pending with a reason",
        # a duplicate, absorbed
        "settled the same way already",
        "settled the same way already, with the version it saw",
        "settled the same way already, by another attempt",
        "settled the same way already, the log one below its cap",
        "settled the same way twice already",
        "crafted, settled the same way",
        "crafted, settled the same way, holding a lease",
        "crafted, settled the same way, expiring after the retention",
        "crafted, settled the same way, expiring before the retention",
        "crafted, settled the same way, updated after created",
        "crafted, settled the same way, the last entry naming another generation",
        "crafted, settled the same way, an empty digest sent as empty",
    }
    if script == "mark_provisional":
        # the same reason again is absorbed (rule S12), a word is stored as its index: the
        # rules; the digest of an empty payload is not stored, whatever its form
        must -= {"crafted, provisional with a reason"}
        must |= {
            "a digest kept as text",
            "settled the same way already, a digest kept as text",
            "crafted, settled the other way with the same digest",
            "crafted, settled the same way, the digest's bytes after another first byte",
            "settled the other way already",
            "settled the same way with another payload already",
            "settled already",
            "crafted, settled with an empty digest",
            "crafted, settled with no digest, an empty digest sent",
        }
    else:  # a reason is not stored; the same completion or failure again is absorbed
        must |= {
            "after the attempt marked it provisional for the same reason",
            "a reason that is a word",
            "a reason that is the last word",
            "a reason that is the first word",
        }
        if script == "complete":
            must.add("settled already")
    _exactly(answered, must)


def test_a_renewal_is_written_by_the_head_as_renew_writes_it(
    settler: Settler, redis_client: redis.Redis
) -> None:
    core = settler._core

    def plan(r: Reservation) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        call = core.plan_renew(r)
        return call.keys, call.args

    starts = _Starts(settler, redis_client, plan)
    reserved, crafted, renew = starts.reserved, starts.crafted, starts.call

    def changed(
        at: Callable[[Reservation, tuple[Any, ...]], dict[str, Any]],
    ) -> Callable[[], tuple[Any, ...]]:
        """The call of a new reservation with ARGV overridden by ``at(r, args)``."""

        def setup() -> tuple[Any, ...]:
            r = reserved()
            keys, args = plan(r)
            return keys, _with(args, **at(r, args))

        return setup

    def unclaimed(r: Reservation, args: tuple[Any, ...]) -> dict[str, Any]:
        """The shard's state lost (its claim and last generation), the call unchanged."""
        redis_client.delete(plan(r)[0][-1])
        return {}

    big = 2**53 - 1
    ten_days = 10 * 86_400_000
    cases = {
        **_crafted_cases(crafted, "renews"),
        "crafted, the log outliving the record": Case(crafted(lexp=ten_days)),
        "crafted, updated after created": Case(crafted(updated=500, lease=40_000)),
        "crafted, no record expiry": Case(crafted(rexp=None)),
        "crafted, a reason": Case(crafted(reason=b"timeout")),
        "crafted, a reason word": Case(crafted(reason=_word(b"lease_expired"))),
        "crafted, no attempt id": Case(crafted(aid=None)),
        "crafted, a log expiry past 2^53": Case(crafted(lexp=big)),
        "crafted, the lease ending just after": Case(
            crafted(lease=40_000, pin=lambda created: created + 39_999)
        ),
        "crafted, provisional": Case(
            crafted(state=_word(b"provisional"), lease=None, reason=b"timeout")
        ),
        "the attempt's renewal": Case(renew()),
        **{name: _reshaped(renew(), **shape) for name, shape in RESHAPED.items()},
        "renewed before": Case(renew(after=settler.renew)),
        "after the same attempt reserved again": Case(renew(starts.resumed)),
        "a lease of 1 s": Case(renew(argv5=1_000)),
        "a retention of 5 s": Case(renew(argv6=5_000)),
        "the attempt that took over (its log holds the first one's)": Case(
            renew(starts.taken_over)
        ),
        "a stale generation": Case(renew(starts.stale)),
        "after the lease ran out": Case(renew(lambda: reserved(lease=0.5)), ahead_ms=2_000),
        "after the attempt marked it provisional": Case(
            renew(after=lambda r: settler.mark_provisional(r, "timeout: no answer"))
        ),
        "settled already": Case(renew(after=lambda r: settler.complete(r, {"charge": "ch_1"}))),
        "another principal": Case(renew(argv3="tenant:other")),
        "another fingerprint": Case(renew(argv1=b"\0" + b"\x01" * 32)),
        "another fingerprint version": Case(renew(argv2="2")),
        "a fingerprint version of 01": Case(renew(argv2="01")),
        "another generation": Case(renew(argv4="5")),
        "a lease of 0": Case(renew(argv5=0)),
        "a retention of 0": Case(renew(argv6=0)),
        "another shard count": Case(renew(argv7=9)),
        "no record": Case(renew(after=lambda r: redis_client.delete(core.keys.record("op")))),
        "a fingerprint sent as text": Case(changed(lambda r, args: {"argv1": r.fingerprint})),
        "a fingerprint's bytes after another first byte": Case(
            changed(lambda r, args: {"argv1": b"x" + bytes.fromhex(r.fingerprint)})
        ),
        "a lease of 1000.5": Case(renew(argv5="1000.5")),
        "a retention of 1e6": Case(renew(argv6="1e6")),
        "a generation written 0<gen>": Case(changed(lambda r, args: {"argv4": f"0{r.generation}"})),
        "a generation written <gen>.0": Case(
            changed(lambda r, args: {"argv4": f"{r.generation}.0"})
        ),
        "a generation written ' <gen>'": Case(
            changed(lambda r, args: {"argv4": f" {r.generation}"})
        ),
        "an unclaimed shard": Case(changed(unclaimed)),
        "an unclaimed shard, claiming": Case(
            changed(lambda r, args: {**unclaimed(r, args), "argv8": "1"})
        ),
        "crafted, updated after created, the lease ending as it renews": Case(
            crafted(updated=500, lease=40_000, pin=lambda created: created + 40_500)
        ),
        "crafted, updated after created, the lease ending just after": Case(
            crafted(updated=500, lease=40_000, pin=lambda created: created + 40_499)
        ),
        "crafted, updated after created, the log outliving the record": Case(
            crafted(updated=500, lexp=ten_days)
        ),
    }
    answered = _run(settler, redis_client, "renew", cases)
    must = {
        *CRAFTED_ANSWERED,
        "crafted, the log outliving the record",
        "crafted, updated after created",
        "crafted, updated after created, the lease ending just after",
        "crafted, updated after created, the log outliving the record",
        "crafted, no record expiry",
        "a retention of 1e6",
        "crafted, the lease ending just after",
        "the attempt's renewal",
        "renewed before",
        "after the same attempt reserved again",
        "a lease of 1 s",
        "a retention of 5 s",
        "the attempt that took over (its log holds the first one's)",
    }
    _exactly(answered, must)


#: Forms an argument could take in a call settle did not make (settle sends decimal
#: integers, which the third branch draws often so the heads also write).
FORMS = st.one_of(
    st.sampled_from(
        [
            *("1", "2", "01", "1.0", " 1", "0x1", "1e0", "-0", "-1", "0", "1.5", "inf", "-inf"),
            *("nan", "9007199254740993", "1099511627776", "abc", ""),
        ]
    ),
    st.integers(-(2**60), 2**60).map(str),
    st.integers(1, 10**9).map(str),
)
#: A fifth of the profile's examples (each runs five ways); the settler fixture is one per
#: test, and _run starts every example from its namespace's metadata and shard alone.
DRAWN = settings(
    settings.default,
    max_examples=max(10, settings.default.max_examples // 5),
    suppress_health_check=[
        *settings.default.suppress_health_check,
        HealthCheck.function_scoped_fixture,
    ],
)


@DRAWN
@given(fpv=FORMS, lease=FORMS, retention=FORMS, cap=FORMS)
def test_a_new_reserve_in_any_argument_form_is_the_whole_scripts(
    settler: Settler, redis_client: redis.Redis, fpv: str, lease: str, retention: str, cap: str
) -> None:
    def setup() -> tuple[tuple[str, ...], list[Any]]:
        call = settler._core.plan_reserve("op", REQ, principal=WHO)
        return call.keys, _with(call.args, argv3=fpv, argv5=lease, argv6=retention, argv8=cap)

    _run(settler, redis_client, "reserve", {"drawn": Case(setup)})


@DRAWN
@given(
    # settle's own forms half the time, so the head's write path is drawn often
    fpv=st.one_of(st.just("1"), FORMS),
    lease=st.one_of(st.just("30000"), FORMS),
    retention=st.one_of(st.just("86400000"), FORMS),
    cap=st.one_of(st.just("1000"), FORMS),
    marked=st.booleans(),
    aid=st.sampled_from([None, "attempt-2", "0a" * 16]),
)
def test_a_takeover_in_any_argument_form_is_the_whole_scripts(
    settler: Settler,
    redis_client: redis.Redis,
    fpv: str,
    lease: str,
    retention: str,
    cap: str,
    marked: bool,
    aid: str | None,
) -> None:
    """A reserve of an operation marked provisional, or whose lease ended (the clock is
    pinned a second ahead), by another attempt or (``0a...``) the same one."""

    def setup() -> tuple[tuple[str, ...], list[Any]]:
        got = settler.reserve("op", REQ, principal=WHO, lease=0.5, attempt_id="0a" * 16)
        assert isinstance(got, Reserved)
        if marked:
            assert settler.mark_provisional(got.reservation, "timeout").verdict.value == "accepted"
        call = settler._core.plan_reserve("op", REQ, principal=WHO, attempt_id=aid)
        return call.keys, _with(call.args, argv3=fpv, argv5=lease, argv6=retention, argv8=cap)

    _run(settler, redis_client, "reserve", {"drawn": Case(setup)})


@DRAWN
@given(
    script=st.sampled_from(SETTLEMENTS),
    # settle's own forms half the time, so the heads' write paths are drawn often
    retention=st.one_of(st.just("86400000"), FORMS),
    cap=st.one_of(st.just("64"), FORMS),
    version=st.sampled_from(["", "1", "01", "2", " 1", "1.0"]),
    digest=st.sampled_from([None, "not-hex", b"\0"]),
    reason=st.sampled_from([None, "", "provisional", "timeout", "|", "error:ValueError"]),
    marked=st.sampled_from([None, REASON, "provisional"]),
    settled=st.sampled_from([None, "complete", "fail"]),
)
def test_a_settlement_in_any_argument_form_is_the_whole_scripts(
    settler: Settler,
    redis_client: redis.Redis,
    script: str,
    retention: str,
    cap: str,
    version: str,
    digest: str | bytes | None,
    reason: str | None,
    marked: str | None,
    settled: str | None,
) -> None:
    def setup() -> tuple[tuple[str, ...], list[Any]]:
        got = settler.reserve("op", REQ, principal=WHO)
        assert isinstance(got, Reserved)
        r = got.reservation
        if marked is not None:  # marked provisional first (its reason stored as text or word)
            assert settler.mark_provisional(r, marked).verdict.value == "accepted"
        if settled == "complete":  # settled first (the call may repeat it: a duplicate)
            settler.complete(r, {"charge": "ch_1"})
        elif settled == "fail":
            settler.fail(r, ValueError("declined"))
        keys, args = _plan_settlement(settler, script, r)
        at: dict[str, Any] = {"argv11": retention, "argv12": cap, "argv6": version}
        if digest is not None:
            at["argv9"] = digest
        if reason is not None:
            at["argv10"] = reason
        return keys, _with(args, **at)

    _run(settler, redis_client, script, {"drawn": Case(setup)})


#: How a drawn test writes the reservation's own generation: as settle does, or another
#: way tonumber reads as the same number (the rules compare it as text), or another one.
GENERATIONS = st.sampled_from(["{}", "0{}", "{}.0", " {}", "{}e0", "5", ""])


@DRAWN
@given(lease=FORMS, retention=FORMS)
def test_a_renewal_in_any_lease_and_retention_form_is_the_whole_scripts(
    settler: Settler, redis_client: redis.Redis, lease: str, retention: str
) -> None:
    def setup() -> tuple[tuple[str, ...], list[Any]]:
        got = settler.reserve("op", REQ, principal=WHO)
        assert isinstance(got, Reserved)
        call = settler._core.plan_renew(got.reservation)
        return call.keys, _with(call.args, argv5=lease, argv6=retention)

    _run(settler, redis_client, "renew", {"drawn": Case(setup)})


@DRAWN
@given(fpv=st.sampled_from(["1", "01", "1.0", " 1", "2", ""]), generation=GENERATIONS)
def test_a_renewal_with_its_tuple_in_any_form_is_the_whole_scripts(
    settler: Settler, redis_client: redis.Redis, fpv: str, generation: str
) -> None:
    def setup() -> tuple[tuple[str, ...], list[Any]]:
        got = settler.reserve("op", REQ, principal=WHO)
        assert isinstance(got, Reserved)
        call = settler._core.plan_renew(got.reservation)
        written = generation.format(got.reservation.generation)
        return call.keys, _with(call.args, argv2=fpv, argv4=written)

    _run(settler, redis_client, "renew", {"drawn": Case(setup)})


def test_a_call_after_a_head_read_another_key_reads_its_own(settler: Settler) -> None:
    """A FUNCTION library's callbacks share its locals: what a head read for one call
    (HEAD_BLOB, HEAD_NOW) must never stand for the key of the next call, whether that
    call's head answers or leaves it to the rules (a repeated report is absorbed)."""

    def reserved(op: str) -> Reservation:
        got = settler.reserve(op, REQ, principal=WHO)
        assert isinstance(got, Reserved)
        return got.reservation

    a, b, c = reserved("a"), reserved("b"), reserved("c")
    assert settler.complete(a, {"charge": "ch_1"}).verdict.value == "accepted"  # head answers
    marked = settler.mark_provisional(b, "timeout: no answer")
    assert marked.verdict.value == "accepted", marked
    assert marked.record.operation_id == "b"
    assert marked.record.state.value == "provisional"
    # a head that read a value and left the call to the rules (a duplicate is absorbed)
    assert settler.complete(a, {"charge": "ch_1"}).verdict.value == "absorbed"
    marked = settler.mark_provisional(c, "timeout: no answer")
    assert marked.verdict.value == "accepted", marked
    assert marked.record.operation_id == "c"
    assert marked.record.state.value == "provisional"
    # the rules after a head that answered for another key (b's repeat is absorbed)
    again = settler.mark_provisional(b, "timeout: no answer")
    assert again.verdict.value == "absorbed", again
    assert again.record.operation_id == "b"
    assert again.record.state.value == "provisional"
