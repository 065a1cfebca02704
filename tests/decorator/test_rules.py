"""The decorator's rules on the in-memory reference model (``settle.testing``), whose clock
is moved by hand: leases expire exactly when a test says so. No Redis needed."""

from __future__ import annotations

import math
import time

import pytest
import tenacity
from structlog.testing import capture_logs

from settle import (
    BindingMismatch,
    FingerprintError,
    OperationInProgress,
    Settler,
    StaleAttempt,
    State,
)
from settle._core.engine import MAX_LEASE
from settle.attempt import Attempt
from settle.errors import InvalidInput
from settle.testing import ManualClock, MemorySettler

P = "tenant:acme"
NO_WAIT = tenacity.wait_none()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def memory(clock: ManualClock) -> Settler:
    return MemorySettler(namespace="rules", clock=clock)


def test_retries_follow_the_tenacity_policy_under_new_generations_and_one_key(
    memory: Settler,
) -> None:
    seen: list[Attempt] = []

    @memory.operation(
        key="job:{n}",
        principal=P,
        retry=tenacity.Retrying(
            stop=tenacity.stop_after_attempt(5),
            wait=NO_WAIT,
            retry=tenacity.retry_if_exception_type(ConnectionError),
        ),
    )
    def job(n: int, attempt: Attempt = Attempt.INJECTED) -> int:
        seen.append(attempt)
        if len(seen) < 3:
            raise ConnectionError("reset by peer")
        return n * 10

    assert job(4) == 40
    assert [a.number for a in seen] == [1, 2, 3]
    assert seen[0].generation < seen[1].generation < seen[2].generation
    assert len({a.idempotency_key for a in seen}) == 1
    assert {a.operation_id for a in seen} == {"job:4"}


def test_an_error_the_policy_does_not_retry_is_raised_and_left_provisional(
    memory: Settler,
) -> None:
    calls = []

    @memory.operation(
        key="job:{n}",
        principal=P,
        retry=tenacity.Retrying(retry=tenacity.retry_if_exception_type(ConnectionError)),
    )
    def job(n: int) -> int:
        calls.append(n)
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        job(1)
    record = memory.get("job:1")
    assert record is not None
    assert (record.state, record.reason) == (State.PROVISIONAL, "error:ValueError")
    assert calls == [1]


def test_a_retry_delay_limit_counts_from_the_calls_start(memory: Settler) -> None:
    """``stop_after_delay`` counts from the start of the call, not from its first failure:
    a first attempt that ran past the limit is not retried."""
    calls = []

    @memory.operation(
        key="job:{n}",
        principal=P,
        retry=tenacity.Retrying(stop=tenacity.stop_after_delay(0.05), wait=NO_WAIT),
    )
    def job(n: int) -> int:
        calls.append(n)
        if len(calls) == 1:
            time.sleep(0.1)  # the first attempt alone outlasts the limit
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        job(1)
    assert calls == [1]


def test_default_policy_makes_three_attempts(memory: Settler) -> None:
    calls = []

    @memory.operation(key="job:{n}", principal=P)
    def job(n: int) -> int:
        calls.append(n)
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        job(1)
    assert len(calls) == 3


def test_sync_function_is_told_its_lease_is_lost(memory: Settler, clock: ManualClock) -> None:
    @memory.operation(key="job:{n}", principal=P, name="job", wait=0)  # another worker's job
    def takeover(n: int) -> str:
        return "second"

    lost_seen = []

    @memory.operation(key="job:{n}", principal=P, name="job", lease=0.3)
    def job(n: int, attempt: Attempt = Attempt.INJECTED) -> str:
        clock.advance(1)  # the lease passes (a long pause) ...
        assert takeover(n) == "second"  # ... and another worker takes over and completes
        for _ in range(500):  # the heartbeat notices within lease / 3
            if attempt.lost:
                break
            time.sleep(0.01)
        lost_seen.append((attempt.lost, attempt.lost_reason))
        attempt.check()  # raises StaleAttempt
        return "first"

    with pytest.raises(StaleAttempt) as info:
        job(1)

    assert lost_seen == [(True, "stale_generation")]
    record = info.value.record
    assert record is not None
    assert record.value(str) == "second"
    assert memory.quarantine.list(operation_id="job:1") == []


def test_a_lost_lease_is_no_definite_failure_whatever_terminal_lists(
    memory: Settler, clock: ManualClock
) -> None:
    """``attempt.check()``'s StaleAttempt is settle's signal to stop, not the function's
    answer: with ``terminal=(Exception,)`` it is not stored as a failure (a ``fail()`` of a
    superseded attempt, quarantined as a conflicting settlement); the newer attempt's
    result stands."""

    @memory.operation(key="job:{n}", principal=P, name="job", wait=0)  # another worker's job
    def takeover(n: int) -> str:
        return "second"

    @memory.operation(key="job:{n}", principal=P, name="job", lease=0.3, terminal=(Exception,))
    def job(n: int, attempt: Attempt = Attempt.INJECTED) -> str:
        clock.advance(1)
        assert takeover(n) == "second"
        for _ in range(500):  # the heartbeat notices within lease / 3
            if attempt.lost:
                break
            time.sleep(0.01)
        attempt.check()  # raises StaleAttempt
        return "first"

    with pytest.raises(StaleAttempt) as info:
        job(1)

    assert info.value.record is not None
    assert info.value.record.value(str) == "second"
    assert memory.quarantine.list(operation_id="job:1") == []
    assert job(1) == "second"


def test_a_result_returned_after_a_takeover_is_quarantined_not_returned(
    memory: Settler, clock: ManualClock
) -> None:
    @memory.operation(key="job:{n}", principal=P, name="job", wait=0)  # another worker's job
    def takeover(n: int) -> str:
        return "second"

    @memory.operation(key="job:{n}", principal=P, name="job", lease=30)
    def job(n: int) -> str:
        clock.advance(31)
        takeover(n)
        return "first"  # ignores the lost lease

    with pytest.raises(StaleAttempt) as info:
        job(1)

    assert info.value.record is not None
    assert info.value.record.value(str) == "second"
    [entry] = memory.quarantine.list(operation_id="job:1")
    assert info.value.quarantine_id == entry.ref
    assert entry.payload.data == b'"first"'
    assert job(1) == "second"


def test_waiting_for_a_live_lease_is_bounded(memory: Settler) -> None:
    # the decorator fingerprints {"function": name, "request": arguments}
    request = {"function": "job", "request": {"n": 1}}
    holder = memory.reserve("job:1", request, principal=P, lease=60)
    calls = []

    @memory.operation(key="job:{n}", principal=P, name="job", wait=0.2)
    def job(n: int) -> int:
        calls.append(n)
        return n

    with pytest.raises(OperationInProgress) as info:
        job(1)
    assert calls == []
    assert info.value.generation == holder.reservation.generation  # type: ignore[union-attr]


def test_sync_timeout_is_cooperative(memory: Settler) -> None:
    @memory.operation(
        key="job:{n}",
        principal=P,
        timeout=0.05,
        retry=tenacity.Retrying(stop=tenacity.stop_after_attempt(1)),
    )
    def job(n: int, attempt: Attempt = Attempt.INJECTED) -> int:
        remaining = attempt.remaining()
        assert remaining is not None
        assert remaining <= 0.05
        time.sleep(0.1)
        attempt.check()  # raises TimeoutError
        return n

    with pytest.raises(TimeoutError):
        job(1)
    record = memory.get("job:1")
    assert record is not None
    assert record.reason == "timeout"


def test_an_unstorable_result_leaves_the_operation_provisional(memory: Settler) -> None:
    @memory.operation(key="job:{n}", principal=P)
    def job(n: int) -> object:
        return object()  # no JSON form: the effect happened, its result cannot be stored

    with capture_logs() as logs, pytest.raises(FingerprintError):
        job(1)
    record = memory.get("job:1")
    assert record is not None
    assert (record.state, record.reason) == (State.PROVISIONAL, "unstorable_outcome")
    [event] = [e for e in logs if e["event"] == "settle.operation.unstorable"]
    assert (event["log_level"], event["action"], event["error_type"]) == (
        "warning",
        "complete",
        "FingerprintError",
    )
    assert event["generation"] == record.generation


def test_callable_key_principal_and_fingerprint(memory: Settler) -> None:
    calls = []

    @memory.operation(
        key=lambda order, trace_id, tenant: f"order:{order['id']}",
        principal=lambda order, trace_id, tenant: f"tenant:{tenant}",
        fingerprint=lambda order, trace_id, tenant: order,
    )
    def submit(order: dict[str, int], trace_id: str, tenant: str) -> int:
        calls.append(trace_id)
        return order["id"]

    assert submit({"id": 7}, "trace-a", "acme") == 7
    assert submit({"id": 7}, "trace-b", "acme") == 7  # trace id is not part of the request
    assert calls == ["trace-a"]
    with pytest.raises(BindingMismatch):
        submit({"id": 7}, "trace-c", "globex")


@pytest.mark.parametrize(
    "options",
    [
        {"lease": 0},
        {"timeout": -1},
        {"timeout": 0},
        {"wait": "soon"},
        {"wait": -1},
        {"retry": tenacity.stop_after_attempt(3)},
        {"terminal": (ValueError, "CardDeclined")},
        {"key": 42},
        {"principal": None},
        # Found in audit: NaN passed every check (``value < 0`` is False for it): a NaN
        # wait never gave up, a NaN timeout never fired; a lease past the core's range
        # failed only on each call.
        {"lease": math.nan},
        {"timeout": math.nan},
        {"wait": math.nan},
        {"lease": math.inf},
        {"timeout": math.inf},
        {"wait": math.inf},
        {"lease": MAX_LEASE + 1},
        {"lease": 10**400},
        {"timeout": 10**400},
    ],
)
def test_bad_options_are_refused_when_decorating(
    memory: Settler, options: dict[str, object]
) -> None:
    settings: dict[str, object] = {"key": "job", "principal": P, **options}

    def job() -> None:  # a function that is fine: only the options are wrong
        raise AssertionError("never run")

    with pytest.raises(InvalidInput):
        memory.operation(**settings)(job)  # type: ignore[arg-type]


def test_the_longest_lease_and_a_zero_wait_are_accepted(memory: Settler) -> None:
    @memory.operation(key="job", principal=P, lease=MAX_LEASE, wait=0, timeout=1e6)
    def job() -> int:
        return 1

    assert job() == 1


def test_a_stored_result_that_no_longer_fits_the_return_type_is_a_typed_error(
    memory: Settler,
) -> None:
    @memory.operation(key="job:{n}", principal=P, name="job")
    def job(n: int) -> str:
        return "text"

    @memory.operation(key="job:{n}", principal=P, name="job")  # the same function, changed
    def job_v2(n: int) -> int:
        raise AssertionError("replayed, never run")

    assert job(1) == "text"
    with pytest.raises(InvalidInput) as info:
        job_v2(1)
    assert info.value.operation_id == "job:1"


def test_the_attempt_parameter_is_found_without_resolvable_annotations(memory: Settler) -> None:
    seen: list[object] = []

    @memory.operation(key="job:{n}", principal=P)
    def by_default(n: int, attempt: UnknownName = Attempt.INJECTED) -> None:  # type: ignore[name-defined]  # noqa: F821
        seen.append(attempt)

    @memory.operation(key="job2:{n}", principal=P)
    def by_name(n: int, attempt: "settle.Attempt | None" = None) -> None:  # type: ignore[name-defined]  # noqa: F821, UP037
        seen.append(attempt)

    by_default(1)
    by_name(1)
    assert [type(a) for a in seen] == [Attempt, Attempt]
    assert all(a is not Attempt.INJECTED for a in seen)
    assert [a.operation_id for a in seen] == ["job:1", "job2:1"]  # type: ignore[attr-defined]
