"""A decorated function whose record Redis lost while it ran (SPEC §6, §11; docs/operations.md,
"When Redis forgets"): the server restarts without persistence between the reserve and the
complete. The function ran, its complete is quarantined as ``unknown_operation`` and the
caller gets ``StaleAttempt`` with no record. Calling again runs the function again (nothing
in Redis remembers it), so the error must say so, never send the caller back "to get the
committed outcome": there is none, and following that advice pays twice."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from settle import AsyncSettler, Attempt, Settler, StaleAttempt
from settle.embedded import EmbeddedRedis

pytestmark = [pytest.mark.faults]


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as s:  # persistence off: a restart comes back empty
        yield s


def _restart_empty(server: EmbeddedRedis) -> None:
    server.stop(kill=True)
    server.start()


def _says_the_record_is_lost(error: StaleAttempt) -> None:
    assert error.record is None
    text = str(error)
    assert "get the committed outcome" not in text  # there is no committed outcome
    assert "runs it again" in text  # what calling again does


def test_a_record_lost_while_the_function_ran_says_a_new_call_runs_it_again(
    server: EmbeddedRedis,
) -> None:
    settler = Settler.from_url(server.url, namespace="lost", shards=2)
    runs: list[str] = []

    @settler.operation(key=lambda order: order, principal=lambda order: "tenant:acme", lease=5.0)
    def charge(order: str) -> dict[str, str]:
        runs.append(order)
        _restart_empty(server)  # the charge happened; Redis forgets the reservation
        return {"charged": order}

    try:
        with pytest.raises(StaleAttempt) as caught:
            charge("order-1")
        _says_the_record_is_lost(caught.value)
        assert runs == ["order-1"]
    finally:
        settler.close()


def test_a_record_lost_while_the_function_ran_says_a_new_call_runs_it_again_async(
    server: EmbeddedRedis,
) -> None:
    async def main() -> None:
        settler = AsyncSettler.from_url(server.url, namespace="lost", shards=2)
        runs: list[str] = []

        @settler.operation(
            key=lambda order: order, principal=lambda order: "tenant:acme", lease=5.0
        )
        async def charge(order: str) -> dict[str, str]:
            runs.append(order)
            await asyncio.to_thread(_restart_empty, server)
            return {"charged": order}

        try:
            with pytest.raises(StaleAttempt) as caught:
                await charge("order-1")
            _says_the_record_is_lost(caught.value)
            assert runs == ["order-1"]
        finally:
            await settler.aclose()

    asyncio.run(main())


def test_attempt_check_after_the_record_was_lost_names_no_owner(server: EmbeddedRedis) -> None:
    """The heartbeat finds the record gone (``unknown_operation``) while the function runs:
    ``attempt.check()`` stops it, and its message must not send it to wait for "the current
    owner": there is none, and a new call runs the function again."""
    settler = Settler.from_url(server.url, namespace="lost", shards=2)
    seen: list[StaleAttempt] = []

    @settler.operation(key=lambda order: order, principal=lambda order: "tenant:acme", lease=0.6)
    def charge(order: str, attempt: Attempt = Attempt.INJECTED) -> dict[str, str]:
        _restart_empty(server)
        deadline = time.monotonic() + 10
        while not attempt.lost:
            assert time.monotonic() < deadline, "the heartbeat never found the record gone"
            time.sleep(0.02)
        try:
            attempt.check()
        except StaleAttempt as exc:
            seen.append(exc)
            raise
        return {"charged": order}

    try:
        with pytest.raises(StaleAttempt):
            charge("order-2")
        (error,) = seen
        assert error.record is None
        assert "current owner" not in str(error)
        assert "runs it again" in str(error)
    finally:
        settler.close()
