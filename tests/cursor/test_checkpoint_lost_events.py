"""A cursor's rejections are said in its log (docs/observability.md, "Log events"): a
checkpoint lost (a restart without persistence, FLUSHALL, a key deleted) is the operator's
first sign that the stream's progress is gone, and a witness changed under the checkpoint
by something other than settle is corruption."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

from settle.cursor import CursorConsumer, CursorStore, Event, Page, ProviderContract
from settle.cursor.errors import CheckpointMissing
from settle.errors import CorruptRecord


def _events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == name]


def _consumed(store: CursorStore) -> CursorConsumer:
    store.start("orders", b"first")
    consumer = CursorConsumer(
        lambda cursor: (
            Page([Event("evt-1", 1, {"amount": 10})], b"next")
            if cursor == b"first"
            else Page([], cursor)
        ),
        lambda event, context: None,
        ProviderContract(),
        store=store,
        stream="orders",
    )
    consumer.step()
    return consumer


def test_a_step_on_a_stream_whose_checkpoint_was_lost_says_so(
    store: CursorStore, redis_client: redis.Redis, namespace: str
) -> None:
    store.start("orders", b"first")
    handled: list[str] = []
    consumer = CursorConsumer(
        lambda cursor: Page([Event("evt-1", 1, {"amount": 10})], b"next"),
        lambda event, context: handled.append(event.id),
        ProviderContract(),
        store=store,
        stream="orders",
    )
    for key in redis_client.scan_iter(match=f"settle:{{{namespace}:*"):
        redis_client.delete(key)  # what a restart without persistence leaves
    with capture_logs() as logs, pytest.raises(CheckpointMissing):
        consumer.step()
    [said] = _events(logs, "settle.cursor.checkpoint_missing")
    assert said["log_level"] == "warning"
    assert said["stream"] == "orders"
    assert handled == []
    # asking whether a checkpoint exists is no rejection: None, nothing logged
    with capture_logs() as logs:
        assert store.checkpoint("orders") is None
    assert _events(logs, "settle.cursor.checkpoint_missing") == []


def test_a_witness_deleted_under_its_checkpoint_is_said_to_be_corrupt(
    store: CursorStore, redis_client: redis.Redis, namespace: str
) -> None:
    """A handler that deletes its step's witness (something other than settle changing the
    stream's keys while the checkpoint keeps its generation): CorruptRecord, logged."""
    store.start("orders", b"first")
    pattern = f"settle:{{{namespace}:*"

    def handle(event: Event, context: Any) -> None:
        for key in redis_client.scan_iter(match=pattern):
            if key.endswith((b":wit", b":wits")):  # the step's witness and its index
                redis_client.delete(key)

    consumer = CursorConsumer(
        lambda cursor: Page([Event("evt-1", 1, {"amount": 10})], b"next"),
        handle,
        ProviderContract(),
        store=store,
        stream="orders",
    )
    with capture_logs() as logs, pytest.raises(CorruptRecord):
        consumer.step()
    [said] = _events(logs, "settle.cursor.corrupt")
    assert said["log_level"] == "error"
    assert said["script"] == "outcome"


def test_a_witness_that_does_not_read_as_settle_writes_it_is_said_to_be_corrupt(
    store: CursorStore, redis_client: redis.Redis, namespace: str
) -> None:
    """A witness's events changed by hand into text that is no JSON list: CorruptRecord
    from reading the witnesses, and the same event as every other corruption."""
    _consumed(store)
    [key] = redis_client.scan_iter(match=f"settle:{{{namespace}:*}}:wit")
    [field] = [f for f in redis_client.hkeys(key) if f.endswith(b"|events")]
    redis_client.hset(key, field, "not json")
    with capture_logs() as logs, pytest.raises(CorruptRecord):
        store.witnesses("orders")
    [said] = _events(logs, "settle.cursor.corrupt")
    assert said["log_level"] == "error"
    assert said["script"] == "witnesses"


# A time no clock gives (a receipt's or the checkpoint's, changed by hand) escaped as a bare
# OSError, with no CorruptRecord and no event (review).
def test_a_receipt_whose_time_is_out_of_range_is_said_to_be_corrupt(
    store: CursorStore, redis_client: redis.Redis, namespace: str
) -> None:
    _consumed(store)
    key = f"settle:{{{namespace}:cursor:orders}}:rcpt"
    value = redis_client.hget(key, "evt-1")
    assert value is not None
    parts = value.split(b" ")
    redis_client.hset(key, "evt-1", b" ".join([*parts[:-1], b"99999999999999999999"]))
    with capture_logs() as logs, pytest.raises(CorruptRecord):
        store.receipts("orders")
    [said] = _events(logs, "settle.cursor.corrupt")
    assert said["script"] == "receipts"


def test_a_checkpoint_whose_time_is_out_of_range_is_said_to_be_corrupt(
    store: CursorStore, redis_client: redis.Redis, namespace: str
) -> None:
    _consumed(store)
    redis_client.hset(f"settle:{{{namespace}:cursor:orders}}:ckpt", "updated", "9" * 20)
    with capture_logs() as logs, pytest.raises(CorruptRecord):
        store.checkpoint("orders")
    assert len(_events(logs, "settle.cursor.corrupt")) == 1
