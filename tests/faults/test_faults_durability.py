"""Durability (SPEC 4): ``min_replicas`` against a real primary + replica, AOF against a real
``kill -9``, and the script cache lost with a restarted server. Measured figures are printed
in the "settle fault figures" section of the run (docs/operations.md quotes them)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from structlog.testing import capture_logs

from settle import (
    DurabilityError,
    QuarantineKind,
    Replay,
    Reserved,
    Settler,
    State,
    Verdict,
)
from settle._runtime.topology import has_functions
from settle.embedded import EmbeddedRedis
from tests.faults.servers import replica_of as _replica_of
from tests.faults.servers import wait_replicas as _wait_replicas
from tests.faults.tcp_proxy import FaultyProxy
from tests.faults.test_faults_ambiguous import needle, sha

pytestmark = [pytest.mark.faults]

REQ = {"amount": 1000, "currency": "EUR"}
WHO = "tenant:acme"
RESULT = {"charge": "ch_1", "amount": 1000}
REPLICA_TIMEOUT = 0.3


def _stored_state(server: EmbeddedRedis, namespace: str, op: str) -> bytes | None:
    from settle._core.keys import Keys  # noqa: PLC0415
    from settle._core.layout import unpack  # noqa: PLC0415

    with redis.Redis.from_url(server.url) as raw:
        stored: bytes | None = raw.get(Keys(namespace, 4).record(op))
        record = unpack(stored).record if stored is not None else None
        return record[b"state"] if record is not None else None


@pytest.fixture
def primary() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis().start()
    yield server
    server.close()


def _per_call_ms(s: Settler, n: int, tag: str) -> float:
    started = time.perf_counter()
    for i in range(n):
        r = s.reserve(f"{tag}-{i}", REQ, principal=WHO)
        assert isinstance(r, Reserved)
        s.complete(r.reservation, RESULT)
    return (time.perf_counter() - started) * 1000 / (2 * n)


def test_min_replicas_returns_once_the_replica_has_the_transition(
    primary: EmbeddedRedis, namespace: str, figures: dict[str, str]
) -> None:
    replica = _replica_of(primary)
    try:
        _wait_replicas(primary, 1)
        durable = Settler.from_url(
            primary.url,
            namespace=namespace,
            shards=4,
            min_replicas=1,
            replica_timeout=REPLICA_TIMEOUT,
        )
        plain = Settler.from_url(primary.url, namespace=namespace, shards=4)
        r = durable.reserve("op", REQ, principal=WHO).reservation
        assert durable.complete(r, RESULT).verdict is Verdict.ACCEPTED
        # The replica holds the completed record the moment complete() returned.
        assert _stored_state(replica, namespace, "op") == b"completed"
        figures["transition, no WAIT (loopback)"] = f"{_per_call_ms(plain, 100, 'p'):.2f} ms"
        figures["transition + WAIT 1 replica (loopback)"] = (
            f"{_per_call_ms(durable, 100, 'd'):.2f} ms"
        )
        durable.close()
        plain.close()
    finally:
        replica.close()


def test_a_stopped_replica_turns_each_transition_into_a_durability_error(
    primary: EmbeddedRedis, namespace: str, figures: dict[str, str]
) -> None:
    replica = _replica_of(primary)
    _wait_replicas(primary, 1)
    s = Settler.from_url(
        primary.url, namespace=namespace, shards=4, min_replicas=1, replica_timeout=REPLICA_TIMEOUT
    )
    r = s.reserve("op", REQ, principal=WHO).reservation
    replica.close()
    _wait_replicas(primary, 0)

    with capture_logs() as logs, pytest.raises(DurabilityError) as info:
        s.complete(r, RESULT)
    err = info.value
    assert (err.operation_id, err.acknowledged, err.required) == ("op", 0, 1)
    assert [e["event"] for e in logs if e["event"].startswith("settle.backend")] == [
        "settle.backend.durability_failed"  # reported once, never repeated by the retry loop
    ]
    # The outcome is uncertain, not lost: the primary did apply it; a reader sees it.
    assert s.get("op").state is State.COMPLETED
    with pytest.raises(DurabilityError):
        s.reserve("other", REQ, principal=WHO)  # every writing script waits
    # Repeating the settlement is safe, and still not acknowledged while the replica is down.
    started = time.perf_counter()
    with pytest.raises(DurabilityError):
        s.complete(r, RESULT)
    figures["a transition with the replica down (replica_timeout=0.3 s)"] = (
        f"{(time.perf_counter() - started) * 1000:.0f} ms, then DurabilityError"
    )

    replica = _replica_of(primary)
    try:
        _wait_replicas(primary, 1)
        # With a replica back the repeat is absorbed and acknowledged: the outcome is settled.
        assert s.complete(r, RESULT).verdict is Verdict.ABSORBED
        assert _stored_state(replica, namespace, "op") == b"completed"
    finally:
        s.close()
        replica.close()


def test_the_durable_path_reloads_a_flushed_script_cache(
    primary: EmbeddedRedis, namespace: str
) -> None:
    replica = _replica_of(primary)
    try:
        _wait_replicas(primary, 1)
        s = Settler.from_url(primary.url, namespace=namespace, shards=4, min_replicas=1)
        r = s.reserve("op", REQ, principal=WHO).reservation
        with redis.Redis.from_url(primary.url) as raw:
            raw.script_flush()
        assert s.complete(r, RESULT).verdict is Verdict.ACCEPTED
        assert _stored_state(replica, namespace, "op") == b"completed"
        s.close()
    finally:
        replica.close()


@pytest.mark.parametrize("aof", [True, False], ids=["aof-always", "no-persistence"])
def test_kill_9_and_restart_keeps_completed_records_only_with_aof_always(
    tmp_path: Path, namespace: str, aof: bool, figures: dict[str, str]
) -> None:
    args = ["--appendonly", "yes", "--appendfsync", "always"] if aof else []
    server = EmbeddedRedis(directory=str(tmp_path), extra_args=args).start()
    s = Settler.from_url(server.url, namespace=namespace, shards=4)
    paid = s.reserve("paid", REQ, principal=WHO).reservation
    assert s.complete(paid, RESULT).verdict is Verdict.ACCEPTED
    in_flight = s.reserve("in-flight", REQ, principal=WHO).reservation
    if aof:
        figures["transition with appendfsync always (tmpfs/disk of the CI box)"] = (
            f"{_per_call_ms(s, 100, 'aof'):.2f} ms"
        )

    server.stop(kill=True)  # SIGKILL: no shutdown, no final fsync
    restarted = EmbeddedRedis(port=server.port, directory=str(tmp_path), extra_args=args).start()
    try:
        # The same Settler carries on: its dead connections are replaced and the empty script
        # cache of the new process is refilled without the caller seeing it.
        if aof:
            replay = s.reserve("paid", REQ, principal=WHO)
            assert isinstance(replay, Replay)
            assert json.loads(replay.record.result) == RESULT
            assert s.complete(in_flight, RESULT).verdict is Verdict.ACCEPTED
            assert s.complete(paid, RESULT).verdict is Verdict.ABSORBED
            # The generation counter survived too: no generation is ever issued twice.
            again = s.reserve("paid-2", REQ, principal=WHO)
            assert isinstance(again, Reserved)
        else:
            # The cost of running without persistence: the outcome is gone, so the paid
            # operation would run again, and its late settlement is quarantined as unknown.
            assert s.get("paid") is None
            late = s.complete(paid, RESULT)
            assert (late.verdict, late.kind) == (
                Verdict.QUARANTINED,
                QuarantineKind.UNKNOWN_OPERATION,
            )
    finally:
        s.close()
        restarted.close()
        server.close()


def test_a_restarted_server_with_an_empty_script_cache_is_used_transparently(
    namespace: str,
) -> None:
    server = EmbeddedRedis().start()
    try:
        s = Settler.from_url(server.url, namespace=namespace, shards=4)
        assert isinstance(s.reserve("before", REQ, principal=WHO), Reserved)
        server.stop()
        server.start()  # same port, a new process: no scripts, no data
        with redis.Redis.from_url(server.url) as raw:
            # What the client faces: nothing is cached.
            assert raw.script_exists(sha("reserve"), sha("complete")) == [False, False]
            if has_functions(raw.info("server")):
                assert raw.function_list() == []
        r = s.reserve("after", REQ, principal=WHO)
        assert isinstance(r, Reserved)
        assert s.complete(r.reservation, RESULT).verdict is Verdict.ACCEPTED
        s.close()
    finally:
        server.close()


def test_the_out_of_the_box_client_recovers_from_a_lost_reply(
    proxy: FaultyProxy, namespace: str, figures: dict[str, str]
) -> None:
    """``Settler.from_url`` keeps redis-py's default retries: the outcome is the same."""
    s = Settler.from_url(proxy.url, namespace=namespace, shards=4)
    r = s.reserve("op", REQ, principal=WHO).reservation
    proxy.cut(needle("complete"), "after_request")
    started = time.perf_counter()
    settlement = s.complete(r, RESULT)
    figures["complete with its reply lost, then repeated"] = (
        f"{(time.perf_counter() - started) * 1000:.1f} ms"
    )
    assert proxy.fired == ["after_request"]
    assert settlement.verdict is Verdict.ABSORBED
    assert s.get("op").version == 2
    s.close()
