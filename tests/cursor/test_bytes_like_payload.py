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
from settle.cursor.errors import ReceiptConflict
from settle.cursor.models import MAX_POSITION, Classification
from settle.fingerprint import canonical_json
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


def test_a_receipt_of_the_old_digest_meets_its_event_again_and_the_documented_digest_passes(
    store: CursorStore, sink: Sink
) -> None:
    """Upgrading (docs/cursor-checkpoints.md, "Payloads in a bytearray or memoryview"): a
    receipt written before the fix holds the digest of the canonical JSON of the payload.
    An inclusive provider repeats the boundary event on its very next page, so the stream
    stops there with no response pending (``ReceiptConflict``, ``changed_payload``), and
    the advised recovery, a fresh snapshot, reads the same receipts again. Handing the
    events applied before the upgrade the old digest, as the docs say, lets it go on."""
    log = [(f"e{i}", i, bytearray(f"body-{i}".encode())) for i in range(1, 7)]
    old_up_to = {"position": MAX_POSITION}  # events digested the old way: all, at first

    def event(id_: str, position: int, payload: bytearray) -> Event:
        if position <= old_up_to["position"]:
            return Event(id_, position, payload, digest=old_digest(payload))
        return Event(id_, position, payload)

    def fetch_page(cursor: bytes) -> Page:
        after = int(cursor.decode().split(":")[1])
        # Inclusive: a page after the first repeats the previous page's last event.
        shown = [e for e in log if (e[1] >= after if after else e[1] > 0)][:3]
        return Page([event(*e) for e in shown], successor=f"at:{shown[-1][1]}".encode())

    store.start("s", b"at:0")
    contract = ProviderContract(boundary="inclusive")
    consumer = CursorConsumer(fetch_page, sink, contract, store=store, stream="s")
    assert consumer.step().boundary == 3  # before the upgrade
    old_up_to["position"] = -1  # upgraded: every payload digested as its bytes
    with pytest.raises(ReceiptConflict) as caught:
        consumer.step()
    assert caught.value.reason == "changed_payload"
    old_up_to["position"] = 3  # as documented: the boundary at the upgrade
    assert consumer.run()[-1].outcome is StepOutcome.HELD
    assert sink.applied() == [e[0] for e in log]
    assert max(sink.calls.values()) == 1


def old_digest(payload: bytearray) -> str:
    """The digest settle gave a ``bytearray`` payload before the fix (and the one the docs
    say to hand such an event applied before the upgrade)."""
    return hashlib.sha256(canonical_json(payload)).hexdigest()
