"""A terminal failure is the function's definite answer (a decline): one whose message is
longer than ``max_result_bytes`` allows (a provider's HTML error page in the exception) was
refused whole with ``ResultTooLarge``, the operation left provisional, and the next call ran
the function again. Its message is cut to fit now; its type and data are kept whole."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import tenacity

from settle import Settler
from settle.errors import OperationFailed, ResultTooLarge
from settle.models import State


class Declined(Exception):
    def __init__(self, message: str, data: object = None) -> None:
        super().__init__(message)
        self.settle_data = data


@pytest.fixture
def small(redis_url: str, namespace: str) -> Iterator[Settler]:
    with Settler.from_url(
        redis_url, namespace=namespace, shards=4, max_result_bytes=2048
    ) as settler:
        yield settler


def test_a_decline_with_a_long_message_is_stored_cut_and_replayed(small: Settler) -> None:
    page = "<html>" + "é" * 5000 + "</html>"  # an error page: over 2 KiB in JSON
    calls: list[str] = []

    @small.operation(
        key="charge:{order_id}",
        principal="tenant:a",
        terminal=(Declined,),
        retry=tenacity.Retrying(stop=tenacity.stop_after_attempt(3), reraise=True),
    )
    def charge(order_id: str) -> str:
        calls.append(order_id)
        raise Declined(page, data={"code": "card_declined"})

    with pytest.raises(OperationFailed):
        charge("o-1")
    with pytest.raises(OperationFailed) as replayed:
        charge("o-1")
    assert calls == ["o-1"]  # the definite answer was kept: the decline did not run again
    record = small.get("charge:o-1")
    assert record is not None
    assert record.state is State.FAILED
    failure = replayed.value.failure
    assert failure.data == {"code": "card_declined"}
    assert failure.message.startswith("<html>éé")
    assert failure.message.endswith(
        f" [settle: message cut from {len(page)} characters to fit max_result_bytes]"
    )
    assert failure.error_type.endswith("Declined")


def test_a_failure_whose_data_is_too_large_is_still_refused(small: Settler) -> None:
    """Its data is part of the answer: it is never cut, and a failure that cannot fit
    however short its message is unstorable, as before."""
    reservation = small.reserve("big", {"n": 1}, principal="tenant:a").reservation
    with pytest.raises(ResultTooLarge):
        small.fail(reservation, Declined("declined", data={"blob": "x" * 4096}))
    record = small.get("big")
    assert record is not None
    assert record.state is State.PENDING
