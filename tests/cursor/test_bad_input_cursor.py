"""A page of the wrong shape from ``fetch_page`` is an InvalidResponse and writes nothing.

``events`` that cannot be iterated, and a coverage marker that is no ``Coverage``, let a
TypeError / AttributeError out of the page check instead.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from pydantic import ValidationError

from settle.config import SettleConfig
from settle.cursor import (
    AsyncCursorConsumer,
    AsyncCursorStore,
    CursorConsumer,
    CursorStore,
    Event,
    Page,
    ProviderContract,
    StepOutcome,
)
from settle.cursor.errors import InvalidResponse
from settle.errors import InvalidInput, SettleError


def _keys(client: redis.Redis, namespace: str) -> dict[bytes, bytes | None]:
    return {k: client.dump(k) for k in client.scan_iter(match=f"settle:{{{namespace}:*")}


@pytest.mark.parametrize(
    ("page", "contract"),
    [
        (Page(None, b"next"), ProviderContract()),  # type: ignore[arg-type]
        (Page(3, b"next"), ProviderContract()),  # type: ignore[arg-type]
        (Page([], b"next", coverage=(0, 5)), ProviderContract(coverage_watermarks=True)),  # type: ignore[arg-type]
        (Page([], b"next", coverage={"after": 0}), ProviderContract(coverage_watermarks=True)),  # type: ignore[arg-type]
    ],
    ids=["events-none", "events-int", "coverage-tuple", "coverage-dict"],
)
def test_a_page_of_the_wrong_shape_is_invalid_response_and_writes_nothing(
    store: CursorStore,
    redis_client: redis.Redis,
    namespace: str,
    page: Page,
    contract: ProviderContract,
) -> None:
    store.start("orders", b"first")
    before = _keys(redis_client, namespace)

    def fetch(cursor: bytes) -> Any:
        return page

    consumer = CursorConsumer(fetch, lambda e, c: None, contract, store=store, stream="orders")
    with pytest.raises(InvalidResponse):
        consumer.step()
    assert _keys(redis_client, namespace) == before


def test_a_consumer_refuses_a_store_of_the_other_flavour(redis_url: str, namespace: str) -> None:
    """A CursorConsumer given an AsyncCursorStore ran its first step against an unawaited
    coroutine and blamed the server: CorruptRecord, "another settle version"."""
    store = AsyncCursorStore(aioredis.Redis.from_url(redis_url), namespace=namespace)
    with pytest.raises(InvalidInput, match="CursorStore"):
        CursorConsumer(
            lambda cursor: Page([], b"n"),
            lambda event, context: None,
            ProviderContract(),
            store=store,  # type: ignore[arg-type]
            stream="orders",
        )
    with pytest.raises(InvalidInput, match="CursorStore"):
        CursorConsumer(
            lambda cursor: Page([], b"n"),
            lambda event, context: None,
            ProviderContract(),
            store=None,  # type: ignore[arg-type]
            stream="orders",
        )


@pytest.mark.asyncio
async def test_an_async_consumer_refuses_a_sync_store(store: CursorStore) -> None:
    """The asyncio twin of the check above: an AsyncCursorConsumer given a CursorStore
    would await its plain replies."""
    with pytest.raises(InvalidInput, match="AsyncCursorStore"):
        AsyncCursorConsumer(
            _async_fetch,
            _async_handle,
            ProviderContract(),
            store=store,  # type: ignore[arg-type]
            stream="orders",
        )


async def _async_fetch(cursor: bytes) -> Page:
    return Page([], b"n")


async def _async_handle(event: Any, context: Any) -> None:
    return None


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"cursor_ttl": 0}, "cursor_ttl"),
        ({"boundary": "both"}, "boundary"),
        ({"positions": 3}, "positions"),
        ({"empty_page": "maybe"}, "empty_page"),
        ({"rotation_allowd": True}, "rotation_allowd"),
        ({"cursor_ttl": True}, "cursor_ttl"),  # was a one-second cursor lifetime
    ],
)
def test_a_contract_with_a_bad_value_is_invalid_input_naming_the_field(
    values: dict[str, Any], field: str
) -> None:
    """pydantic's ValidationError came out, where every other bad input of settle is
    InvalidInput (as SettleConfig's is): ``except SettleError`` let it through."""
    for build in (
        lambda: ProviderContract(**values),
        lambda: ProviderContract.model_validate(values),
        lambda: ProviderContract.model_validate_json(json.dumps(values)),
    ):
        with pytest.raises(InvalidInput, match=f"invalid ProviderContract: {field}") as caught:
            build()
        assert isinstance(caught.value, SettleError)
        assert isinstance(caught.value.__cause__, ValidationError)


@pytest.mark.parametrize("model", [ProviderContract, SettleConfig])
def test_model_validate_names_the_field_once_as_the_constructor_does(model: Any) -> None:
    """pydantic builds a model with its own ``__init__`` through it from ``model_validate``
    too, so the ``InvalidInput`` raised there came back wrapped once more: ``invalid
    ProviderContract: settings: Value error, invalid ProviderContract: cursor_ttl: ...``, with
    a ``__cause__`` that named no field."""
    values = {"cursor_ttl": 0} if model is ProviderContract else {"shards": 0}
    field = next(iter(values))
    with pytest.raises(InvalidInput) as direct:
        model(**values)
    for build in (
        lambda: model.model_validate(values),
        lambda: model.model_validate_json(json.dumps(values)),
        # Settings read from the environment: every value a string.
        lambda: model.model_validate_strings({k: str(v) for k, v in values.items()}),
    ):
        with pytest.raises(InvalidInput) as caught:
            build()
        assert str(caught.value) == str(direct.value)
        assert str(caught.value).startswith(f"invalid {model.__name__}: {field}: ")
        cause = caught.value.__cause__
        assert isinstance(cause, ValidationError)
        assert [e["loc"] for e in cause.errors()] == [(field,)]


@pytest.mark.parametrize("bad", ["ns\n", "ns\r", "n s", ""])
def test_a_store_refuses_a_namespace_with_a_line_break(redis_url: str, bad: str) -> None:
    """``'ns\\n'`` passed the namespace pattern (its ``$`` matches before a final newline):
    every key of the store then held a line feed."""
    with pytest.raises(InvalidInput, match="namespace"):
        CursorStore(redis.Redis.from_url(redis_url), namespace=bad)


_BAD_DIGESTS = ["\ud800abc", "a\x85b", "a\u2028b", "a\u00a0b", "a\u200bb"]
_BAD_DIGEST_IDS = ["lone-surrogate", "c1-control-nel", "line-separator", "no-break-space", "zwsp"]


@pytest.mark.parametrize("digest", _BAD_DIGESTS, ids=_BAD_DIGEST_IDS)
def test_an_event_digest_with_a_control_or_space_character_is_refused_before_its_handler(
    store: CursorStore, redis_client: redis.Redis, namespace: str, digest: str
) -> None:
    """The docs promise a digest of text "without whitespace or control characters". A lone
    surrogate was let through: the witness was written, the handler ran, then the receipt
    failed with a bare UnicodeEncodeError (and again on every retry); C1 controls, line
    separators and Unicode spaces were stored in the receipt as they were."""
    store.start("orders", b"first")
    before = _keys(redis_client, namespace)
    handled: list[str] = []

    def fetch(cursor: bytes) -> Page:
        return Page([Event("evt-1", 1, {"a": 1}, digest=digest)], b"next")

    consumer = CursorConsumer(
        fetch, lambda e, c: handled.append(e.id), ProviderContract(), store=store, stream="orders"
    )
    with pytest.raises(InvalidResponse, match="digest"):
        consumer.step()
    assert handled == []
    assert _keys(redis_client, namespace) == before


@pytest.mark.asyncio
@pytest.mark.parametrize("digest", _BAD_DIGESTS, ids=_BAD_DIGEST_IDS)
async def test_the_async_consumer_refuses_the_same_digests(
    redis_url: str, redis_client: redis.Redis, namespace: str, digest: str
) -> None:
    store = AsyncCursorStore(aioredis.Redis.from_url(redis_url), namespace=namespace)
    try:
        await store.start("orders", b"first")
        before = _keys(redis_client, namespace)
        handled: list[str] = []

        async def fetch(cursor: bytes) -> Page:
            return Page([Event("evt-1", 1, {"a": 1}, digest=digest)], b"next")

        async def handle(event: Event, context: Any) -> None:
            handled.append(event.id)

        consumer = AsyncCursorConsumer(
            fetch, handle, ProviderContract(), store=store, stream="orders"
        )
        with pytest.raises(InvalidResponse, match="digest"):
            await consumer.step()
        assert handled == []
        assert _keys(redis_client, namespace) == before
    finally:
        await store.aclose()


def test_an_async_handler_given_to_the_sync_consumer_is_refused_and_its_event_not_skipped(
    store: CursorStore,
) -> None:
    """``handle_event`` returned a coroutine the sync consumer never awaited: the handler
    did not run, yet the event got its receipt and the checkpoint moved past it, skipped
    for good (a RuntimeWarning was all that showed). Now the step raises InvalidInput with
    no receipt written, and a handler that runs applies the event on the next step."""
    store.start("orders", b"first")
    page = Page([Event("evt-1", 1, {"amount": 10})], b"next")

    async def handle(event: Event, context: Any) -> None:
        raise AssertionError("never awaited")  # pragma: no cover

    def fetch(cursor: bytes) -> Page:
        return page if cursor == b"first" else Page([], cursor)

    consumer = CursorConsumer(fetch, handle, ProviderContract(), store=store, stream="orders")
    with pytest.raises(InvalidInput, match="AsyncCursorConsumer"):
        consumer.step()
    assert store.receipts("orders") == []
    checkpoint = store.checkpoint("orders")
    assert checkpoint is not None
    assert checkpoint.cursor == b"first"

    handled: list[str] = []
    consumer.handle_event = lambda event, context: handled.append(event.id)
    assert consumer.step().outcome is StepOutcome.PROMOTED
    assert handled == ["evt-1"]


@pytest.mark.asyncio
async def test_an_async_handler_that_returns_an_unawaited_coroutine_is_refused(
    redis_url: str, namespace: str
) -> None:
    store = AsyncCursorStore(aioredis.Redis.from_url(redis_url), namespace=namespace)
    try:
        await store.start("orders", b"first")

        async def effect() -> None:
            raise AssertionError("never awaited")  # pragma: no cover

        async def handle(event: Event, context: Any) -> Any:
            return effect()  # the await forgotten

        async def fetch(cursor: bytes) -> Page:
            return Page([Event("evt-1", 1, {"amount": 10})], b"next")

        consumer = AsyncCursorConsumer(
            fetch, handle, ProviderContract(), store=store, stream="orders"
        )
        with pytest.raises(InvalidInput, match="never awaited"):
            await consumer.step()
        assert await store.receipts("orders") == []
    finally:
        await store.aclose()


@pytest.mark.asyncio
async def test_a_plain_handler_given_to_the_async_consumer_applies_its_event_once(
    redis_url: str, namespace: str
) -> None:
    """A plain function given as the async consumer's ``handle_event`` has handled the
    event when it returns: awaiting its ``None`` raised TypeError after the work, no
    receipt was written, and every later step handed the event over again. Its value now
    stands: the event is handled once, its receipt written, the checkpoint moved on."""
    store = AsyncCursorStore(aioredis.Redis.from_url(redis_url), namespace=namespace)
    try:
        await store.start("orders", b"first")
        handled: list[str] = []

        async def fetch(cursor: bytes) -> Page:
            if cursor == b"first":
                return Page([Event("evt-1", 1, {"amount": 10})], b"next")
            return Page([], cursor)

        consumer = AsyncCursorConsumer(
            fetch,
            lambda event, context: handled.append(event.id),  # type: ignore[arg-type,func-returns-value]
            ProviderContract(),
            store=store,
            stream="orders",
        )
        assert (await consumer.step()).outcome is StepOutcome.PROMOTED
        await consumer.run(max_steps=5)
        assert handled == ["evt-1"]
        assert [r.event_id for r in await store.receipts("orders")] == ["evt-1"]
        checkpoint = await store.checkpoint("orders")
        assert checkpoint is not None
        assert checkpoint.cursor == b"next"
    finally:
        await store.aclose()
