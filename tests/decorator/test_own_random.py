"""settle's jitter leaves the process's shared ``random`` state alone.

Its retries and polls ran on ``random``'s shared generator (tenacity's random waits draw
from it), in the caller's thread and in heartbeat threads: an application's seeded
sequence moved whenever settle retried, and hypothesis, which watches that state while it
draws, failed an unrelated property test as unreliable (seen in this suite: a heartbeat
thread of an earlier test retried while ``tests/unit/test_layout.py`` drew its example)."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import subprocess
import sys
import threading
from typing import Any

import pytest
import redis
import tenacity

from settle import AsyncSettler, OperationInProgress, Reserved, Settler
from settle._jitter import OwnRandomExponentialWait, draw
from settle._runtime.transient import retry_options
from tests.faults.servers import proxy_to
from tests.integration.conftest import Awaitable

PRINCIPAL = "tenant:acme"


class Flaky(Exception):
    """An uncertain failure: the decorator's default policy retries it."""


def _alone(scenario: str, *args: str) -> None:
    """Run ``scenario`` (a function of this module) in an interpreter of its own and hold
    that it left the shared state as it was. In this process another test may have set an
    OpenTelemetry SDK provider, whose span ids are drawn from the shared state (the SDK's
    choice, on every span, not settle's), or left a thread that draws."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; from tests.decorator.test_own_random import {scenario}; "
            f"{scenario}(*sys.argv[1:])",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, (out.stdout, out.stderr[-3000:])
    assert out.stdout.splitlines()[-1:] == ["unchanged"], (out.stdout, out.stderr[-3000:])


def _said(before: object) -> None:
    print("unchanged" if random.getstate() == before else "moved")


def retried_sync(url: str, namespace: str) -> None:
    settler = Settler.from_url(url, namespace=namespace, shards=4)
    tries: list[int] = []

    @settler.operation(key="charge:{n}", principal=PRINCIPAL)
    def charge(n: int) -> int:
        tries.append(n)
        if len(tries) < 3:
            raise Flaky("timed out")
        return n

    random.seed(1234)
    before = random.getstate()
    assert charge(7) == 7
    assert len(tries) == 3  # two waits with jitter between the three tries
    _said(before)
    settler.close()


def retried_async(url: str, namespace: str) -> None:
    async def main() -> None:
        settler = AsyncSettler.from_url(url, namespace=namespace, shards=4)
        tries: list[int] = []

        @settler.operation(key="charge:{n}", principal=PRINCIPAL)
        async def charge(n: int) -> int:
            tries.append(n)
            if len(tries) < 3:
                raise Flaky("timed out")
            return n

        random.seed(1234)
        before = random.getstate()
        assert await charge(7) == 7
        assert len(tries) == 3
        _said(before)
        await settler.aclose()

    asyncio.run(main())


def waiting(url: str, namespace: str) -> None:
    """The polls of a call that waits for another attempt back off with jitter."""
    settler = Settler.from_url(url, namespace=namespace, shards=4)
    running, release = threading.Event(), threading.Event()

    @settler.operation(key="charge:{n}", principal=PRINCIPAL, wait=0.5)
    def charge(n: int) -> int:
        running.set()
        release.wait(30)
        return n

    first = threading.Thread(target=charge, args=(7,))
    first.start()
    try:
        assert running.wait(30)
        random.seed(1234)
        before = random.getstate()
        try:
            charge(7)  # polls for 0.5 s, then gives up
        except OperationInProgress:
            _said(before)
    finally:
        release.set()
        first.join(30)
        settler.close()


def dropped(url: str, namespace: str, flavour: str) -> None:
    """Found in review: the clients settle makes (``from_url``, ``from_cluster``,
    ``from_sentinel``) kept redis-py's default retry, whose backoff draws its jitter from
    the shared generator when redis-py repeats a command after a dropped connection (in
    the caller's thread, in heartbeat threads)."""

    async def main() -> None:
        proxy = proxy_to(url)
        try:
            if flavour == "sync":
                sync = Settler.from_url(proxy.url, namespace=namespace, shards=4)
                api: Any = Awaitable(sync)
                close: Any = sync.close
            else:
                api = AsyncSettler.from_url(proxy.url, namespace=namespace, shards=4)
                close = api.aclose
            try:
                warm = await api.reserve("warm", {"n": 1}, principal=PRINCIPAL)
                assert isinstance(warm, Reserved)
                proxy.cut(b"dropped-op", "before_request")
                random.seed(1234)
                before = random.getstate()
                got = await api.reserve("dropped-op", {"n": 1}, principal=PRINCIPAL)
                assert isinstance(got, Reserved)
                assert proxy.fired  # the connection did drop
                _said(before)
            finally:
                result = close()
                if result is not None:
                    await result
        finally:
            proxy.close()

    asyncio.run(main())


def test_a_retried_call_leaves_the_shared_random_state_alone(
    redis_url: str, namespace: str
) -> None:
    _alone("retried_sync", redis_url, namespace)


def test_a_retried_async_call_leaves_the_shared_random_state_alone(
    redis_url: str, namespace: str
) -> None:
    _alone("retried_async", redis_url, namespace)


def test_waiting_on_a_running_operation_leaves_the_shared_random_state_alone(
    redis_url: str, namespace: str
) -> None:
    _alone("waiting", redis_url, namespace)


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_dropped_connection_of_a_client_settle_made_leaves_the_shared_state_alone(
    redis_url: str, namespace: str, flavour: str
) -> None:
    _alone("dropped", redis_url, namespace, flavour)


def test_the_runtimes_retries_leave_the_shared_random_state_alone() -> None:
    """The jittered waits between a script call's repeats after a dropped connection."""
    failures = iter([redis.ConnectionError("dropped"), redis.ConnectionError("dropped")])

    def call() -> str:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return "ok"

    random.seed(1234)
    before = random.getstate()
    assert tenacity.Retrying(**retry_options(None))(call) == "ok"
    assert random.getstate() == before


def _child_draws(out: multiprocessing.Queue[list[float]]) -> None:
    out.put([draw() for _ in range(4)])


def test_forked_processes_draw_their_own_jitter() -> None:
    """A forked worker starts from its parent's generator: without a new seed parent and
    children would back off in step, each retry storm hitting Redis at once."""
    context = multiprocessing.get_context("fork")
    out: multiprocessing.Queue[list[float]] = context.Queue()
    children = [context.Process(target=_child_draws, args=(out,)) for _ in range(2)]
    for child in children:
        child.start()
    drawn = [out.get(timeout=30) for _ in children]
    for child in children:
        child.join(timeout=30)
    mine = [draw() for _ in range(4)]
    assert drawn[0] != drawn[1]
    assert mine not in drawn


def test_settles_exponential_jitter_keeps_tenacitys_floor() -> None:
    """Found in review: settle's copy of ``wait_random_exponential`` drew from 0 where
    tenacity draws from its ``min``: a floor given to it was ignored."""
    wait = OwnRandomExponentialWait(multiplier=1, min=5, max=10)
    state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
    state.attempt_number = 1
    waits = [wait(state) for _ in range(200)]
    assert min(waits) >= 5
    assert max(waits) <= 10
