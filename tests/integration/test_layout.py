"""The packed record layout (docs/concepts.md, "The record in Redis"): one value per
operation, the same bytes from the Lua and from settle/_core/layout.py, and records written
by the previous layout (a HASH beside an attempt-log LIST) read as they are and rewritten
packed by their next write, on Redis and in the reference model alike."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from settle import InProgress, Replay, Reservation, Reserved, Settler, State, Verdict, fingerprint
from settle._core.layout import LOG_MAX, MAGIC, WORDS, _mp, pack, unpack
from settle.errors import CorruptRecord, InvalidInput
from settle.models import ms_to_datetime
from settle.testing import MemorySettler

WHO = "tenant:acme"
REQ = {"order": 7}
OLD_FP = "9b" * 32
OLD_AID = "0f" * 16
OLD_GEN = "1796000000000001"
CREATED = 1_796_000_000_000


def test_every_state_is_stored_in_the_format_layout_py_reads_and_writes(
    settler: Settler, redis_client: redis.Redis
) -> None:
    """Whatever the scripts stored, layout.py decodes it to what the API shows and encodes
    it back to the very same bytes: the model and the tests read what Redis holds."""
    pending = settler.reserve("p", REQ, principal=WHO).reservation  # type: ignore[union-attr]
    provisional = settler.reserve("v", REQ, principal=WHO).reservation  # type: ignore[union-attr]
    settler.mark_provisional(provisional, "timeout: no answer")
    done = settler.reserve("c", REQ, principal=WHO).reservation  # type: ignore[union-attr]
    settler.complete(done, b"\x00\xff binary result")
    failed = settler.reserve("f", REQ, principal=WHO).reservation  # type: ignore[union-attr]
    settler.fail(failed, ValueError("declined"))
    settler.complete(pending.model_copy(update={"operation_id": "ghost"}), {"late": True})
    for op in ("p", "v", "c", "f", "ghost"):
        blob = redis_client.get(settler._core.keys.record(op))
        assert isinstance(blob, bytes)
        stored = unpack(blob)
        assert pack(stored) == blob
        assert [a.verdict for a in settler.attempts(op)] == [
            e.split(b"|")[3].decode() for e in stored.log
        ]
        record = settler.get(op)
        if op == "ghost":  # only the attempt log of a response for an unknown operation
            assert record is None
            assert stored.record is None
            continue
        assert record is not None
        assert stored.record is not None
        assert stored.record[b"fp"].decode() == record.fingerprint
        assert int(stored.record[b"ver"]) == record.version
        assert stored.record[b"state"].decode() == record.state.value
        assert stored.record.get(b"result") == record.result
        assert b"op" not in stored.record  # the key says it


def test_a_settled_operation_is_one_key_of_at_most_320_bytes(
    settler: Settler, redis_client: redis.Redis
) -> None:
    got = settler.reserve("order-000042", REQ, principal=WHO)
    settler.complete(got.reservation, b"x" * 40)  # type: ignore[union-attr]
    pattern = f"settle:{{{settler.config.namespace}:*}}:*order-000042"
    keys = list(redis_client.scan_iter(match=pattern))
    assert keys == [settler._core.keys.record("order-000042").encode()]
    size = redis_client.memory_usage(keys[0], samples=0)
    assert size is not None
    assert size <= 320


class _Legacy:
    """Writes a record the way settle wrote it before the packed layout."""

    def __init__(self, settler: Any, client: redis.Redis | None) -> None:
        self.settler, self.client = settler, client
        self.ks: Any = None if client is not None else settler._runner.keyspace

    def write(self, op: str, fields: dict[str, Any], log: list[str], ttl_ms: int) -> None:
        record, log_key = (
            self.settler._core.keys.record(op),
            self.settler._core.keys.attempt_log(op),
        )
        if self.client is not None:
            self.client.hset(record, mapping={k: str(v) for k, v in fields.items()})
            self.client.pexpire(record, ttl_ms)
            self.client.rpush(log_key, *log)
            self.client.pexpire(log_key, ttl_ms)
            return
        now = self.ks.clock()
        self.ks.hset(record, now, *(x for kv in fields.items() for x in kv))
        self.ks.pexpire(record, ttl_ms, now)
        for entry in log:
            self.ks.rpush(log_key, now, entry)
        self.ks.pexpire(log_key, ttl_ms, now)

    def plant(self, op: str, blob: bytes, ttl_ms: int = 3_600_000) -> None:
        """Store a crafted packed value (any value layout.py can write) as the record."""
        key = self.settler._core.keys.record(op)
        if self.client is not None:
            self.client.set(key, blob, px=ttl_ms)
            return
        self.ks.set(key, self.ks.clock(), blob, ttl_ms)

    def kinds(self, op: str) -> tuple[str, str]:
        record, log_key = (
            self.settler._core.keys.record(op),
            self.settler._core.keys.attempt_log(op),
        )
        if self.client is not None:
            kinds: list[Any] = [self.client.type(record), self.client.type(log_key)]
            return kinds[0].decode(), kinds[1].decode()
        now = self.ks.clock()
        return self.ks.type(record, now), self.ks.type(log_key, now)


@pytest.fixture(params=["redis", "model"])
def side(request: pytest.FixtureRequest, redis_url: str, namespace: str) -> Iterator[_Legacy]:
    if request.param == "redis":
        settler = Settler.from_url(redis_url, namespace=namespace)
        client = redis.Redis.from_url(redis_url)
        yield _Legacy(settler, client)
        client.close()
    else:
        settler = MemorySettler(namespace=namespace)
        yield _Legacy(settler, None)
    settler.close()


def _old_pending(side: _Legacy, op: str, log: list[str] | None = None) -> None:
    side.write(
        op,
        {
            "op": op,
            "fp": OLD_FP,
            "fpv": "1",
            "bind": WHO,
            "gen": OLD_GEN,
            "ver": "1",
            "state": "pending",
            "n": "1",
            "created": str(CREATED),
            "updated": str(CREATED),
            "lease": str(4_102_444_800_000),  # 2100: still live
            "aid": OLD_AID,
        },
        log or [f"{OLD_AID}|{OLD_GEN}|reserve|reserved|new|{CREATED}"],
        3_600_000,
    )


def test_a_record_of_the_previous_layout_is_read_and_rewritten_packed(side: _Legacy) -> None:
    _old_pending(side, "old")
    record = side.settler.get("old")
    assert record is not None
    assert record.state is State.PENDING
    assert record.fingerprint == OLD_FP
    assert record.generation == int(OLD_GEN)
    assert [a.action for a in side.settler.attempts("old")] == ["reserve"]
    assert side.kinds("old") == ("hash", "list")  # reading changes nothing
    renewed = side.settler.renew(_reservation(record))
    assert renewed.renewed
    assert side.kinds("old") == ("string", "none")  # the first write packs it
    settled = side.settler.complete(_reservation(record), {"ok": 1})
    assert settled.verdict is Verdict.ACCEPTED
    assert settled.record is not None
    assert settled.record.version == 2
    assert settled.record.created_at == record.created_at
    observed = side.settler.attempts("old")
    assert [(a.action, a.verdict) for a in observed] == [
        ("reserve", "reserved"),
        ("complete", "accepted"),
    ]
    assert observed[0].attempt_id == OLD_AID


def test_a_settlement_of_a_previous_layout_record_keeps_its_verdicts(side: _Legacy) -> None:
    _old_pending(side, "old")
    record = side.settler.get("old")
    assert record is not None
    stale = _reservation(record).model_copy(update={"generation": 5})
    assert side.settler.complete(stale, {"ok": 1}).verdict is Verdict.QUARANTINED
    assert side.kinds("old") == ("string", "none")
    assert side.settler.get("old") == record  # the record is unchanged, only packed
    assert [a.verdict for a in side.settler.attempts("old")] == ["reserved", "quarantined"]


def test_a_previous_layout_log_longer_than_any_cap_keeps_its_newest_entries(
    side: _Legacy,
) -> None:
    """The HASH layout allowed logs of 10,000 entries; a packed value holding more than
    LOG_MAX would never decode again (CorruptRecord on every call), so a rewrite keeps the
    newest LOG_MAX, and the record reads and settles after it."""
    log = [f"{OLD_AID}|{OLD_GEN}|reserve|reserved|new|{CREATED + i}" for i in range(2000)]
    _old_pending(side, "old", log)
    record = side.settler.get("old")
    assert record is not None
    assert side.settler.renew(_reservation(record)).renewed  # the first write packs it
    assert side.kinds("old") == ("string", "none")
    kept = side.settler.attempts("old")
    assert [round(a.at.timestamp() * 1000) for a in kept] == [
        CREATED + i for i in range(2000 - LOG_MAX, 2000)
    ]
    assert side.settler.complete(_reservation(record), {"ok": 1}).verdict is Verdict.ACCEPTED
    assert len(side.settler.attempts("old")) == 64  # the next observed call applies the cap


def _reservation(record: Any) -> Any:
    from settle.models import Reservation  # noqa: PLC0415

    return Reservation(
        operation_id=record.operation_id,
        fingerprint=record.fingerprint,
        fingerprint_version=record.fingerprint_version,
        binding=record.binding,
        generation=record.generation,
        attempt_id=record.attempt_id,
    )


def test_a_log_at_its_cap_drops_its_oldest_entries_and_stays_in_the_format(
    redis_url: str, namespace: str, redis_client: redis.Redis
) -> None:
    """At the cap every write drops the oldest entry, so the new first entry is written
    against the record (another attempt, another generation): the scripts write the bytes
    layout.py writes, and the log shows the last entries with their own attempts."""
    settler = Settler.from_url(redis_url, namespace=namespace, attempt_log_size=3)
    first = settler.reserve("capped", REQ, principal=WHO).reservation
    assert first is not None
    settler.mark_provisional(first, "timeout: no answer")
    second = settler.reserve("capped", REQ, principal=WHO).reservation
    assert second is not None
    calls = [
        lambda: settler.complete(first, {"late": True}),
        lambda: settler.complete(second, {"ok": 1}),
        *[lambda: settler.complete(second, {"ok": 1})] * 3,
    ]
    seen = [
        (first.attempt_id, first.generation, "reserve", "reserved"),
        (first.attempt_id, first.generation, "mark_provisional", "accepted"),
        (second.attempt_id, second.generation, "reserve", "reserved"),
        (first.attempt_id, first.generation, "complete", "quarantined"),
        (second.attempt_id, second.generation, "complete", "accepted"),
        *[(second.attempt_id, second.generation, "complete", "absorbed")] * 3,
    ]
    for logged, call in enumerate([lambda: None, *calls], start=3):
        call()
        blob = redis_client.get(settler._core.keys.record("capped"))
        assert isinstance(blob, bytes)
        assert pack(unpack(blob)) == blob
        log = settler.attempts("capped")
        assert [(a.attempt_id, a.generation, a.action, a.verdict) for a in log] == seen[
            logged - 3 : logged
        ]
        assert [a.at for a in log] == sorted(a.at for a in log)
    settler.close()


def test_the_largest_attempt_log_allowed_is_read_and_appended_to(
    redis_url: str, namespace: str, redis_client: redis.Redis
) -> None:
    """A script decodes the whole packed value and packs the log back in parts: a log at the
    largest cap (1000 entries) must still read and take a new entry (past ~666 entries the
    whole log once overflowed cmsgpack's stack: every write on the operation failed)."""
    cap = 1000
    settler = Settler.from_url(redis_url, namespace=namespace, shards=1, attempt_log_size=cap)
    try:
        first = settler.reserve("big", REQ, principal=WHO).reservation
        assert first is not None
        key = settler._core.keys.record("big")
        value = unpack(redis_client.get(key) or b"")
        (seconds, micros) = redis_client.time()
        at = seconds * 1000 + micros // 1000
        stale = f"{first.attempt_id}|{first.generation - 1}|complete|quarantined|stale_generation"
        value.log = [value.log[0]] + [f"{stale}|{at}".encode()] * (cap - 1)
        redis_client.set(key, pack(value), px=3_600_000)
        assert len(settler.attempts("big")) == cap

        settler.complete(first, {"ok": 1})
        blob = redis_client.get(key)
        assert isinstance(blob, bytes)
        assert pack(unpack(blob)) == blob
        log = settler.attempts("big")
        assert len(log) == cap  # the oldest entry (the reservation) dropped
        assert (log[-1].action, log[-1].verdict) == ("complete", "accepted")
        assert settler.get("big").state is State.COMPLETED
    finally:
        settler.close()


def test_a_larger_attempt_log_is_refused_up_front(redis_url: str, namespace: str) -> None:
    with pytest.raises(InvalidInput, match="attempt_log_size"):
        Settler.from_url(redis_url, namespace=namespace, attempt_log_size=1001)


def _crafted_completed(s: Settler, client: redis.Redis, record_aid: Any, log_aid: Any) -> bytes:
    """Store a completed record of operation "op" with these attempt ids (as MessagePack
    values, in whatever form), absorb a repeated mark_provisional of it, return the value."""
    fp = s._core.plan_reserve("op", REQ, principal=WHO).args[1]
    assert isinstance(fp, bytes)
    created = int(time.time() * 1000) - 1000
    completed, reserve, reserved, new = (
        WORDS.index(w) + 1 for w in (b"completed", b"reserve", b"reserved", b"new")
    )
    record = [fp[1:], 1, WHO.encode(), int(OLD_GEN), 2, completed, 1, created, 5, None]
    record += [record_aid, None, b'{"ok":true}', bytes.fromhex("ab" * 32)]
    record += [86_400_000, 86_400_010]
    log = [log_aid, None, reserve, reserved, new, 0]
    key = s._core.keys.record("op")
    client.set(key, MAGIC + b"".join(_mp(v) for v in record + log))
    mine = Reservation(
        operation_id="op",
        fingerprint=fp[1:].hex(),
        fingerprint_version=1,
        binding=WHO,
        generation=int(OLD_GEN),
        attempt_id=OLD_AID,
    )
    assert s.mark_provisional(mine, "timeout").verdict is Verdict.ABSORBED
    blob = client.get(key)
    assert isinstance(blob, bytes)
    return blob


def test_an_attempt_id_stored_in_another_form_is_written_back_as_layout_py_writes_it(
    redis_url: str, namespace: str, redis_client: redis.Redis
) -> None:
    """A crafted value whose log entry holds the record's attempt id as text (``["0f..."]``)
    where settle stores the bytes: the next write encodes the entry as layout.py does
    (omitted, the same attempt as the record's), comparing attempt ids as their texts."""
    s = Settler.from_url(redis_url, namespace=namespace, shards=1)
    try:
        blob = _crafted_completed(s, redis_client, bytes.fromhex(OLD_AID), [OLD_AID.encode()])
        assert pack(unpack(blob)) == blob
        assert [a.attempt_id for a in s.attempts("op")] == [OLD_AID, OLD_AID]
    finally:
        s.close()


@pytest.mark.parametrize("form", ["text", "bytes"])
@pytest.mark.parametrize("size", [1, 255, 256, 257, 32004])
def test_an_attempt_id_of_any_length_in_a_crafted_value_converts_without_a_script_error(
    redis_url: str, namespace: str, redis_client: redis.Redis, size: int, form: str
) -> None:
    """Hex converts in chunks: a crafted value whose record holds an attempt id of tens of
    thousands of hex digits, as text or as bytes (settle writes at most 64 digits), is read
    and written on, not refused by Lua's stack halfway through a script that has written."""
    s = Settler.from_url(redis_url, namespace=namespace, shards=1)
    try:
        long_aid = b"ab" * size
        stored_aid: Any = [long_aid] if form == "text" else bytes.fromhex(long_aid.decode())
        blob = _crafted_completed(s, redis_client, stored_aid, None)  # the record's aid
        assert [a.attempt_id for a in s.attempts("op")] == [long_aid.decode(), OLD_AID]
        stored = unpack(blob)
        assert stored.record is not None
        assert stored.record[b"aid"] == long_aid
    finally:
        s.close()


# -- crafted values: the Lua and the reference model read them alike ----------------------

PAYLOAD = b'{"ok":true}'
GEN = 1_796_000_000_000_001


def _crafted(side: _Legacy, op: str, state: bytes, **fields: Any) -> tuple[bytes, Reservation]:
    """A packed value of operation ``op`` in ``state`` whose fields are settle's own unless
    given (fp, aid, rdig, lease, ver, n, gen: MessagePack values in any form), with one log
    entry; and the reservation of its attempt."""
    fp = side.settler._core.plan_reserve(op, REQ, principal=WHO).args[1][1:]
    now = int(time.time() * 1000)
    created = now - 1000
    values = {
        "fp": fp, "fpv": 1, "bind": WHO.encode(), "gen": GEN, "ver": 2,
        "state": WORDS.index(state) + 1, "n": 1, "created": created, "updated": 5,
        "lease": None, "aid": bytes.fromhex(OLD_AID), "reason": None, "result": None,
        "rdig": None, "rexp": 86_400_000, "lexp": 86_400_010,
    }  # fmt: skip
    if state == b"pending":
        values["lease"] = 600_000
    if state == b"completed":
        values["result"] = PAYLOAD
        values["rdig"] = bytes.fromhex(hashlib.sha256(PAYLOAD).hexdigest())
    values.update(fields)
    words = (b"reserve", b"reserved", b"new")
    log = [None, None, *(WORDS.index(w) + 1 for w in words), 0]
    blob = MAGIC + b"".join(_mp(v) for v in [*values.values(), *log])
    mine = Reservation(
        operation_id=op,
        fingerprint=fp.hex(),
        fingerprint_version=1,
        binding=WHO,
        generation=GEN,
        attempt_id=OLD_AID,
    )
    return blob, mine


def test_digests_and_attempt_ids_stored_as_their_text_compare_as_that_text(
    side: _Legacy,
) -> None:
    """A fingerprint, digest or attempt id held as its own hex text (``["9b..."]``) where
    settle stores the bytes stands for the same text: the same request replays, the same
    result is absorbed, the same attempt resumes and renews (the Lua once compared the stored
    forms and answered fingerprint_mismatch, quarantined, in_progress, lost)."""
    s = side.settler
    blob, _ = _crafted(side, "a", b"completed")
    fp = unpack(blob).record[b"fp"]  # type: ignore[index]
    blob, _ = _crafted(side, "a", b"completed", fp=[fp])
    side.plant("a", blob)
    assert isinstance(s.reserve("a", REQ, principal=WHO), Replay)
    blob, _ = _crafted(side, "e", b"completed")
    fp_e = unpack(blob).record[b"fp"]  # type: ignore[index]
    blob, _ = _crafted(side, "e", b"completed", fp=[fp_e, None])
    side.plant("e", blob)  # a trailing nil, which a Lua table cannot hold: ignored by both
    assert isinstance(s.reserve("e", REQ, principal=WHO), Replay)

    digest = hashlib.sha256(PAYLOAD).hexdigest().encode()
    blob, mine = _crafted(side, "b", b"completed", rdig=[digest])
    side.plant("b", blob)
    assert s.complete(mine, PAYLOAD).verdict is Verdict.ABSORBED

    blob, _ = _crafted(side, "c", b"pending", aid=[OLD_AID.encode()])
    side.plant("c", blob)
    resumed = s.reserve("c", REQ, principal=WHO, attempt_id=OLD_AID)
    assert isinstance(resumed, Reserved)

    blob, mine = _crafted(side, "d", b"pending", fp=[fp])
    side.plant("d", blob)
    assert s.renew(mine).renewed


def test_a_log_without_an_expiry_of_its_own_is_renewed_and_lives_with_the_record(
    side: _Legacy,
) -> None:
    """A value whose attempt log has no expiry (layout.py writes one: the log's expiry is
    optional; renew observes nothing) is renewed, not failed by a script error on every
    heartbeat."""
    blob, mine = _crafted(side, "op", b"pending", lexp=None)
    side.plant("op", blob)
    assert side.settler.renew(mine).renewed
    assert [a.attempt_id for a in side.settler.attempts("op")] == [OLD_AID]


@pytest.mark.parametrize(
    "fields",
    [
        {"ver": b"1e3"},  # Lua's tonumber took it
        {"gen": b"1_796_000_000_000_001"},  # Python's int took it
        {"n": b"x"},  # never checked: a script error on the next reserve
        {"ver": 2**53},  # beyond what a double holds exactly
        {"created": b"0x10"},
        {"fp": [b"9b" * 32, b"junk"]},  # a text form holds one text
        {"n": b"0" * 4400 + b"1"},  # longer than any integer settle writes
    ],
    ids=[
        "exponent",
        "underscores",
        "n-not-a-number",
        "ver-2^53",
        "hex-created",
        "fp-two-texts",
        "n-4401-digits",
    ],
)
def test_a_crafted_record_with_a_field_settle_never_writes_reads_as_corrupt(
    side: _Legacy, fields: dict[str, Any]
) -> None:
    """A record's integers are decimal text or MessagePack integers a double holds exactly,
    and a text form holds one text: anything else is corrupt to every script (get, reserve,
    a settlement), in the Lua and the reference model alike, and nothing is written."""
    blob, mine = _crafted(side, "op", b"provisional", **fields)
    side.plant("op", blob)
    s = side.settler
    with pytest.raises(CorruptRecord):
        s.get("op")
    with pytest.raises(CorruptRecord):
        s.reserve("op", REQ, principal=WHO)
    with pytest.raises(CorruptRecord):
        s.complete(mine, PAYLOAD)
    key = s._core.keys.record("op")
    stored = side.client.get(key) if side.client is not None else side.ks.get(key, side.ks.clock())
    assert stored == blob


def test_a_previous_layout_log_entry_that_is_not_six_fields_is_dropped(side: _Legacy) -> None:
    """An entry of the previous layout's LIST that does not split into its six fields is left
    out when the record is rewritten, by the Lua and the reference model alike."""
    _old_pending(
        side, "old", ["garbage-entry", f"{OLD_AID}|{OLD_GEN}|reserve|reserved|new|{CREATED}"]
    )
    assert [a.action for a in side.settler.attempts("old")] == ["reserve"]
    got = side.settler.reserve("old", REQ, principal=WHO, fingerprint=OLD_FP, attempt_id=OLD_AID)
    assert isinstance(got, Reserved)
    assert side.settler.complete(got.reservation, PAYLOAD).verdict is Verdict.ACCEPTED
    assert side.kinds("old") == ("string", "none")
    assert [a.action for a in side.settler.attempts("old")] == ["reserve", "complete"]


def test_every_reply_carrying_a_previous_layout_record_decodes_it(side: _Legacy) -> None:
    """A record of the previous layout (a HASH of decimal text) comes back from every script
    path that replies it without writing it, the same record each time, its numbers exact:
    get, get_many, reserve's in_progress and replay, and renew's three losses
    (stale_generation, lease_expired, not_pending). The scripts reply a row's numbers as
    Redis integers and the client refuses text there, so a path that replied the HASH's text
    as it is would make a healthy record a CorruptRecord. Nothing is rewritten."""
    fp = fingerprint(REQ)
    big = 2**53 - 1

    def old(op: str, state: str, lease: int | None) -> None:
        fields = {
            "op": op, "fp": fp, "fpv": "1", "bind": WHO, "gen": str(big), "ver": "7",
            "state": state, "n": "3", "created": str(CREATED), "updated": str(CREATED + 5),
            "aid": OLD_AID,
        }  # fmt: skip
        if lease is not None:
            fields["lease"] = str(lease)
        side.write(op, fields, [f"{OLD_AID}|{big}|reserve|reserved|new|{CREATED}"], 3_600_000)

    live = 4_102_444_800_000  # 2100
    old("live", "pending", live)
    old("ended", "pending", CREATED + 10)  # a lease that ended: renew's lease_expired
    old("done", "completed", None)
    seen: list[Any] = []
    for op in ("live", "ended", "done"):
        record = side.settler.get(op)
        assert record is not None
        assert side.settler.get_many([op]) == [record]
        assert (record.generation, record.version, record.reservations) == (big, 7, 3)
        assert record.fingerprint_version == 1
        assert record.created_at == ms_to_datetime(CREATED)
        assert record.updated_at == ms_to_datetime(CREATED + 5)
        seen.append(record)
    assert seen[0].lease_expires_at == ms_to_datetime(live)
    busy = side.settler.reserve("live", REQ, principal=WHO)
    assert isinstance(busy, InProgress)
    assert busy.record == seen[0]
    replay = side.settler.reserve("done", REQ, principal=WHO)
    assert isinstance(replay, Replay)
    assert replay.record == seen[2]
    stale = _reservation(seen[0]).model_copy(update={"generation": 5})
    for reservation, reason, record in (
        (stale, "stale_generation", seen[0]),
        (_reservation(seen[1]), "lease_expired", seen[1]),
        (_reservation(seen[2]), "not_pending", seen[2]),
    ):
        renewal = side.settler.renew(reservation)
        assert (renewal.renewed, renewal.reason) == (False, reason)
        assert renewal.record == record
    for op in ("live", "ended", "done"):
        assert side.kinds(op) == ("hash", "list")
