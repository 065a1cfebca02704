"""A payload of bytes is digested as its bytes whatever bytes-like type holds it (``bytes``,
``bytearray``, ``memoryview``), against a real Redis.

``Event`` digested only ``bytes`` as bytes: a ``bytearray`` or ``memoryview`` payload (what
a socket read or a buffer hands over) went through canonical JSON as a base64 string, so
the same bytes had two digests. A retry whose client handed the same event's payload in the
other type was taken for a rewritten event (``ReceiptConflict``: the stream stopped, asking
for a fresh snapshot) though nothing had changed."""

from __future__ import annotations

import hashlib

import pytest

from settle.cursor import CursorConsumer, CursorStore, Event, Page, ProviderContract, StepOutcome
from settle.cursor.models import Classification
from tests.cursor.conftest import Sink
from tests.cursor.helpers import Crash


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_bytes_like_payloads_are_digested_as_their_bytes(kind: type) -> None:
    data = b'{"amount": 10}\x00\xff'
    expected = hashlib.sha256(data).hexdigest()
    assert Event("a", 1, kind(data)).digest == expected


def test_a_memoryview_of_every_other_byte_is_digested_as_those_bytes() -> None:
    """A strided view (not contiguous) is digested as the bytes it shows, as ``bytes`` of
    them would be; hashing the view itself would fail (``BufferError``)."""
    view = memoryview(b"a-c-e-")[::2]
    assert Event("a", 1, view).digest == Event("a", 1, b"ace").digest


def test_a_retry_that_hands_the_same_bytes_in_another_type_is_an_exact_replay(
    store: CursorStore, sink: Sink
) -> None:
    bodies = [b"first", b"second"]
    kinds = iter([bytes, bytearray])  # the first response, then its retry

    def fetch_page(cursor: bytes) -> Page:
        kind = next(kinds)
        return Page(
            [Event(f"e{i}", i, kind(body)) for i, body in enumerate(bodies, start=1)], b"next"
        )

    crashed = {"armed": True}

    def handle(event: Event, ctx) -> None:  # type: ignore[no-untyped-def]
        if event.id == "e2" and crashed["armed"]:
            crashed["armed"] = False
            raise Crash  # the worker dies after e1's receipt, before e2's
        sink(event, ctx)

    store.start("s", b"start")
    consumer = CursorConsumer(fetch_page, handle, ProviderContract(), store=store, stream="s")
    with pytest.raises(Crash):
        consumer.step()
    result = consumer.step()
    assert result.outcome is StepOutcome.PROMOTED
    assert result.classification is Classification.EXACT_REPLAY
    assert (result.applied, result.skipped) == (1, 1)
    assert sink.applied() == ["e1", "e2"]
