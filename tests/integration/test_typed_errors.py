"""SPEC 11: every public error derives from SettleError, carries the operation id where
there is one, and bad input changes nothing. Real redis-server, sync and async."""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from settle import AsyncSettler, BackendError, FingerprintError, Reserved, Settler, State, Verdict
from settle.cursor import CursorStore
from settle.errors import InvalidInput
from settle.progress import ProgressStore

OP = "order-9001"


class _Opaque:
    pass


class _Declined(Exception):
    settle_data = _Opaque()  # the documented hook for a failure's structured data


@pytest.mark.parametrize("failure", [_Opaque(), _Declined("card declined")], ids=["obj", "exc"])
def test_a_failure_with_no_json_form_is_refused_and_writes_nothing(
    settler: Settler, failure: object
) -> None:
    r = settler.reserve(OP, {"amount": 100}, principal="tenant:acme")
    assert isinstance(r, Reserved)
    with pytest.raises(FingerprintError, match="failure cannot be serialized") as caught:
        settler.fail(r.reservation, failure)
    assert caught.value.operation_id == OP
    record = settler.get(OP)
    assert record is not None
    assert record.state is State.PENDING
    assert record.version == 1
    # the same attempt can still settle with a failure that has one
    assert settler.fail(r.reservation, RuntimeError("declined")).verdict is Verdict.ACCEPTED


@pytest.mark.parametrize("url", ["foo://localhost:6379/0", "redis://localhost:abc/0"])
@pytest.mark.parametrize("facade", [Settler, AsyncSettler, CursorStore, ProgressStore])
def test_a_malformed_url_is_invalid_input(facade: type, url: str) -> None:
    with pytest.raises(InvalidInput, match="Redis URL"):
        facade.from_url(url, namespace="ns")


def test_an_unreachable_redis_on_the_first_call_names_the_operation() -> None:
    settler = Settler.from_url("redis://127.0.0.1:1/0", namespace="ns")
    try:
        with pytest.raises(BackendError) as caught:
            settler.reserve(OP, {"amount": 100}, principal="tenant:acme")
        assert caught.value.operation_id == OP
    finally:
        settler.close()


@pytest.mark.asyncio
async def test_async_an_unreachable_redis_on_the_first_call_names_the_operation() -> None:
    settler = AsyncSettler.from_url("redis://127.0.0.1:1/0", namespace="ns")
    try:
        with pytest.raises(BackendError) as caught:
            await settler.get(OP)
        assert caught.value.operation_id == OP
    finally:
        await settler.aclose()


@pytest.mark.parametrize("facade", [Settler, AsyncSettler])
def test_a_malformed_cluster_url_is_invalid_input(facade: type) -> None:
    with pytest.raises(InvalidInput, match="Cluster URL"):
        facade.from_cluster("redis://localhost:abc/0", namespace="ns")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "option",
    [
        {"min_replicas": -1},
        {"min_replicas": 1.5},
        {"min_replicas": 2**63},
        {"min_replicas": 1, "replica_timeout": 0},
        {"replica_timeout": -1.0},
        {"allow_eviction": "yes"},
    ],
    ids=str,
)
async def test_a_bad_durability_option_is_the_same_typed_error_on_every_part(
    redis_url: str, option: dict[str, object]
) -> None:
    """Issue 13: the companions raise the same typed errors as the settler. A bad durability
    option was an ``InvalidInput`` on the settlers and a ``ConfigurationError`` on the
    cursor and progress stores and the stream consumer: one ``except InvalidInput`` did not
    catch it everywhere. Each part refuses it before connecting, as an ``InvalidInput``
    (which it stays on the stores also as the ``ConfigurationError`` it was)."""
    from settle.cursor import AsyncCursorStore  # noqa: PLC0415
    from settle.progress import AsyncProgressStore, AsyncStreamConsumer, StreamConsumer  # noqa: PLC0415

    kw: dict[str, Any] = dict(option)
    builders = {
        "Settler": lambda: Settler.from_url(redis_url, namespace="opts", **kw),
        "AsyncSettler": lambda: AsyncSettler.from_url(redis_url, namespace="opts", **kw),
        "CursorStore": lambda: CursorStore.from_url(redis_url, namespace="opts", **kw),
        "AsyncCursorStore": lambda: AsyncCursorStore.from_url(redis_url, namespace="opts", **kw),
        "ProgressStore": lambda: ProgressStore.from_url(redis_url, consumer="c", **kw),
        "AsyncProgressStore": lambda: AsyncProgressStore.from_url(redis_url, consumer="c", **kw),
    }
    for part, build in builders.items():
        with pytest.raises(InvalidInput) as caught:
            build()
        assert next(iter(option)) in str(caught.value) or "replica_timeout" in str(caught.value), (
            part
        )
    with (
        ProgressStore.from_url(redis_url, consumer="c") as store,
        redis.Redis.from_url(redis_url) as client,
        pytest.raises(InvalidInput),
    ):
        StreamConsumer(client, store, stream="s", group="g", **kw)
    async with AsyncProgressStore.from_url(redis_url, consumer="c") as astore:
        aclient = aioredis.Redis.from_url(redis_url)
        try:
            with pytest.raises(InvalidInput):
                AsyncStreamConsumer(aclient, astore, stream="s", group="g", **kw)
        finally:
            await aclient.aclose()
