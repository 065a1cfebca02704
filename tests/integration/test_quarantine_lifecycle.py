"""The quarantine's lifecycle (SPEC §3): one entry per rejected response, explicit trim that
keeps unresolved evidence, quarantine_maxlen as a last resort that says what it dropped, and
resolutions that leave with their entries. On Redis and on the reference model alike."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

from settle import Reservation, Reserved, Settler
from settle.errors import InvalidInput
from settle.testing import ManualClock, MemorySettler

REQ = {"amount": 1}
WHO = "tenant:acme"


@pytest.fixture(params=["redis", "model"])
def make(request: pytest.FixtureRequest, redis_url: str, namespace: str) -> Iterator[Any]:
    made: list[Settler] = []

    def build(**options: Any) -> Settler:
        if request.param == "redis":
            s = Settler.from_url(redis_url, namespace=namespace, shards=1, **options)
        else:
            s = MemorySettler(namespace=namespace, shards=1, clock=ManualClock(), **options)
        made.append(s)
        return s

    yield build
    for s in made:
        s.close()


def _stale(settler: Settler, op: str) -> tuple[Any, Any]:
    """A reservation that was taken over, and the takeover."""
    first = settler.reserve(op, REQ, principal=WHO)
    assert isinstance(first, Reserved)
    settler.mark_provisional(first.reservation, reason="timeout")
    second = settler.reserve(op, REQ, principal=WHO)
    assert isinstance(second, Reserved)
    return first.reservation, second.reservation


def test_different_responses_never_share_an_entry_whatever_their_ids_hold(make: Any) -> None:
    """Found in review: the identity joined the tuple with '|', so operation 'z' bound to
    'tenant:x|y' and operation 'y|z' bound to 'tenant:x' (same attempt and payload) were one
    response, and the second's evidence was never written."""
    settler = make()
    fp = "a" * 64

    def late(op: str, binding: str) -> Any:
        r = Reservation(
            operation_id=op,
            fingerprint=fp,
            fingerprint_version=1,
            binding=binding,
            generation=7,
            attempt_id="worker-1",
        )
        return settler.complete(r, {"charged": 100})

    a, b = late("z", "tenant:x|y"), late("y|z", "tenant:x")
    assert a.quarantine_id != b.quarantine_id
    assert settler.quarantine.get(b.quarantine_id).operation_id == "y|z"
    assert len(settler.quarantine.list(operation_id="y|z")) == 1


def test_the_same_rejected_response_delivered_again_stays_one_entry(make: Any) -> None:
    settler = make()
    old, _ = _stale(settler, "op-1")
    first = settler.complete(old, {"late": 1})
    again = settler.complete(old, {"late": 1})
    other = settler.complete(old, {"late": 2})  # another payload: another response
    assert first.quarantine_id == again.quarantine_id
    assert other.quarantine_id != first.quarantine_id
    assert len(settler.quarantine.list(operation_id="op-1")) == 2
    # Every delivery is still observed in the attempt log.
    assert [a.verdict for a in settler.attempts("op-1")][-3:] == ["quarantined"] * 3


def test_trim_deletes_resolved_entries_and_keeps_unresolved_evidence(make: Any) -> None:
    settler = make()
    old, _ = _stale(settler, "op-1")
    keep = settler.complete(old, {"late": 1}).quarantine_id
    gone = settler.complete(old, {"late": 2}).quarantine_id
    assert keep is not None
    assert gone is not None
    settler.quarantine.resolve(gone, note="refunded")
    done = settler.quarantine.trim()
    assert (done.removed, done.unresolved) == (1, 0)
    assert [e.ref for e in settler.quarantine.list()] == [keep]
    # The same response delivered after its entry was trimmed is evidence again.
    assert settler.complete(old, {"late": 2}).quarantine_id not in (None, gone)
    with pytest.raises(InvalidInput, match="older_than"):
        settler.quarantine.trim(include_unresolved=True)
    assert settler.quarantine.trim(older_than=3600, include_unresolved=True).removed == 0
    assert len(settler.quarantine.list()) == 2


def test_quarantine_maxlen_drops_the_oldest_with_their_resolutions_and_warns(make: Any) -> None:
    settler = make(quarantine_maxlen=2)
    old, _ = _stale(settler, "op-1")
    ids = [settler.complete(old, {"late": i}).quarantine_id for i in range(2)]
    assert ids[0] is not None
    settler.quarantine.resolve(ids[0], note="ok")
    with capture_logs() as logs:
        settler.complete(old, {"late": 2})  # pushes the resolved one out: no warning
        settler.complete(old, {"late": 3})  # pushes an unresolved one out: a warning
    dropped = [e for e in logs if e["event"] == "settle.quarantine.maxlen_dropped_unresolved"]
    assert [e["dropped"] for e in dropped] == [1]
    assert len(settler.quarantine.list()) == 2
    assert all(e.resolution is None for e in settler.quarantine.list())


def test_a_repeat_of_a_write_that_pushed_evidence_out_says_it_again(make: Any) -> None:
    """The same rejected response delivered again (a repeat after a lost reply is one) gets
    its first entry back with the count of unresolved entries that entry's write pushed
    out: the repeat of a call whose reply was lost answered 0, and the warning was never
    logged (tests/faults/test_faults_quarantine_lost_reply.py)."""
    settler = make(quarantine_maxlen=1)
    old, _ = _stale(settler, "op-1")
    with capture_logs() as logs:
        first = settler.complete(old, {"late": 1})  # nothing to push out
        second = settler.complete(old, {"late": 2})  # pushes the first out
        again = settler.complete(old, {"late": 2})  # the same response again
        once_more = settler.complete(old, {"late": 1})  # the first, gone: written again
    assert again.quarantine_id == second.quarantine_id != first.quarantine_id
    assert once_more.quarantine_id not in (first.quarantine_id, second.quarantine_id)
    dropped = [e for e in logs if e["event"] == "settle.quarantine.maxlen_dropped_unresolved"]
    assert [(e["dropped"], e["repeated"]) for e in dropped] == [(1, False), (1, True), (1, False)]
    assert [e.ref for e in settler.quarantine.list()] == [once_more.quarantine_id]


def test_resolutions_and_identities_leave_with_their_entries(
    redis_url: str, namespace: str
) -> None:
    settler = Settler.from_url(redis_url, namespace=namespace, shards=1)
    try:
        old, _ = _stale(settler, "op-1")
        for i in range(3):
            qid = settler.complete(old, {"late": i}).quarantine_id
            assert qid is not None
            settler.quarantine.resolve(qid, note="done")
        keys = settler._core.keys
        assert settler.quarantine.trim().removed == 3
        with redis.Redis.from_url(redis_url) as raw:
            assert raw.xlen(keys.quarantine(0)) == 0
            assert raw.exists(keys.resolutions(0), keys.identities(0)) == 0
    finally:
        settler.close()


def test_two_workers_delivering_the_same_response_at_once_make_one_entry(
    redis_url: str, namespace: str
) -> None:
    """The same late response sent by two workers (each its own connection pool) at the
    same moment, many times over: one entry, every delivery given its id, one not a repeat."""
    settlers = [Settler.from_url(redis_url, namespace=namespace, shards=4) for _ in range(2)]
    try:
        old, _ = _stale(settlers[0], "op-1")
        start = threading.Barrier(2)
        got: list[list[Any]] = [[], []]

        def deliver(i: int) -> None:
            start.wait()
            for _ in range(25):
                got[i].append(settlers[i].complete(old, {"late": 1}))

        workers = [threading.Thread(target=deliver, args=(i,)) for i in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        settlements = got[0] + got[1]
        assert len({s.quarantine_id for s in settlements}) == 1
        assert sum(not s.quarantine_repeated for s in settlements) == 1
        assert [e.ref for e in settlers[1].quarantine.list()] == [settlements[0].quarantine_id]
    finally:
        for s in settlers:
            s.close()


def test_a_trim_replaces_a_kept_reply_it_cannot_read_and_keeps_its_own_a_day(
    make: Any, redis_url: str
) -> None:
    """The shard's ``quarantine:trimmed`` key only keeps the last trim call's reply for a
    repeat of that call. Found in review: a key of another type there (a hand-made key, a
    restore gone wrong) failed every trim of the shard with a WRONGTYPE ``BackendError``
    ("check that the server is reachable") for as long as the key stayed, with no expiry to
    end it. A trim now reads no reply from it and replaces it with its own, kept a day."""
    settler = make()
    key = settler._core.keys.trimmed(0)
    keyspace = getattr(settler._runner, "keyspace", None)  # the model's
    if keyspace is not None:
        keyspace.hset(key, keyspace.clock(), b"not", b"a reply")
    else:
        with redis.Redis.from_url(redis_url) as raw:
            raw.hset(key, "not", "a reply")
    old, _ = _stale(settler, "op-1")
    ref = settler.complete(old, {"late": 1}).quarantine_id
    settler.quarantine.resolve(ref, note="checked")
    done = settler.quarantine.trim()
    assert (done.removed, done.unresolved) == (1, 0)
    assert settler.quarantine.list() == []
    if keyspace is None:
        with redis.Redis.from_url(redis_url) as raw:
            assert raw.type(key) == b"string"
            assert 0 < raw.pttl(key) <= 86_400_000
