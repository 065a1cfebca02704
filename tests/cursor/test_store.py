"""The store's contract: bad input writes nothing, keys share one hash tag, scripts survive a
flushed script cache, cursors never reach the logs, the sync shell does not drift."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import pytest
import redis
from structlog.testing import capture_logs

from settle.cursor import (
    Coverage,
    CoverageNotProven,
    CursorConsumer,
    CursorStore,
    Event,
    Page,
    ProviderContract,
)
from settle.cursor._keys import stream_keys
from settle.cursor.errors import CheckpointMissing, CursorError, InvalidResponse
from settle.cursor.models import Recovery
from settle.errors import CorruptRecord, InvalidInput, SettleError
from tests.cursor.provider import fetcher

ROOT = Path(__file__).resolve().parents[2]


def keys_of(client: redis.Redis, namespace: str) -> list[bytes]:
    return sorted(client.scan_iter(match=f"settle:{{{namespace}:cursor:*", count=1000))


def test_bad_stream_names_and_cursors_write_nothing(store, redis_client, namespace) -> None:
    for stream in ["", "x" * 257, "a\nb", "a{b", "a}b", 42]:
        with pytest.raises(InvalidInput):
            store.start(stream, b"c")  # type: ignore[arg-type]
    for cursor in ["text", None, b"x" * (64 << 10 + 1)]:
        with pytest.raises(InvalidInput):
            store.start("s", cursor)  # type: ignore[arg-type]
    for boundary in [-2, 1.5, True, 1 << 53]:  # -1 is "nothing applied yet"
        with pytest.raises(InvalidInput):
            store.start("s", b"c", boundary=boundary)  # type: ignore[arg-type]
    assert keys_of(redis_client, namespace) == []


@pytest.mark.parametrize("separator", ["\u2028", "\u2029"])
def test_a_stream_name_with_a_line_separator_writes_nothing(
    store, redis_client, namespace, separator
) -> None:
    """U+2028 / U+2029 break a line in a log viewer or a terminal as LF does: refused in a
    stream name as in an operation id (one rule for every part)."""
    with pytest.raises(InvalidInput, match="control characters"):
        store.start(f"orders{separator}2", b"c")
    assert keys_of(redis_client, namespace) == []


def test_reading_a_stream_that_was_never_started(store) -> None:
    assert store.checkpoint("never") is None
    c = CursorConsumer(
        lambda c: Page([], c), lambda e, x: None, ProviderContract(), store=store, stream="never"
    )
    with pytest.raises(CheckpointMissing) as info:
        c.step()
    assert isinstance(info.value, SettleError)
    assert "start(" in str(info.value)


@pytest.mark.parametrize(
    ("page", "contract"),
    [
        ("not a page", {}),
        (Page([Event("a", 2), Event("b", 1)], b"n"), {}),
        (Page([Event("a", 1), Event("a", 2)], b"n"), {}),
        (Page([Event("a", -1)], b"n"), {}),
        (Page([Event("", 1)], b"n"), {}),
        (Page([Event("a", 1)], "n"), {}),  # type: ignore[arg-type]
        (Page([Event("a", 1, digest="x y")], b"n"), {}),  # a receipt holds it between spaces
        (Page([Event("a", 1, digest="d" * 513)], b"n"), {}),
        (Page([Event("a", 1, digest="a\tb")], b"n"), {}),
        (Page([Event("a", 1, digest=5)], b"n"), {}),  # type: ignore[arg-type]
        (Page([], b"n", coverage=Coverage(0, 1)), {}),
        (Page([Event("a", 1)], b"n", snapshot="s\x1b[2J"), {}),  # stored, shown by the CLI
        (Page([Event("a\u2028b", 1)], b"n"), {}),  # a line separator breaks a log line too
        (Page([Event("a", 1)], b"n", snapshot="s\u2029"), {}),
        (
            Page([], b"n", coverage=Coverage(3, 1)),
            {"coverage_watermarks": True},
        ),
    ],
)
def test_an_invalid_page_is_rejected_before_anything_is_written(
    store, redis_client, namespace, page, contract
) -> None:
    g0 = store.start("s", b"c").generation
    before = keys_of(redis_client, namespace)
    handled = []
    c = CursorConsumer(
        lambda cursor: page,
        lambda e, ctx: handled.append(e),
        ProviderContract(**contract),
        store=store,
        stream="s",
    )
    with pytest.raises(InvalidResponse):
        c.step()
    assert keys_of(redis_client, namespace) == before
    assert handled == []
    assert store.checkpoint("s").generation == g0


def test_every_key_of_a_stream_shares_one_hash_tag() -> None:
    keys = stream_keys("ns", "orders")
    tags = {k[k.index("{") : k.index("}") + 1] for k in keys}
    assert tags == {"{ns:cursor:orders}"}
    assert len(set(keys)) == 5


def test_scripts_reload_after_the_script_cache_is_flushed(serve, store, http, sink) -> None:
    server = serve(page_size=2)
    server.provider.append(4)
    store.start("s", server.provider.token(0).encode())
    c = CursorConsumer(fetcher(server.url, http), sink, ProviderContract(), store=store, stream="s")
    c.step()
    store.client.script_flush()
    c.step()
    assert store.checkpoint("s").boundary == 4


def test_cursors_and_payloads_never_reach_the_logs(serve, store, http, sink) -> None:
    server = serve(page_size=2, rotate=True)
    p = server.provider
    p.append(3)
    first = p.token(0)
    store.start("s", first.encode())
    c = CursorConsumer(fetcher(server.url, http), sink, ProviderContract(), store=store, stream="s")
    with capture_logs() as logs:
        c.step()
        c.step()
    names = {entry["event"] for entry in logs}
    assert {"settle.cursor.witness_recorded", "settle.cursor.promoted"} <= names
    text = repr(logs)
    for token in p.tokens:
        assert token not in text
    assert '"v"' not in text


def test_a_corrupt_checkpoint_is_reported_and_left_alone(store, redis_client, namespace) -> None:
    key = stream_keys(namespace, "s")[0]
    redis_client.set(key, b"not a checkpoint")
    with pytest.raises(CorruptRecord):
        store.start("s", b"c")
    assert redis_client.get(key) == b"not a checkpoint"


@pytest.mark.parametrize(("field", "value"), [("gen", b"01"), ("gen", b"+1"), ("bound", b" 0")])
def test_a_checkpoint_number_settle_never_writes_is_corrupt(
    store, redis_client, namespace, field, value
) -> None:
    """The scripts compare a checkpoint's generation as text: one stored as ``01`` would
    never match 1 (every step superseded, reset refused), so it is reported as corrupt, by
    the reads and the steps alike, and left alone."""
    store.start("s", b"c")
    key = stream_keys(namespace, "s")[0]
    redis_client.hset(key, field, value)
    before = keys_of(redis_client, namespace), redis_client.hgetall(key)
    with pytest.raises(CorruptRecord):
        store.checkpoint("s")
    c = CursorConsumer(
        lambda cursor: Page([Event("a", 1)], b"n"),
        lambda e, ctx: None,
        ProviderContract(),
        store=store,
        stream="s",
    )
    with pytest.raises(CorruptRecord):
        c.step()
    assert (keys_of(redis_client, namespace), redis_client.hgetall(key)) == before


def test_divergence_errors_are_picklable_and_name_the_recovery() -> None:
    err = CoverageNotProven(
        "gap", stream="s", recovery=Recovery.STABLE_BOUNDARY, generation=3, boundary=7, reason="gap"
    )
    again = pickle.loads(pickle.dumps(err))
    assert (again.stream, again.recovery, again.boundary) == ("s", Recovery.STABLE_BOUNDARY, 7)
    assert "reset(cursor=..., boundary=7)" in str(again)


def test_unicode_event_ids_survive_the_scripts(store, sink) -> None:
    events = [Event("évé-😀", 1, b"raw bytes"), Event("日本", 2, {"x": [1, 2]})]
    store.start("s", b"start")
    c = CursorConsumer(
        lambda cursor: Page(events if cursor == b"start" else [], b"next"),
        sink,
        ProviderContract(),
        store=store,
        stream="s",
    )
    assert c.step().applied == 2
    assert c.step().outcome.value == "held"
    assert sink.applied() == ["évé-😀", "日本"]
    [held, w] = store.witnesses("s")
    assert (held.events, held.reason) == ((), "held")
    assert [e.id for e in w.events] == ["évé-😀", "日本"]
    assert store.checkpoint("s").cursor == b"next"


def test_models_keep_cursors_out_of_their_repr(store) -> None:
    ck = store.start("s", b"very-secret-cursor")
    assert "very-secret-cursor" not in repr(ck)
    assert ck.cursor_digest[:16] in repr(ck)


def test_old_witnesses_and_receipts_are_pruned_at_promotion(
    redis_url, namespace, redis_client, sink
) -> None:
    store = CursorStore.from_url(
        redis_url, namespace=namespace, keep_generations=2, receipt_horizon=3
    )
    log = [Event(f"e{i}", i, i) for i in range(1, 11)]

    def fetch(cursor: bytes) -> Page:
        after = int(cursor)
        page = [e for e in log if e.position > after][:1]
        return Page(page, str(page[-1].position if page else after).encode())

    g0 = store.start("s", b"0").generation
    CursorConsumer(fetch, sink, ProviderContract(), store=store, stream="s").run()
    ck = store.checkpoint("s")
    assert (ck.generation, ck.boundary) == (g0 + 10, 10)
    witnesses = store.witnesses("s", limit=100)
    assert sorted(w.generation for w in witnesses if w.reason != "held") == [g0 + 8, g0 + 9]
    # The last, empty answer is on record at generation 11 (held, never promoted).
    assert [(w.generation, w.events) for w in witnesses if w.reason == "held"] == [(g0 + 10, ())]
    _, _, _, receipts, _ = stream_keys(namespace, "s")
    assert sorted(redis_client.hkeys(receipts)) == [b"e10", b"e7", b"e8", b"e9"]
    store.close()
    with pytest.raises(InvalidInput):
        CursorStore.from_url(redis_url, namespace=namespace, keep_generations=0)
    for horizon in (0, 1.5, True, 1 << 53, 10**5000):  # refused up front, never sent
        with pytest.raises(InvalidInput):
            CursorStore.from_url(redis_url, namespace=namespace, receipt_horizon=horizon)


def test_a_consumer_rejects_a_bad_stream_or_contract(store) -> None:
    with pytest.raises(InvalidInput):
        CursorConsumer(lambda c: Page([], c), print, ProviderContract(), store=store, stream="")
    with pytest.raises(InvalidInput):
        CursorConsumer(lambda c: Page([], c), print, {"rotation": True}, store=store, stream="s")
    for wait in (0, -1, float("nan"), float("inf"), 7 * 86_400 + 1, True, "300", None):
        with pytest.raises(InvalidInput, match="stand_down_for"):
            CursorConsumer(
                lambda c: Page([], c),
                print,
                ProviderContract(),
                store=store,
                stream="s",
                stand_down_for=wait,  # type: ignore[arg-type]
            )


def test_a_checkpoint_made_again_after_a_loss_never_issues_an_earlier_generation(
    store: CursorStore, redis_client: redis.Redis, namespace: str
) -> None:
    """SPEC 1: a generation is never issued twice in a namespace, not after what held it was
    lost. Redis loses every key of the stream (a restart without persistence, FLUSHALL, a
    DEL by hand); the next start() makes the checkpoint again, at a generation above every
    one issued before, so a reset (or any compare-and-swap) decided before the loss is
    refused instead of landing on the new checkpoint. A checkpoint's first generation used
    to be 1 every time."""
    first = store.start("s", b"c0")
    ck = store.reset("s", cursor=b"c1", boundary=1, expected_generation=first.generation)
    ck = store.reset("s", cursor=b"c2", boundary=2, expected_generation=ck.generation)
    issued = ck.generation
    time.sleep(0.002)  # a real loss takes longer than a millisecond of the server clock
    redis_client.delete(*keys_of(redis_client, namespace))

    again = store.start("s", b"c0")
    assert again.generation > issued
    with pytest.raises(CursorError):  # decided on the checkpoint before the loss
        store.reset("s", cursor=b"c9", boundary=9, expected_generation=issued)
    assert store.checkpoint("s").generation == again.generation
    # The first generation comes from the server clock (its microseconds).
    seconds, micros = redis_client.time()
    assert again.generation <= seconds * 1_000_000 + micros
    assert again.generation > (seconds - 60) * 1000 * 1000


def test_a_checkpoint_lost_and_made_again_within_a_millisecond_issues_no_earlier_generation(
    store: CursorStore, redis_client: redis.Redis, namespace: str
) -> None:
    """SPEC 1 without the sleep: a program that deletes a stream's keys and starts it again
    at once (a rebuild by hand, an admin routine) does it well within a millisecond of the
    server clock. The generations the lost checkpoint issued (its first, and one more per
    reset) must still all be below the new checkpoint's first, else a reset decided before
    the loss lands on the new checkpoint."""
    for i in range(40):
        stream = f"quick-{i}"
        ck = store.start(stream, b"c0")
        ck = store.reset(stream, cursor=b"c1", boundary=1, expected_generation=ck.generation)
        ck = store.reset(stream, cursor=b"c2", boundary=2, expected_generation=ck.generation)
        issued = ck.generation
        redis_client.delete(*stream_keys(namespace, stream))
        again = store.start(stream, b"c0")
        assert again.generation > issued, (i, issued, again.generation)
        with pytest.raises(CursorError):  # decided on the checkpoint before the loss
            store.reset(stream, cursor=b"c9", boundary=9, expected_generation=issued)


@pytest.mark.parametrize("control", ["\x85", "\ud800"])
def test_a_stream_name_with_a_c1_control_or_a_lone_surrogate_writes_nothing(
    store, redis_client, namespace, control
) -> None:
    """NEL (U+0085) breaks a line beyond ASCII; a lone surrogate cannot be encoded to be
    stored: refused in a stream name as in an operation id."""
    with pytest.raises(InvalidInput, match="control characters"):
        store.start(f"orders-é{control}2", b"c")
    assert keys_of(redis_client, namespace) == []


def test_a_stream_name_in_any_script_with_emoji_is_accepted(store) -> None:
    """Letters of any script, emoji and a no-break space are a name as any other."""
    for stream in ("注文-東京", "café\u00a0crème", "orders-🎉"):
        assert store.start(stream, b"c").generation >= 1
        assert store.checkpoint(stream) is not None
