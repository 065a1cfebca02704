"""Real worker processes killed (SIGKILL) at each cut of apply -> progress -> ack.

The stream lives on one redis-server and the progress on another. For every cut: each
message's effect takes hold exactly once (the ledger on the progress server), and nothing is
acknowledged before durable progress covers it (checked right after the kill, and at the end).
"""

from __future__ import annotations

import pytest
import redis

from settle.embedded import EmbeddedRedis
from settle.progress import DeliveryId, ProgressStore
from settle.progress._scripts import STREAM
from tests.faults.servers import script_needle
from tests.progress.harness import (
    DropReplyProxy,
    Names,
    Worker,
    assert_nothing_acked_uncovered,
    counts,
    dead_letters_on_stream,
    pending_ids,
    progress_covers,
    publish,
    receipts,
    wait_until,
)

pytestmark = pytest.mark.faults

EMISSIONS = [f"e{i}" for i in range(6)]


def read_progress(progress_server: EmbeddedRedis, names: Names):
    store = ProgressStore.from_url(
        progress_server.url, consumer=names.consumer, namespace=names.namespace
    )
    try:
        return store.show()
    finally:
        store.close()


def drained(stream_client: redis.Redis, progress_client: redis.Redis, names: Names, n: int):
    def check() -> bool:
        effects = counts(progress_client, names.ledger[0])
        return len(effects) >= n and not pending_ids(stream_client, names)

    return check


def floor_reached(progress_server: EmbeddedRedis, names: Names, last: str):
    return lambda: DeliveryId(last) in {p.floor for p in read_progress(progress_server, names)}


def finish(stream_server, progress_server, stream_client, progress_client, names, n=6):
    """Run a fresh worker until everything is applied and acknowledged; then check."""
    worker = Worker(names, stream_server.url, progress_server.url, worker="finisher")
    last = stream_client.xrevrange(names.stream, count=1)[0][0].decode()
    try:
        wait_until(drained(stream_client, progress_client, names, n), what="all applied and acked")
        wait_until(lambda: not read_progress(progress_server, names)[0].intents, what="intents")
        wait_until(floor_reached(progress_server, names, last), what="the floor at the end")
    finally:
        worker.kill()
    assert_nothing_acked_uncovered(stream_client, progress_client, names)
    effects = counts(progress_client, names.ledger[0])
    assert effects == dict.fromkeys(EMISSIONS[:n], 1), effects
    return counts(progress_client, names.ledger[2])


def test_cut_after_effect_before_progress(
    names, stream_server, progress_server, stream_client, progress_client
):
    ids = publish(stream_client, names, EMISSIONS)
    w = Worker(
        names,
        stream_server.url,
        progress_server.url,
        worker="w1",
        kill_at=("effect_applied", ids[2]),
    )
    w.wait_killed()
    assert counts(progress_client, names.ledger[0])["e2"] == 1  # the effect happened...
    assert not progress_covers(progress_client, names, ids[2])  # ...progress did not
    assert ids[2] in pending_ids(stream_client, names)  # so it was not acknowledged
    assert_nothing_acked_uncovered(stream_client, progress_client, names)
    invocations = finish(stream_server, progress_server, stream_client, progress_client, names)
    # Redelivered, so the effect ran again under the same idempotency key: it took hold once.
    assert invocations == {**dict.fromkeys(EMISSIONS, 1), "e2": 2}
    [progress] = read_progress(progress_server, names)
    assert progress.floor == DeliveryId(ids[-1])
    assert progress.gaps == ()


def test_cut_after_progress_before_ack(
    names, stream_server, progress_server, stream_client, progress_client
):
    ids = publish(stream_client, names, EMISSIONS)
    w = Worker(
        names,
        stream_server.url,
        progress_server.url,
        worker="w1",
        kill_at=("progress_recorded", ids[2]),
    )
    w.wait_killed()
    assert progress_covers(progress_client, names, ids[2])
    assert ids[2] in pending_ids(stream_client, names)
    [progress] = read_progress(progress_server, names)
    assert DeliveryId(ids[2]) in {i.delivery for i in progress.intents}  # the settle intent
    assert_nothing_acked_uncovered(stream_client, progress_client, names)
    invocations = finish(stream_server, progress_server, stream_client, progress_client, names)
    assert invocations == dict.fromkeys(EMISSIONS, 1)  # settled again, never re-applied
    mine = [r for r in receipts(progress_client, names) if r["delivery"] == ids[2]]
    # Recovery first tried the open intent and was refused (the dead worker still owned it);
    # once the delivery was reclaimed, progress covered it and it was acknowledged.
    assert [(r["worker"], r["outcome"], r["owner"], r["deliveries"]) for r in mine] == [
        ("finisher", "not_owner", "w1", "1"),
        ("finisher", "acked", "finisher", "2"),
    ]


def test_cut_after_ack_sent_before_its_reply(
    names, stream_server, progress_server, stream_client, progress_client
):
    ids = publish(stream_client, names, EMISSIONS)
    proxy = DropReplyProxy(stream_server.port, ids[2], script_needle(STREAM, "stream_settle"))
    try:
        w = Worker(names, proxy.url, progress_server.url, worker="w1")
        proxy.victim = w.proc.pid
        w.wait_killed()
    finally:
        proxy.close()
    assert proxy.fired.is_set()
    # The acknowledgement ran on the server; the worker died before learning it.
    assert ids[2] not in pending_ids(stream_client, names)
    [progress] = read_progress(progress_server, names)
    assert DeliveryId(ids[2]) in {i.delivery for i in progress.intents}
    assert_nothing_acked_uncovered(stream_client, progress_client, names)
    invocations = finish(stream_server, progress_server, stream_client, progress_client, names)
    assert invocations == dict.fromkeys(EMISSIONS, 1)
    # Recovery closed the intent with what the provider said: no longer pending.
    mine = [r for r in receipts(progress_client, names) if r["delivery"] == ids[2]]
    assert [(r["worker"], r["outcome"]) for r in mine] == [("finisher", "not_pending")]


def test_stale_worker_cannot_ack_a_reclaimed_delivery(
    names, stream_server, progress_server, stream_client, progress_client
):
    ids = publish(stream_client, names, EMISSIONS)
    # a applies ids[2], records progress, and stalls before its acknowledgement.
    a = Worker(
        names,
        stream_server.url,
        progress_server.url,
        worker="a",
        claim_idle=60,
        batch=1,
        stop_at=("progress_recorded", ids[2]),
    )
    b = None
    try:
        a.wait_stopped()
        # b reclaims the stuck delivery (XAUTOCLAIM) and stalls holding it.
        b = Worker(
            names,
            stream_server.url,
            progress_server.url,
            worker="b",
            claim_idle=0.2,
            stop_at=("claimed", ids[2]),
        )
        b.wait_stopped()
        assert pending_ids(stream_client, names)[ids[2]] == ("b", 2)
        a.cont()  # a wakes up and tries to acknowledge what it no longer owns

        def refused() -> bool:
            return any(
                r["delivery"] == ids[2] and r["worker"] == "a"
                for r in receipts(progress_client, names)
            )

        wait_until(refused, what="a's settlement attempt")
        [mine] = [
            r
            for r in receipts(progress_client, names)
            if r["delivery"] == ids[2] and r["worker"] == "a"
        ]
        assert (mine["outcome"], mine["owner"], mine["acked"]) == ("not_owner", "b", "0")
        assert pending_ids(stream_client, names)[ids[2]] == ("b", 2)
        b.cont()
        wait_until(drained(stream_client, progress_client, names, 6), what="drained")
        wait_until(lambda: not read_progress(progress_server, names)[0].intents)
        wait_until(floor_reached(progress_server, names, ids[-1]), what="the floor at the end")
    finally:
        a.kill()
        if b:
            b.kill()
    assert_nothing_acked_uncovered(stream_client, progress_client, names)
    assert counts(progress_client, names.ledger[0]) == dict.fromkeys(EMISSIONS, 1)
    # The reclaimed delivery was applied once: b found it covered and only acknowledged it.
    # (Other deliveries may legitimately run twice if b reclaims one a is still working on;
    # their effects still took hold once, above.)
    assert counts(progress_client, names.ledger[2])["e2"] == 1
    by_b = [r for r in receipts(progress_client, names) if r["worker"] == "b"]
    assert ("acked", ids[2]) in {(r["outcome"], r["delivery"]) for r in by_b}


def test_out_of_order_completion_then_restart(
    names, stream_server, progress_server, stream_client, progress_client
):
    ids = publish(stream_client, names, EMISSIONS[:4])
    # w1 applies 1 (ids[0]), takes 2 (ids[1]) and dies holding it.
    w1 = Worker(
        names,
        stream_server.url,
        progress_server.url,
        worker="w1",
        batch=1,
        kill_at=("received", ids[1]),
    )
    w1.wait_killed()
    # w2 never reclaims (long idle): it applies 3 and 4 while 2 is pending elsewhere.
    w2 = Worker(names, stream_server.url, progress_server.url, worker="w2", claim_idle=60)
    try:

        def three_and_four() -> bool:
            p = read_progress(progress_server, names)
            return (
                bool(p)
                and set(p[0].applied_above_floor) == {DeliveryId(i) for i in ids[2:]}
                and p[0].gaps == (DeliveryId(ids[1]),)  # w2's observation after applying them
            )

        wait_until(three_and_four, what="3 and 4 applied")
        wait_until(lambda: ids[3] not in pending_ids(stream_client, names))
    finally:
        w2.kill()
    [progress] = read_progress(progress_server, names)
    assert progress.floor == DeliveryId(ids[0])  # stays at 1
    assert progress.gaps == (DeliveryId(ids[1]),)
    assert progress.applied_above_floor == (DeliveryId(ids[2]), DeliveryId(ids[3]))
    assert progress.replay_from.after == DeliveryId(ids[0])
    assert pending_ids(stream_client, names) == {ids[1]: ("w1", 1)}
    assert counts(progress_client, names.ledger[0]) == {"e0": 1, "e2": 1, "e3": 1}
    assert_nothing_acked_uncovered(stream_client, progress_client, names)

    invocations = finish(stream_server, progress_server, stream_client, progress_client, names, 4)
    assert invocations == dict.fromkeys(EMISSIONS[:4], 1)
    [progress] = read_progress(progress_server, names)
    assert progress.floor == DeliveryId(ids[3])
    assert progress.gaps == ()
    [redelivered] = [r for r in receipts(progress_client, names) if r["delivery"] == ids[1]]
    assert (redelivered["worker"], redelivered["deliveries"]) == ("finisher", "2")


def test_poison_message_over_the_delivery_limit(
    names, stream_server, progress_server, stream_client, progress_client
):
    ids = publish(stream_client, names, ["e0", "poison", "e2"])
    # Killed right after the dead letter is durable, before the provider is told.
    w1 = Worker(
        names,
        stream_server.url,
        progress_server.url,
        worker="w1",
        claim_idle=0.05,
        max_deliveries=2,
        poison=("poison",),
        kill_at=("dead_letter_recorded", ids[1]),
    )
    w1.wait_killed()
    assert progress_covers(progress_client, names, ids[1])
    assert ids[1] in pending_ids(stream_client, names)
    assert dead_letters_on_stream(stream_client, names) == []
    w2 = Worker(
        names,
        stream_server.url,
        progress_server.url,
        worker="w2",
        claim_idle=0.05,
        max_deliveries=2,
        poison=("poison",),
    )
    try:
        wait_until(lambda: not pending_ids(stream_client, names), what="drained")
        wait_until(lambda: not read_progress(progress_server, names)[0].intents)
        wait_until(floor_reached(progress_server, names, ids[-1]), what="the floor at the end")
    finally:
        w2.kill()
    assert_nothing_acked_uncovered(stream_client, progress_client, names)
    assert counts(progress_client, names.ledger[0]) == {"e0": 1, "e2": 1}
    assert counts(progress_client, names.ledger[2]) == {"e0": 1, "poison": 2, "e2": 1}
    [dead] = dead_letters_on_stream(stream_client, names)  # told once
    assert (dead["delivery"], dead["emission"], dead["reason"]) == (
        ids[1],
        "poison",
        "delivery_limit",
    )
    [progress] = read_progress(progress_server, names)
    assert progress.floor == DeliveryId(ids[-1])


def test_stream_server_restarted_without_persistence(names, progress_server, progress_client):
    stream_server = EmbeddedRedis().start()
    port = stream_server.port
    stream_client = redis.Redis.from_url(stream_server.url)
    w = Worker(names, stream_server.url, progress_server.url, worker="w1")
    try:
        first = publish(stream_client, names, EMISSIONS)
        wait_until(drained(stream_client, progress_client, names, 6), what="first run")
        wait_until(floor_reached(progress_server, names, first[-1]), what="first floor")
        stream_server.stop(kill=True)  # the stream, its group and its PEL are gone
        stream_server = EmbeddedRedis(port=port, directory=str(stream_server.directory)).start()
        # Its entries are gone. The stream itself may be back already: the running worker
        # reconnects and makes its group again with MKSTREAM (an empty stream), which raced
        # an `exists` here under load.
        assert stream_client.xlen(names.stream) == 0
        # The producer publishes again (at-least-once), plus two new emissions.
        more = [*EMISSIONS, "e6", "e7"]
        second = publish(stream_client, names, more)
        wait_until(drained(stream_client, progress_client, names, 8), what="second run")
        wait_until(floor_reached(progress_server, names, second[-1]), what="second floor")
        wait_until(lambda: all(not p.intents for p in read_progress(progress_server, names)))
    finally:
        w.kill()
        stream_server.close()
    assert counts(progress_client, names.ledger[0]) == dict.fromkeys(more, 1)
    assert counts(progress_client, names.ledger[2]) == dict.fromkeys(more, 1)
    scopes = read_progress(progress_server, names)
    assert len(scopes) == 2  # one per stream incarnation, never compared with each other
    floors = {p.floor for p in scopes}
    assert floors == {DeliveryId(first[-1]), DeliveryId(second[-1])}
    stream_client.close()
