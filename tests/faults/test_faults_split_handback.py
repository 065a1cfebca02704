"""Which refusals the runner hands back to a caller that reads a call's keys apart
(``Call.caller_splits``): a migration's refusal (TRYAGAIN, redis-py's "TTL exhausted"),
neither repeated nor logged as a failure. Never CLUSTERDOWN (a ClusterError too: no node
serves the slot, which no read apart gets past), never a call whose caller does not split
(every write), never another transient failure: those are repeated as before."""

from __future__ import annotations

import pytest
from redis import exceptions as rx

from settle._runtime.calls import Call
from settle._runtime.transient import handed_back, retry_options

pytestmark = [pytest.mark.faults]

READ = Call("quarantine_read", ("s", "r"), (), caller_splits=True)
WRITE = Call("reserve", ("r", "l"), (), operation_id="op-1")

SPLIT = [
    rx.TryAgainError("Multiple keys request during rehashing of slot"),
    rx.ClusterError("TTL exhausted."),
]
OTHERS = [
    rx.ClusterDownError("The cluster is down"),
    rx.ConnectionError("Connection closed by server."),
    rx.TimeoutError("Timeout reading from socket"),
]


def _repeated(call: Call, exc: BaseException) -> bool:
    """Whether the runner's repeats (after its first try) would send ``call`` again."""
    return bool(retry_options(call)["retry"].predicate(exc))


@pytest.mark.parametrize("exc", SPLIT, ids=type)
def test_a_migrations_refusal_of_a_read_split_apart_is_handed_back_unrepeated(
    exc: BaseException,
) -> None:
    # A repeat whose try met the refusal after another failure (a dropped connection, then
    # TRYAGAIN) ends the tries too: the reads apart serve it now.
    assert handed_back(READ, exc)
    assert not _repeated(READ, exc)


@pytest.mark.parametrize("exc", SPLIT, ids=type)
def test_a_migrations_refusal_of_a_call_whose_caller_does_not_split_is_repeated(
    exc: BaseException,
) -> None:
    assert not handed_back(WRITE, exc)
    assert not handed_back(None, exc)
    assert _repeated(WRITE, exc)


@pytest.mark.parametrize("exc", OTHERS, ids=type)
def test_a_cluster_down_or_a_dropped_connection_is_no_split(exc: BaseException) -> None:
    assert not handed_back(READ, exc)
    assert _repeated(READ, exc)
