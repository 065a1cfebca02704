"""Workers of one namespace may run with different ``max_result_bytes``. A long decline
message was cut to fit each worker's own cap (or stored whole where it fit), so the same
decline settled again by a worker with another cap (a repeat after a lost reply, a second
process finishing the same attempt) stored other bytes: it was quarantined as a
``conflicting_settlement``, not absorbed as the duplicate it is. A long message is now cut
at a fixed length, whatever the cap (docs/outbound-calls.md). Real Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from settle import Reserved, Settler, Verdict
from settle.errors import OperationFailed

P = "tenant:a"
PAGE = "<html>" + "declined " * 20_000 + "</html>"  # a provider's error page, ~180 KB


class Declined(Exception):
    pass


@pytest.fixture
def workers(redis_url: str, namespace: str) -> Iterator[tuple[Settler, Settler]]:
    with (
        Settler.from_url(redis_url, namespace=namespace, shards=4) as large,  # 1 MiB
        Settler.from_url(
            redis_url, namespace=namespace, shards=4, max_result_bytes=64 << 10
        ) as small,
    ):
        yield large, small


def test_the_same_long_decline_from_a_worker_with_another_cap_is_absorbed(
    workers: tuple[Settler, Settler],
) -> None:
    large, small = workers
    r = large.reserve("charge:1", {"n": 1}, principal=P)
    assert isinstance(r, Reserved)
    first = large.fail(r.reservation, Declined(PAGE))
    assert first.verdict is Verdict.ACCEPTED
    again = small.fail(r.reservation, Declined(PAGE))
    assert again.verdict is Verdict.ABSORBED
    assert again.quarantine_id is None
    assert small.quarantine.list() == []


def test_a_long_decline_is_stored_the_same_whatever_the_cap(
    workers: tuple[Settler, Settler],
) -> None:
    stored = []
    for n, settler in enumerate(workers):

        @settler.operation(key=f"charge:{n}", principal=P, terminal=(Declined,))
        def charge() -> str:
            raise Declined(PAGE)

        with pytest.raises(OperationFailed) as failed:
            charge()
        stored.append(failed.value.failure)
    assert stored[0] == stored[1]
    message = stored[0].message
    assert message.startswith("<html>declined")
    assert message.endswith(f" [settle: message cut from {len(PAGE)} characters]")


def _stored_failure(settler: Settler, op: str, message: str) -> str:
    r = settler.reserve(op, {"n": 1}, principal=P)
    assert isinstance(r, Reserved)
    assert settler.fail(r.reservation, Declined(message)).verdict is Verdict.ACCEPTED
    record = settler.get(op)
    assert record is not None
    assert record.failure is not None
    return record.failure.message


@pytest.mark.parametrize(
    ("length", "stored"),
    [(2048, "whole"), (2049, "cut")],
)
def test_a_message_is_cut_at_2048_characters_whatever_the_cap(
    workers: tuple[Settler, Settler], length: int, stored: str
) -> None:
    # The length is the promise of docs/outbound-calls.md: another bound on one worker (a
    # release, a patch) would quarantine its repeats of another's declines.
    message = "d" * length
    for n, settler in enumerate(workers):
        kept = _stored_failure(settler, f"cut:{length}:{n}", message)
        if stored == "whole":
            assert kept == message
        else:
            assert kept == f"{'d' * 2048} [settle: message cut from {length} characters]"


def test_workers_whose_small_caps_take_the_same_cut_store_the_same_failure(
    redis_url: str, namespace: str
) -> None:
    # 5,000 two-byte characters: a cut of 1024 takes over 2 KiB, one of 512 about 1 KiB, so
    # caps of 1,500 and 2,000 bytes both take the cut of 512 (a cut to each cap's longest
    # fit gave each worker its own bytes).
    page = "é" * 5000
    kept = []
    for n, cap in enumerate((1500, 2000)):
        with Settler.from_url(
            redis_url, namespace=namespace, shards=4, max_result_bytes=cap
        ) as settler:
            kept.append(_stored_failure(settler, f"small:{n}", page))
    note = " [settle: message cut from 5000 characters to fit max_result_bytes]"
    assert kept == ["é" * 512 + note] * 2
