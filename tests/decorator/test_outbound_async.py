"""``AsyncSettler.operation`` on coroutine functions, against a real payment provider over
HTTP and a real Redis. Every test here awaits the real async path."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Callable

import httpx
import pytest
import tenacity
from structlog.testing import capture_logs

from settle import (
    AsyncSettler,
    FingerprintMismatch,
    OperationFailed,
    OperationInProgress,
    QuarantineKind,
    Settler,
    StaleAttempt,
    State,
)
from settle.attempt import Attempt
from settle.errors import InvalidInput
from tests.cluster.split_cluster import SHARDS, split_cluster
from tests.decorator.payments import PRINCIPAL, ChargeRequest, Receipt, async_charge
from tests.decorator.provider import Provider
from tests.log_sink import logs_behind_a_failing_sink

pytestmark = pytest.mark.asyncio


async def test_timeout_after_provider_success_is_retried_into_one_effect(
    async_settler: AsyncSettler, provider: Provider, patient_retry: tenacity.Retrying
) -> None:
    provider.script("a-1", "slow:3")
    charge = async_charge(async_settler, provider.url, timeout=1.0, retry=patient_retry)
    request = ChargeRequest(order_id="a-1", amount=1250)

    receipt = await charge(request)

    assert provider.effects("a-1") == 1
    requests = provider.requests_for("a-1")
    assert requests >= 2
    record = await async_settler.get("charge:a-1")
    assert record is not None
    assert record.state is State.COMPLETED
    assert record.reservations >= 2
    assert record.value(Receipt) == receipt
    assert receipt.fencing_token < record.generation  # the effect happened in attempt 1
    observations = await async_settler.attempts("charge:a-1")
    assert ("mark_provisional", "accepted") in [(o.action, o.verdict) for o in observations]

    assert await charge(request) == receipt
    assert provider.requests_for("a-1") == requests


@pytest.mark.parametrize("behaviour", ["fail_after", "fail_before"])
async def test_provider_error_is_retried_and_settles_once(
    async_settler: AsyncSettler,
    provider: Provider,
    fast_retry: tenacity.Retrying,
    behaviour: str,
) -> None:
    provider.script("a-2", behaviour)
    charge = async_charge(async_settler, provider.url, retry=fast_retry)

    receipt = await charge(ChargeRequest(order_id="a-2", amount=500))

    assert provider.effects("a-2") == 1
    assert provider.requests_for("a-2") == 2
    assert receipt.amount == 500


async def test_exhausted_retries_raise_the_last_error(
    async_settler: AsyncSettler, provider: Provider, fast_retry: tenacity.Retrying
) -> None:
    provider.script("a-3", "fail_before", "fail_before", "fail_before")
    charge = async_charge(async_settler, provider.url, retry=fast_retry)

    with pytest.raises(httpx.HTTPStatusError):
        await charge(ChargeRequest(order_id="a-3", amount=700))

    record = await async_settler.get("charge:a-3")
    assert record is not None
    assert record.state is State.PROVISIONAL
    assert record.reservations == 3


async def test_same_key_with_changed_arguments_is_rejected_without_effect(
    async_settler: AsyncSettler, provider: Provider
) -> None:
    charge = async_charge(async_settler, provider.url)
    await charge(ChargeRequest(order_id="a-4", amount=100))

    with pytest.raises(FingerprintMismatch):
        await charge(ChargeRequest(order_id="a-4", amount=200))

    assert provider.requests_for("a-4") == 1
    assert provider.effects("a-4") == 1


async def test_terminal_error_is_stored_and_replayed_without_calling_the_function(
    async_settler: AsyncSettler, provider: Provider
) -> None:
    provider.script("a-5", "decline")
    charge = async_charge(async_settler, provider.url)
    request = ChargeRequest(order_id="a-5", amount=100)

    with pytest.raises(OperationFailed) as first:
        await charge(request)
    with pytest.raises(OperationFailed) as again:
        await charge(request)

    assert first.value.failure.error_type.endswith("CardDeclined")
    assert again.value.failure == first.value.failure
    assert provider.requests_for("a-5") == 1


@pytest.mark.parametrize("wait", [30.0, 0.0])
async def test_fifty_concurrent_tasks_get_one_effect(
    async_settler: AsyncSettler, provider: Provider, wait: float
) -> None:
    provider.script("a-6", "slow:0.5")
    charge = async_charge(async_settler, provider.url, wait=wait)
    request = ChargeRequest(order_id="a-6", amount=4200)

    outcomes = await asyncio.gather(*(charge(request) for _ in range(50)), return_exceptions=True)

    receipts = [o for o in outcomes if isinstance(o, Receipt)]
    busy = [o for o in outcomes if isinstance(o, OperationInProgress)]
    assert len(receipts) + len(busy) == 50, outcomes
    assert provider.effects("a-6") == 1
    assert provider.requests_for("a-6") == 1
    assert receipts
    assert all(r == receipts[0] for r in receipts)
    if wait:
        assert len(receipts) == 50
    else:
        assert busy


async def test_heartbeat_keeps_a_lease_shorter_than_the_work(
    async_settler: AsyncSettler, provider: Provider
) -> None:
    provider.script("a-7", "slow:2")
    request = ChargeRequest(order_id="a-7", amount=100)
    first = asyncio.create_task(async_charge(async_settler, provider.url, lease=1.0)(request))
    assert await asyncio.to_thread(provider.charged.wait, 30)
    await asyncio.sleep(1.3)  # past the lease: only the heartbeat keeps the operation owned
    with pytest.raises(OperationInProgress):
        await async_charge(async_settler, provider.url, lease=1.0, wait=0)(request)
    receipt = await first

    record = await async_settler.get("charge:a-7")
    assert record is not None
    assert record.reservations == 1
    assert record.value(Receipt) == receipt


async def test_a_renewal_held_by_a_hung_primary_holds_up_no_other_renewal() -> None:
    """The sync decorator's heartbeat thread once renewed attempts one after another (a
    renewal held by a frozen cluster primary let another attempt's lease lapse); each async
    attempt renews from its own task, and this holds it so."""
    with split_cluster() as split:
        first = AsyncSettler.from_cluster(split.seeds, namespace=split.namespace, shards=SHARDS)
        other = AsyncSettler.from_cluster(split.seeds, namespace=split.namespace, shards=SHARDS)
        await first.check()  # the start-up checks read every primary: before one is frozen
        await other.check()
        runs: list[str] = []
        both_running = asyncio.Event()

        @first.operation(key="{op}", principal=PRINCIPAL, name="charge", lease=1.5, wait=0)
        async def charge(op: str) -> str:
            runs.append(op)
            if len(runs) == 2:
                both_running.set()
            await asyncio.sleep(4.0)
            return op

        @other.operation(key="{op}", principal=PRINCIPAL, name="charge", lease=1.5, wait=0)
        async def charge_elsewhere(op: str) -> str:
            runs.append(op)
            return op

        try:
            on_frozen = asyncio.create_task(charge(split.frozen_op))
            on_healthy = asyncio.create_task(charge(split.healthy_op))
            await asyncio.wait_for(both_running.wait(), 10)
            split.freeze()
            try:
                await asyncio.sleep(2.5)  # past the lease (1.5 s): only renewals keep it owned
                with pytest.raises(OperationInProgress):
                    await charge_elsewhere(split.healthy_op)
            finally:
                split.thaw()
            assert await on_healthy == split.healthy_op
            await asyncio.wait({on_frozen})  # its lease lapsed while frozen: whatever it got
            on_frozen.exception()
            assert runs.count(split.healthy_op) == 1, runs
            record = await first.get(split.healthy_op)
            assert record is not None
            assert record.reservations == 1
        finally:
            await first.aclose()
            await other.aclose()


def _take_over(settler: Settler, started: threading.Event, done: threading.Event) -> None:
    """Another worker: once the first attempt has started, retry the same operation (it
    waits for the lease to pass, takes over and completes it)."""

    @settler.operation(key="job:{n}", principal=PRINCIPAL, name="job", wait=30)
    def job(n: int) -> str:
        return "second"

    started.wait(10)
    try:
        assert job(1) == "second"
    finally:
        done.set()


async def _stale_beside_a_takeover(
    job: Callable[[int], Awaitable[str]],
    settler: Settler,
    started: threading.Event,
    done: threading.Event,
) -> StaleAttempt:
    """Call ``job(1)`` while another worker takes it over (:func:`_take_over`): what it
    raises, which must be ``StaleAttempt``."""
    worker = threading.Thread(target=_take_over, args=(settler, started, done))
    worker.start()
    try:
        with pytest.raises(StaleAttempt) as info:
            await job(1)
    finally:
        worker.join()
    return info.value


async def test_lost_lease_cancels_the_function_and_nothing_is_committed(
    async_settler: AsyncSettler, settler: Settler
) -> None:
    started, done = threading.Event(), threading.Event()
    seen: list[bool] = []

    @async_settler.operation(key="job:{n}", principal=PRINCIPAL, name="job", lease=0.4)
    async def job(n: int, attempt: Attempt = Attempt.INJECTED) -> str:
        started.set()
        done.wait(10)  # blocks the event loop, so the heartbeat cannot renew
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen.append(attempt.lost)
            raise
        return "first"

    stale = await _stale_beside_a_takeover(job, settler, started, done)

    assert seen == [True]  # cancelled because the heartbeat found the lease lost
    record = stale.record
    assert record is not None
    assert record.state is State.COMPLETED
    assert record.value(str) == "second"
    assert stale.quarantine_id is None  # it settled nothing
    assert await async_settler.quarantine.list(operation_id="job:1") == []


async def test_late_completion_after_a_takeover_is_quarantined(
    async_settler: AsyncSettler, settler: Settler
) -> None:
    started, done = threading.Event(), threading.Event()

    @async_settler.operation(key="job:{n}", principal=PRINCIPAL, name="job", lease=0.4)
    async def job(n: int) -> str:
        started.set()
        done.wait(10)  # blocks the event loop, so the heartbeat cannot renew
        return "first"  # ... and the late result is presented at once

    stale = await _stale_beside_a_takeover(job, settler, started, done)

    record = stale.record
    assert record is not None
    assert record.value(str) == "second"
    entries = await async_settler.quarantine.list(operation_id="job:1")
    assert [(e.kind, e.payload.data) for e in entries] == [
        (QuarantineKind.STALE_GENERATION, b'"first"')
    ]
    assert stale.quarantine_id == entries[0].ref
    assert await job(1) == "second"  # the committed result, replayed


async def test_a_lease_that_only_lapsed_lets_the_function_finish_and_commit(
    async_settler: AsyncSettler,
) -> None:
    """Found in review: a function that held the loop past its lease (blocking work, a GC
    pause) was cancelled by its next heartbeat, which found the lease lapsed, though nobody
    had taken the key over: its effect was left uncertain and the caller's retry ran it
    again. Its ``complete`` is accepted at its own generation (SPEC 2), so it now runs on
    and its result is committed."""
    runs: list[bool] = []

    @async_settler.operation(key="job:{n}", principal=PRINCIPAL, name="job", lease=0.3)
    async def job(n: int, attempt: Attempt = Attempt.INJECTED) -> str:
        time.sleep(0.45)  # noqa: ASYNC251  # blocks the loop past the lease: no renewal
        await asyncio.sleep(0.3)  # the heartbeat runs meanwhile and finds the lease lapsed
        attempt.check()  # not lost: nobody took the key over
        runs.append(attempt.lost)
        return "charged"

    with capture_logs() as logs:
        assert await job(1) == "charged"
    assert await job(1) == "charged"  # replayed

    assert runs == [False]
    events = [e["event"] for e in logs]
    assert "settle.operation.lease_lapsed" in events
    assert "settle.operation.lease_lost" not in events
    record = await async_settler.get("job:1")
    assert record is not None
    assert (record.state, record.reservations) == (State.COMPLETED, 1)
    assert record.value(str) == "charged"
    assert await async_settler.quarantine.list(operation_id="job:1") == []


@pytest.mark.parametrize("failing_sink", [False, True], ids=["", "a-log-sink-that-raises"])
@pytest.mark.parametrize("then", ["works on", "returns"])
async def test_a_takeover_after_the_lease_lapsed_still_stops_the_attempt(
    async_settler: AsyncSettler, settler: Settler, then: str, failing_sink: bool
) -> None:
    """The heartbeat finds the lease lapsed and lets the function run on; then another
    worker takes the key over and completes it. A function that works on is cancelled at
    its next heartbeat (it settles nothing); one that returns first has its late
    completion quarantined. The caller gets ``StaleAttempt`` either way. A
    ``lease_lapsed`` line that cannot be written (a processor that raises) is dropped, as
    the sync heartbeat's: raised, it ended the heartbeat task, and a function working on
    was never stopped (it ran its 10 s beside the worker that had taken its key over)."""
    started, done = threading.Event(), threading.Event()
    seen: list[bool] = []
    generations: list[int] = []

    @async_settler.operation(key="job:{n}", principal=PRINCIPAL, name="job", lease=0.3)
    async def job(n: int, attempt: Attempt = Attempt.INJECTED) -> str:
        generations.append(attempt.generation)
        time.sleep(0.45)  # noqa: ASYNC251  # blocks the loop past the lease: no renewal
        await asyncio.sleep(0.3)  # the heartbeat finds the lease lapsed: it runs on
        seen.append(attempt.lost)
        started.set()
        if then == "returns":
            done.wait(10)  # blocks the loop while the other worker takes over
            return "first"  # ... and the late result is presented at once
        try:
            await asyncio.sleep(10)  # the other worker takes over meanwhile
        except asyncio.CancelledError:
            seen.append(attempt.lost)
            raise
        return "first"

    refused = ("settle.operation.lease_lapsed",) if failing_sink else ()
    with logs_behind_a_failing_sink(refused) as logs:
        stale = await _stale_beside_a_takeover(job, settler, started, done)

    events = [e["event"] for e in logs]
    assert "settle.operation.lease_lapsed" in events
    record = stale.record
    assert record is not None
    if then == "works on":
        # Stopped by the renewal that found the takeover: the record it read then is the
        # newer attempt's, still pending or already completed (the other worker races it).
        assert record.generation > generations[0]
        record = await async_settler.get("job:1")  # the other worker has finished now
        assert record is not None
    assert (record.state, record.value(str)) == (State.COMPLETED, "second")
    entries = await async_settler.quarantine.list(operation_id="job:1")
    if then == "works on":
        assert seen == [False, True]  # cancelled because the heartbeat found the takeover
        assert events.index("settle.operation.lease_lapsed") < events.index(
            "settle.operation.lease_lost"
        )
        assert stale.quarantine_id is None  # it settled nothing
        assert entries == []
    else:
        assert seen == [False]
        assert [(e.kind, e.payload.data) for e in entries] == [
            (QuarantineKind.STALE_GENERATION, b'"first"')
        ]
        assert stale.quarantine_id == entries[0].ref
    assert await job(1) == "second"  # the committed result, replayed


async def test_cancelled_caller_marks_the_attempt_provisional(
    async_settler: AsyncSettler, provider: Provider
) -> None:
    provider.script("a-8", "slow:5")
    charge = async_charge(async_settler, provider.url)
    request = ChargeRequest(order_id="a-8", amount=100)
    task = asyncio.create_task(charge(request))
    assert await asyncio.to_thread(provider.charged.wait, 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    record = await async_settler.get("charge:a-8")
    assert record is not None
    assert (record.state, record.reason) == (State.PROVISIONAL, "cancelled")
    receipt = await charge(request)  # the retry reuses the downstream idempotency key
    assert provider.effects("a-8") == 1
    assert receipt.amount == 100


async def test_signature_is_kept_and_sync_functions_are_refused(
    async_settler: AsyncSettler,
) -> None:
    @async_settler.operation(key="ping:{n}", principal=PRINCIPAL)
    async def ping(n: int) -> int:
        """Ping."""
        return n

    assert ping.__doc__ == "Ping."
    assert ping.__name__ == "ping"
    assert inspect.iscoroutinefunction(ping)  # the async shell's decorator stays async
    assert await ping(2) == 2

    def not_async() -> None:
        pass

    with pytest.raises(InvalidInput):
        async_settler.operation(key="k", principal=PRINCIPAL)(not_async)


async def test_timeout_cancels_the_attempt_and_marks_it_provisional(
    async_settler: AsyncSettler,
) -> None:
    cancelled: list[int] = []

    @async_settler.operation(
        key="slow:{n}",
        principal=PRINCIPAL,
        timeout=0.05,
        retry=tenacity.Retrying(stop=tenacity.stop_after_attempt(1)),
    )
    async def slow(n: int) -> int:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(n)
            raise
        return n

    with pytest.raises(TimeoutError):
        await slow(1)

    assert cancelled == [1]
    record = await async_settler.get("slow:1")
    assert record is not None
    assert (record.state, record.reason) == (State.PROVISIONAL, "timeout")


async def test_a_caller_cancelled_just_after_the_function_returned_still_settles(
    async_settler: AsyncSettler,
) -> None:
    """Found in review: a cancellation landing while the heartbeat was being stopped, after
    the function had returned, skipped the settlement, so the next call ran it again."""
    effects = 0
    task: asyncio.Task[str] | None = None

    @async_settler.operation(key="cancel-after:{n}", principal=PRINCIPAL, lease=2.0)
    async def charge(n: int) -> str:
        nonlocal effects
        effects += 1
        if effects == 1:  # the caller is cancelled as the function returns
            assert task is not None
            asyncio.get_running_loop().call_soon(task.cancel)
        return f"charged {n}"

    task = asyncio.ensure_future(charge(1))
    with pytest.raises(asyncio.CancelledError):
        await task
    record = await async_settler.get("cancel-after:1")
    assert record is not None
    assert record.state is State.COMPLETED  # settled before the cancellation went on
    assert await charge(1) == "charged 1"  # replayed
    assert effects == 1


async def test_an_idle_heartbeat_sends_nothing_after_the_call(
    async_settler: AsyncSettler,
) -> None:
    """A call that ends between renewals stops its heartbeat at once: no renewal is sent
    after it settled (the completed record's would be refused, ``not_pending``: a
    ``settle.renew.lost`` warning for a call that succeeded). Only a renewal already on its
    way as the function returns is let finish (``test_faults_renewal_wait``): it reached
    the primary before the settlement and is granted."""

    @async_settler.operation(key="idle-beat", principal=PRINCIPAL, lease=1.5)
    async def charge() -> str:
        await asyncio.sleep(1.25)  # renewed at 0.5 and 1 s: the heartbeat is idle as it ends
        return "ch_1"

    with capture_logs() as logs:
        assert await charge() == "ch_1"
        await asyncio.sleep(1.0)  # two heartbeats: a heartbeat left running renews again
    renewals = [
        (e["event"], e.get("reason")) for e in logs if e["event"].startswith("settle.renew.")
    ]
    assert ("settle.renew.renewed", None) in renewals, renewals
    assert ("settle.renew.lost", "not_pending") not in renewals, renewals
