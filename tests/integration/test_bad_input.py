"""SPEC 11: bad input gets a typed error and changes nothing."""

from __future__ import annotations

import math
import traceback
from typing import Any

import pytest
import redis

from settle import (
    AsyncSettler,
    BackendError,
    ConfigurationError,
    FingerprintError,
    Reserved,
    SettleError,
    Settler,
)
from settle._core import layout
from settle._core.reference import MemoryKeyspace
from settle.embedded import free_port
from settle.errors import CorruptRecord, InvalidInput, ResultTooLarge
from settle.testing import MemorySettler, wall_clock_ms

WHO = "tenant:acme"


def _keys(client: redis.Redis, namespace: str) -> set[bytes]:
    return set(client.scan_iter(match=f"settle:{{{namespace}:*"))


@pytest.mark.parametrize(
    "bad_id", ["", "x" * 257, "abc\n", "tab\there", "nul\x00", "bidi\u202e", 42, None]
)
def test_bad_operation_ids_raise_and_write_nothing(
    settler: Settler, redis_client: redis.Redis, namespace: str, bad_id: Any
) -> None:
    with pytest.raises(InvalidInput) as info:
        settler.reserve(bad_id, {"a": 1}, principal=WHO)
    assert isinstance(info.value, SettleError)
    assert isinstance(info.value, ValueError)
    assert _keys(redis_client, namespace) == set()


@pytest.mark.parametrize("principal", ["", "x" * 1025, "a\nb", None])
def test_bad_principals_raise_and_write_nothing(
    settler: Settler, redis_client: redis.Redis, namespace: str, principal: Any
) -> None:
    with pytest.raises(InvalidInput):
        settler.reserve("op", {"a": 1}, principal=principal)
    assert _keys(redis_client, namespace) == set()


@pytest.mark.parametrize(
    "given",
    [
        {"fingerprint": "ab" * 32 + "\n"},
        {"fingerprint": "AB" * 32},
        {"attempt_id": "a1\n"},
        {"attempt_id": "a|b"},
    ],
    ids=repr,
)
def test_a_fingerprint_or_attempt_id_given_to_reserve_is_checked_whole(
    settler: Settler, redis_client: redis.Redis, namespace: str, given: dict[str, str]
) -> None:
    """A trailing line feed passed the pattern's ``$`` (which matches before a final
    newline): an attempt id ``'a1\\n'`` was stored with its control character (shown in
    the attempt log, the CLI, the quarantine), a fingerprint with one taken as the digest
    without it. Both refused; nothing written."""
    with pytest.raises(InvalidInput):
        settler.reserve("op", {"a": 1}, principal=WHO, **given)
    assert _keys(redis_client, namespace) == set()


@pytest.mark.parametrize("lease", [0, -1, 86_401, float("nan"), "30", True])
def test_bad_leases_raise_and_write_nothing(
    settler: Settler, redis_client: redis.Redis, namespace: str, lease: Any
) -> None:
    with pytest.raises(InvalidInput):
        settler.reserve("op", {"a": 1}, principal=WHO, lease=lease)
    assert _keys(redis_client, namespace) == set()


@pytest.mark.parametrize(
    "request_", [{"x": math.nan}, {"x": math.inf}, {1, 2}, {"o": object()}, {1: "int key"}]
)
def test_non_canonical_requests_raise_and_write_nothing(
    settler: Settler, redis_client: redis.Redis, namespace: str, request_: Any
) -> None:
    with pytest.raises(FingerprintError) as info:
        settler.reserve("op", request_, principal=WHO)
    assert info.value.operation_id == "op"
    assert _keys(redis_client, namespace) == set()


def test_oversized_result_raises_and_leaves_the_record_pending(
    redis_url: str, namespace: str
) -> None:
    s = Settler.from_url(redis_url, namespace=namespace, max_result_bytes=100)
    r = s.reserve("op", {"a": 1}, principal=WHO).reservation
    before = s.get("op"), s.attempts("op")
    with pytest.raises(ResultTooLarge):
        s.complete(r, {"blob": "x" * 200})
    with pytest.raises(ResultTooLarge):
        s.fail(r, ValueError("y" * 200))
    assert (s.get("op"), s.attempts("op")) == before
    s.close()


def test_bad_settlement_arguments_raise(settler: Settler) -> None:
    r = settler.reserve("op", {"a": 1}, principal=WHO).reservation
    with pytest.raises(InvalidInput):
        settler.complete({"not": "a reservation"}, {"n": 1})  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        settler.mark_provisional(r, reason="")
    for version in (0, 2**53, 10**5000):  # beyond a record's versions: refused, not sent
        with pytest.raises(InvalidInput):
            settler.complete(r, {"n": 1}, expected_version=version)
    with pytest.raises(InvalidInput):
        settler.reserve("op", {"a": 1}, principal=WHO, fingerprint="not-hex")
    assert settler.get("op").version == 1


@pytest.mark.parametrize(
    "shape", ["string", "hash-missing-fields", "hash-bad-state", "packed-time-out-of-range"]
)
def test_corrupted_record_is_reported_and_never_overwritten(
    settler: Settler, redis_client: redis.Redis, shape: str
) -> None:
    settler.reserve("victim", {"a": 1}, principal=WHO)
    key = settler._core.keys.record("victim")
    r = settler.reserve("healthy", {"a": 1}, principal=WHO).reservation
    stored = redis_client.get(key)
    redis_client.delete(key)
    if shape == "packed-time-out-of-range":
        # A well-formed value whose times no datetime can hold (year 33658).
        packed = layout.unpack(stored)
        assert packed.record is not None
        packed.record[b"created"] = b"1000000000000000"
        packed.record[b"updated"] = b"1000000000000000"
        packed.record[b"lease"] = b"1000000000030000"
        redis_client.set(key, layout.pack(packed))
    elif shape == "string":
        redis_client.set(key, b"not a record")
    elif shape == "hash-missing-fields":
        redis_client.hset(key, mapping={"op": "victim", "state": "pending"})
    else:
        redis_client.hset(
            key,
            mapping={
                "op": "victim",
                "fp": "0",
                "fpv": "1",
                "bind": WHO,
                "gen": "1",
                "ver": "1",
                "state": "exploded",
                "n": "1",
                "created": "0",
                "updated": "0",
            },
        )
    dump = redis_client.dump(key)
    before = redis_client.get(key) if shape.startswith("packed") else None
    ghost = r.model_copy(update={"operation_id": "victim"})
    for call in (
        lambda: settler.reserve("victim", {"a": 1}, principal=WHO),
        lambda: settler.get("victim"),
        lambda: settler.complete(ghost, {"n": 1}),
        lambda: settler.renew(ghost),
    ):
        with pytest.raises(CorruptRecord) as info:
            call()
        assert info.value.operation_id == "victim"
    if shape == "packed-time-out-of-range":
        # The scripts can read this value (only the client cannot hold its times): the
        # record is kept as it was; the attempt log inside the value may have grown.
        after = layout.unpack(redis_client.get(key))
        assert before is not None
        assert after.record == layout.unpack(before).record
    else:
        assert redis_client.dump(key) == dump


def test_unreachable_redis_is_a_backend_error() -> None:
    s = Settler.from_url(f"redis://127.0.0.1:{free_port()}/0", namespace="x")
    with pytest.raises(BackendError) as info:
        s.reserve("op", {"a": 1}, principal=WHO)
    assert "reachable" in str(info.value)
    s.close()


def test_a_different_shard_count_for_a_namespace_is_an_error_at_start_up(
    redis_url: str, namespace: str
) -> None:
    first = Settler.from_url(redis_url, namespace=namespace, shards=4)
    first.check()
    second = Settler.from_url(redis_url, namespace=namespace, shards=8)
    with pytest.raises(ConfigurationError, match="4 shards"):
        second.reserve("op", {"a": 1}, principal=WHO)
    first.close()
    second.close()


def test_the_reference_model_refuses_fewer_shards_when_only_states_beyond_them_survive() -> None:
    """MemorySettler (the reference model behind the same shells) keeps the rule the Redis
    runner keeps (tests/faults/test_faults_loss.py): missing metadata is not re-created by a
    client with fewer shards while states of the shards it lacks survive."""
    keyspace = MemoryKeyspace(wall_clock_ms)
    sixteen = MemorySettler(namespace="m", shards=16, keyspace=keyspace)
    for i in range(40):
        assert isinstance(sixteen.reserve(f"op-{i}", {"a": 1}, principal=WHO), Reserved)
    keys = sixteen._core.keys
    for key in (keys.meta, *(keys.generation(shard) for shard in range(4))):
        keyspace.delete(key)
    four = MemorySettler(namespace="m", shards=4, keyspace=keyspace)
    with pytest.raises(ConfigurationError, match="12 shard state"):
        four.reserve("op-new", {"a": 1}, principal=WHO)
    assert keyspace.type(keys.meta, wall_clock_ms()) == "none"


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:1/0?socket_timout=1",  # a typo of socket_timeout
        "redis://127.0.0.1:1/0?ssl_password=secret-x",  # a TLS option without TLS
        "redis://127.0.0.1:notaport/0",
        "ftp://127.0.0.1:1/0",
        "redis://127.0.0.1:1/0?protocol=9",  # a RedisError from the connection
        # redis-py's messages quoted the password: "... cast to integer value as 'secret'"
        "redis://app:secret-x?y@127.0.0.1:6379/0",
        "redis://app:secret-x#y@127.0.0.1:6379/0",
        "redis://app:secret-x/y@127.0.0.1:6379/0",
        "redis://app:secret-x\uff03@127.0.0.1:6379/0",  # "netloc '...' contains invalid"
        "redis:/app:secret-x@127.0.0.1:6379/0",
    ],
)
def test_a_redis_url_no_connection_can_be_made_from_is_refused_up_front(url: str) -> None:
    """Refused when the settler is made, naming no password (nor chaining redis-py's error
    that quotes it), not as a TypeError at the first command."""
    for make in (Settler.from_url, AsyncSettler.from_url):
        with pytest.raises(InvalidInput, match="Redis URL") as info:
            make(url, namespace="ns")
        assert "secret-x" not in "".join(traceback.format_exception(info.value))
    if url.startswith("redis://app:"):
        with pytest.raises(InvalidInput, match="Redis Cluster URL") as info:
            Settler.from_cluster(url, namespace="ns")
        assert "secret-x" not in "".join(traceback.format_exception(info.value))


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="namespace"):
        Settler.from_url("redis://127.0.0.1:1/0", namespace="has{brace}")
    with pytest.raises(ValueError, match="retention"):
        Settler.from_url("redis://127.0.0.1:1/0", lease=60, retention=10)


@pytest.mark.parametrize(
    "change",
    [
        {"attempt_id": "a|b"},
        {"attempt_id": "x" * 100_000},
        {"attempt_id": "a1\n"},
        {"fingerprint": "nothex"},
        {"fingerprint": "ab" * 32 + "\n"},
        {"binding": ""},
        {"generation": 0},
    ],
)
def test_hand_built_reservations_are_checked_before_anything_is_written(
    settler: Settler, change: dict[str, Any]
) -> None:
    r = settler.reserve("op", {"a": 1}, principal=WHO).reservation
    before = settler.get("op"), settler.attempts("op")
    bad = r.model_copy(update=change)
    for call in (
        lambda: settler.complete(bad, {"n": 1}),
        lambda: settler.renew(bad),
        lambda: settler.mark_provisional(bad, reason="timeout"),
    ):
        with pytest.raises(InvalidInput):
            call()
    assert (settler.get("op"), settler.attempts("op")) == before
