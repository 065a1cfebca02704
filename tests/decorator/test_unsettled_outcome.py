"""When the settlement of an attempt cannot be sent (Redis killed while the function ran),
the error the caller gets still says what the function did: a card declined (a
``terminal`` exception), an error, or a result, none of them stored.

Before, the caller got the ``BackendError`` of the settlement alone: the function's own
exception was in none of its ``__cause__`` / ``__context__`` links nor its text, so a
decline (a definite answer) could not be told from a charge that went through.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from settle import AsyncSettler, Settler
from settle.embedded import EmbeddedRedis
from settle.errors import BackendError, ResultTooLarge


class CardDeclined(Exception):
    pass


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    redis_server = EmbeddedRedis().start()
    try:
        yield redis_server
    finally:
        redis_server.close()


def _notes(error: BaseException) -> str:
    return " ".join(getattr(error, "__notes__", []))


def test_a_decline_whose_failure_cannot_be_stored_is_in_the_error(server: EmbeddedRedis) -> None:
    settler = Settler.from_url(server.url, namespace="unsettled", shards=1)

    @settler.operation(key="charge:{order}", principal="tenant:a", terminal=(CardDeclined,))
    def charge(order: str) -> str:
        server.close()  # Redis dies while the provider answers
        raise CardDeclined("insufficient funds")

    with pytest.raises(BackendError) as info:
        charge("A-1")
    assert isinstance(info.value.__context__, CardDeclined)
    assert "CardDeclined" in _notes(info.value)
    assert "may not be stored" in _notes(info.value)
    settler.close()


def test_a_result_that_cannot_be_stored_is_said_in_the_error(server: EmbeddedRedis) -> None:
    settler = Settler.from_url(server.url, namespace="unsettled", shards=1)

    @settler.operation(key="charge:{order}", principal="tenant:a")
    def charge(order: str) -> str:
        server.close()
        return "ch_1"

    with pytest.raises(BackendError) as info:
        charge("A-2")
    assert "returned a result" in _notes(info.value)
    settler.close()


@pytest.mark.asyncio
async def test_an_async_error_whose_settlement_fails_is_in_the_error(
    server: EmbeddedRedis,
) -> None:
    settler = AsyncSettler.from_url(server.url, namespace="unsettled", shards=1)

    @settler.operation(key="charge:{order}", principal="tenant:a")
    async def charge(order: str) -> str:
        server.close()
        raise ValueError("provider answered 500")

    with pytest.raises(BackendError) as info:
        await charge("A-3")
    assert isinstance(info.value.__context__, ValueError)
    assert "ValueError" in _notes(info.value)
    await settler.aclose()


def test_an_unstorable_result_whose_release_fails_says_so(server: EmbeddedRedis) -> None:
    settler = Settler.from_url(server.url, namespace="unsettled", shards=1)

    @settler.operation(key="charge:{order}", principal="tenant:a")
    def charge(order: str) -> str:
        server.close()
        return "x" * (2 << 20)  # more than max_result_bytes (1 MiB): it cannot be stored

    with pytest.raises(BackendError) as info:
        charge("A-4")
    assert "returned a result that cannot be stored (ResultTooLarge)" in _notes(info.value)
    assert isinstance(info.value.__context__, ResultTooLarge)  # its size and the limit
    settler.close()


def test_an_interrupt_whose_release_fails_is_still_raised(server: EmbeddedRedis) -> None:
    """A Ctrl-C stays a Ctrl-C: a ``BackendError`` in its place is caught by the
    application's ``except SettleError`` and the program runs on."""
    settler = Settler.from_url(server.url, namespace="unsettled", shards=1)

    @settler.operation(key="charge:{order}", principal="tenant:a")
    def charge(order: str) -> str:
        server.close()
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as info:
        charge("A-5")
    assert isinstance(info.value.__context__, BackendError)
    assert "may not be stored" in _notes(info.value)
    settler.close()


@pytest.mark.asyncio
async def test_a_caller_timeout_whose_release_fails_is_still_a_timeout(
    server: EmbeddedRedis,
) -> None:
    """The caller's ``asyncio.timeout`` cancels the call; it turns into ``TimeoutError``
    only if the cancellation comes out of the call (a cancelled task must end cancelled)."""
    settler = AsyncSettler.from_url(server.url, namespace="unsettled", shards=1)

    @settler.operation(key="charge:{order}", principal="tenant:a")
    async def charge(order: str) -> str:
        server.close()
        await asyncio.Event().wait()  # the provider never answers
        return "ch_1"

    with pytest.raises(TimeoutError) as info:
        async with asyncio.timeout(0.3):
            await charge("A-6")
    assert isinstance(info.value.__context__, asyncio.CancelledError)
    assert isinstance(info.value.__context__.__context__, BackendError)
    await settler.aclose()
