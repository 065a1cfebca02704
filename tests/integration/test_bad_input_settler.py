"""Bad input to the Settler's public calls gets settle's typed error and writes nothing.

Each case here used to escape as a builtin error (TypeError, AttributeError, ValueError) or
as a BackendError about Redis, or was accepted and failed every later call.
"""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from settle import AsyncSettler, SettleConfig, Settler
from settle.cursor import AsyncCursorStore, CursorStore
from settle.errors import ConfigurationError, FingerprintError, InvalidInput
from settle.progress import (
    AsyncProgressStore,
    AsyncStreamConsumer,
    ProgressStore,
    StreamConsumer,
)
from settle.testing import AsyncMemorySettler, MemorySettler


def _namespace_keys(client: redis.Redis, namespace: str) -> dict[bytes, bytes | None]:
    return {k: client.dump(k) for k in client.scan_iter(match=f"settle:{{{namespace}*")}


def test_get_many_with_an_unhashable_id_is_invalid_input(settler: Settler) -> None:
    with pytest.raises(InvalidInput, match="operation id must be a str"):
        settler.get_many(["op-1", ["op-2"]])  # type: ignore[list-item]


@pytest.mark.parametrize("bound", ["since", "until"])
@pytest.mark.parametrize("value", ["2026-01-01", 1_700_000_000, 0])
def test_quarantine_bounds_that_are_no_datetime_are_invalid_input(
    settler: Settler, bound: str, value: Any
) -> None:
    with pytest.raises(InvalidInput, match="since/until must be datetimes"):
        settler.quarantine.list(**{bound: value})
    with pytest.raises(InvalidInput, match="since/until must be datetimes"):
        list(settler.quarantine.scan(**{bound: value}))


def test_quarantine_since_before_1970_reads_from_the_start(settler: Settler) -> None:
    """Redis refuses a negative stream id: a BackendError ("Redis failed") came out of a
    listing that only asked for entries since 1960. No entry is older than 1970."""
    op = "late-op"
    first = settler.reserve(op, {"n": 1}, principal="p", lease=0.05)
    settler.mark_provisional(first.reservation, "timeout")  # type: ignore[union-attr]
    second = settler.reserve(op, {"n": 1}, principal="p")
    settler.complete(second.reservation, {"ok": True})  # type: ignore[union-attr]
    late = settler.complete(first.reservation, {"ok": False})  # type: ignore[union-attr]
    assert late.quarantine_id is not None
    old = datetime(1960, 1, 1, tzinfo=UTC)
    assert [e.ref for e in settler.quarantine.list(since=old)] == [late.quarantine_id]
    assert [e.ref for e in settler.quarantine.scan(since=old)] == [late.quarantine_id]
    assert settler.quarantine.list(until=old) == []


def test_quarantine_list_limit_true_is_invalid_input(settler: Settler) -> None:
    with pytest.raises(InvalidInput, match="limit"):
        settler.quarantine.list(limit=True)


def _nested(depth: int) -> list[Any]:
    root: list[Any] = []
    cur = root
    for _ in range(depth):
        cur.append([])
        cur = cur[0]
    return root


def _circular() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


class _Refused(Exception):
    pass


def _with_data(data: Any) -> _Refused:
    exc = _Refused("declined")
    exc.settle_data = data  # type: ignore[attr-defined]
    return exc


@pytest.mark.parametrize(
    "error",
    [_circular(), _nested(2000), _with_data(_circular())],
    ids=["circular", "deep", "exception-data-circular"],
)
def test_fail_with_unstorable_data_is_fingerprint_error_and_writes_nothing(
    settler: Settler, redis_client: redis.Redis, namespace: str, error: Any
) -> None:
    """``complete`` refused such results with FingerprintError; ``fail`` let pydantic's
    ValueError out."""
    reserved = settler.reserve("op", {"n": 1}, principal="p")
    before = _namespace_keys(redis_client, namespace)
    with pytest.raises(FingerprintError):
        settler.fail(reserved.reservation, error)  # type: ignore[union-attr]
    assert _namespace_keys(redis_client, namespace) == before


def test_request_with_an_integer_too_long_to_print_is_fingerprint_error(
    settler: Settler, redis_client: redis.Redis, namespace: str
) -> None:
    settler.check()
    before = _namespace_keys(redis_client, namespace)
    with pytest.raises(FingerprintError):
        settler.reserve("op", {"amount": 10**5000}, principal="p")
    assert _namespace_keys(redis_client, namespace) == before


@pytest.mark.parametrize("url", [None, 6379, b"redis://localhost"])
def test_from_url_with_no_str_is_invalid_input(url: Any) -> None:
    with pytest.raises(InvalidInput, match="must be a str"):
        Settler.from_url(url)


def test_from_cluster_and_from_sentinel_with_no_nodes_are_invalid_input() -> None:
    with pytest.raises(InvalidInput):
        Settler.from_cluster(None)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        Settler.from_sentinel(None, service_name="main")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "my primary", "main\n", "\x00", None, 5])
@pytest.mark.asyncio
async def test_a_sentinel_service_name_no_sentinel_can_monitor_is_invalid_input(
    name: object,
) -> None:
    """It was taken, and each call then failed as a BackendError ("No master found") after
    its retries; refused before anything connects now (no Sentinel listens here)."""
    sentinels = [("127.0.0.1", 1)]
    with pytest.raises(InvalidInput, match="service_name must be"):
        Settler.from_sentinel(sentinels, service_name=name)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="service_name must be"):
        AsyncSettler.from_sentinel(sentinels, service_name=name)  # type: ignore[arg-type]


def test_config_that_is_no_settle_config_is_invalid_input(redis_url: str) -> None:
    with pytest.raises(InvalidInput, match="config must be a SettleConfig"):
        Settler(redis.Redis.from_url(redis_url), {"shards": 4})  # type: ignore[arg-type]
    # the documented forms still work
    Settler(redis.Redis.from_url(redis_url), SettleConfig(shards=4)).close()
    with pytest.raises(InvalidInput, match="config must be a SettleConfig"):
        MemorySettler({"shards": 4})  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="config must be a SettleConfig"):
        AsyncMemorySettler({"shards": 4})  # type: ignore[arg-type]


def test_min_replicas_past_what_wait_takes_is_refused_up_front(redis_url: str) -> None:
    """It was accepted, and every call then failed with a BackendError from WAIT."""
    with pytest.raises(ConfigurationError, match="min_replicas"):
        Settler.from_url(redis_url, min_replicas=2**63)


@pytest.mark.parametrize("poll_interval", [-1, math.nan, math.inf, "1", None, True])
def test_quarantine_follow_with_a_bad_poll_interval_is_invalid_input(
    settler: Settler, poll_interval: Any
) -> None:
    """It failed with time.sleep's own ValueError / TypeError / OverflowError once the
    follower was first idle."""
    with pytest.raises(InvalidInput, match="poll_interval"):
        next(iter(settler.quarantine.follow(poll_interval=poll_interval)))


@pytest.mark.parametrize(
    "change",
    [
        {"fingerprint": 5},
        {"attempt_id": None},
        {"generation": "1"},
        {"generation": True},
        {"generation": 2**80},
        {"fingerprint_version": "x"},
        {"fingerprint_version": 2**80},
    ],
    ids=lambda change: "-".join(f"{k}={v!r}"[:30] for k, v in change.items()),
)
def test_a_reservation_with_fields_of_the_wrong_type_is_invalid_input_and_writes_nothing(
    settler: Settler, redis_client: redis.Redis, namespace: str, change: dict[str, Any]
) -> None:
    """model_copy(update=...) and model_construct skip the model's checks. Such a
    reservation raised TypeError, a BackendError (a bool sent to Redis), or was judged by the
    script and its settlement quarantined (a generation or fingerprint version past 2**53)."""
    reserved = settler.reserve("op", {"n": 1}, principal="p")
    forged = reserved.reservation.model_copy(update=change)  # type: ignore[union-attr]
    before = _namespace_keys(redis_client, namespace)
    with pytest.raises(InvalidInput, match="reservation"):
        settler.complete(forged, {"ok": True})
    with pytest.raises(InvalidInput, match="reservation"):
        settler.renew(forged)
    assert _namespace_keys(redis_client, namespace) == before


@pytest.mark.asyncio
@pytest.mark.parametrize("poll_interval", [math.nan, "1"])
async def test_async_quarantine_follow_with_a_bad_poll_interval_is_invalid_input(
    async_settler: AsyncSettler, poll_interval: Any
) -> None:
    """The asyncio twin: AsyncQuarantine.follow hands poll_interval to the same check (a
    follower that never got it slept NaN seconds: no error, no end)."""
    follow = aiter(async_settler.quarantine.follow(poll_interval=poll_interval))
    with pytest.raises(InvalidInput, match="poll_interval"):
        await asyncio.wait_for(anext(follow), timeout=5)


@pytest.mark.asyncio
async def test_async_settler_config_that_is_no_settle_config_is_invalid_input(
    redis_url: str,
) -> None:
    client = aioredis.Redis.from_url(redis_url)
    with pytest.raises(InvalidInput, match="config must be a SettleConfig"):
        AsyncSettler(client, {"shards": 4})  # type: ignore[arg-type]
    await client.aclose()


@pytest.mark.parametrize(
    "change",
    [
        {"generation": 0},
        {"generation": 2**53},
        {"fingerprint_version": 0},
        {"fingerprint_version": 2**53},
    ],
    ids=lambda change: "-".join(f"{k}={v!r}" for k, v in change.items()),
)
def test_a_reservation_number_just_out_of_range_is_invalid_input(
    settler: Settler, redis_client: redis.Redis, namespace: str, change: dict[str, Any]
) -> None:
    """The bounds of the generation / fingerprint_version check: 1 to 2**53 - 1."""
    reserved = settler.reserve("op", {"n": 1}, principal="p")
    forged = reserved.reservation.model_copy(update=change)  # type: ignore[union-attr]
    before = _namespace_keys(redis_client, namespace)
    with pytest.raises(InvalidInput, match="reservation"):
        settler.complete(forged, {"ok": True})
    assert _namespace_keys(redis_client, namespace) == before


def test_a_client_that_is_no_redis_client_of_the_flavour_is_invalid_input(redis_url: str) -> None:
    """``Settler(None)``, a URL given where a client goes, or the other flavour's client:
    an AttributeError came out of the runner (or a sync settler took an asyncio client and
    failed at its first call). Each constructor now says what it needs."""
    sync_client = redis.Redis.from_url(redis_url)
    async_client = aioredis.Redis.from_url(redis_url)
    cases: list[tuple[Any, Any, str]] = [
        (Settler, async_client, "Settler needs a redis.Redis or redis.RedisCluster client"),
        (AsyncSettler, sync_client, "AsyncSettler needs a redis.asyncio.Redis or"),
        (CursorStore, async_client, "CursorStore needs a redis.Redis or"),
        (AsyncCursorStore, sync_client, "AsyncCursorStore needs a redis.asyncio.Redis or"),
    ]
    try:
        for build, other_flavour, needs in cases:
            for wrong in (None, redis_url, other_flavour):
                with pytest.raises(InvalidInput, match=needs) as caught:
                    build(wrong)
                assert type(wrong).__name__ in str(caught.value)
                assert "from_url(url)" in str(caught.value)
        # the clients of each flavour are still taken
        Settler(sync_client).close()
        CursorStore(redis.Redis.from_url(redis_url)).close()
    finally:
        sync_client.close()
        asyncio.run(async_client.aclose())


def test_a_progress_store_or_consumer_given_no_client_of_its_flavour_is_invalid_input(
    redis_url: str,
) -> None:
    """The delivery-progress part refuses the same clients, naming how to build the right
    one; a ``ProgressStore(None)`` raised a bare AttributeError from inside the runner."""
    sync_client = redis.Redis.from_url(redis_url)
    async_client = aioredis.Redis.from_url(redis_url)
    store = ProgressStore(redis.Redis.from_url(redis_url), consumer="c")
    async_store = AsyncProgressStore(aioredis.Redis.from_url(redis_url), consumer="c")
    cases: list[tuple[Any, Any, str, str]] = [
        (
            lambda c: ProgressStore(c, consumer="c"),
            async_client,
            "ProgressStore needs a redis.Redis",
            "from_url(url)",
        ),
        (
            lambda c: AsyncProgressStore(c, consumer="c"),
            sync_client,
            "AsyncProgressStore needs a redis.asyncio.Redis",
            "from_url(url)",
        ),
        (
            lambda c: StreamConsumer(c, store, stream="s", group="g"),
            async_client,
            "StreamConsumer needs a redis.Redis",
            "from_urls(stream_url, progress_url",
        ),
        (
            lambda c: AsyncStreamConsumer(c, async_store, stream="s", group="g"),
            sync_client,
            "AsyncStreamConsumer needs a redis.asyncio.Redis",
            "from_urls(stream_url, progress_url",
        ),
    ]
    try:
        for build, other_flavour, needs, how in cases:
            for wrong in (None, redis_url, other_flavour):
                with pytest.raises(InvalidInput, match=needs) as caught:
                    build(wrong)
                assert type(wrong).__name__ in str(caught.value)
                assert how in str(caught.value)
    finally:
        store.close()
        sync_client.close()

        async def close() -> None:
            await async_store.aclose()
            await async_client.aclose()

        asyncio.run(close())


@pytest.mark.parametrize("password", ["123/rest", "a?b", "x#1"])
def test_from_url_refuses_a_password_redis_py_would_read_as_a_port(
    redis_url: str, password: str
) -> None:
    """``Settler.from_url("redis://:123/rest@host:6379/0")``: redis-py ends the host at the
    password's ``/`` and connected to localhost:123 with no password; the error then quoted
    the password's start as the port. The URL is refused before connecting, naming none of
    the password."""
    host_port = redis_url.split("://", 1)[1].split("/", 1)[0]
    url = f"redis://:{password}@{host_port}/0"
    for build in (Settler.from_url, AsyncSettler.from_url):
        with pytest.raises(InvalidInput, match="percent-encode") as caught:
            build(url)
        message = str(caught.value)
        for part in (password, password[:3], password[-3:]):
            assert part not in message


@pytest.mark.parametrize("port", ["\u00b2", "\u0667\u0660\u0660\u0660", "\uff17\uff10\uff10\uff10"])
def test_a_node_port_in_other_digits_is_invalid_input(port: str) -> None:
    r"""A seed node's port was checked with ``str.isdigit()``, true of superscripts and of
    every script's digits: ``'127.0.0.1:\u00b2'`` escaped as int()'s bare ValueError (no
    SettleError), and ``'127.0.0.1:\u0667\u0660\u0660\u0660'`` (Arabic-Indic) was taken for
    port 7000. A port is ASCII digits, as in every URL."""
    node = f"127.0.0.1:{port}"
    with pytest.raises(InvalidInput, match="is not 'host:port'"):
        Settler.from_cluster([node])
    with pytest.raises(InvalidInput, match="is not 'host:port'"):
        Settler.from_sentinel([node], service_name="main")
