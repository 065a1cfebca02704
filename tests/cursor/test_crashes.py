"""A real worker process SIGKILLed around witness creation, each event outcome and the
promotion, then restarted: every event's effect happens exactly once, the handler runs a
second time only for the event whose effect was cut off before its receipt, and the
checkpoint ends at the end of the log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from settle.cursor import CursorStore
from settle.cursor.models import Disposition
from tests.cursor.helpers import truth

ROOT = Path(__file__).resolve().parents[2]

CUTS = [
    ("settle.cursor.classified:1", None),  # before the first witness is written
    ("settle.cursor.witness_recorded:1", None),  # witness durable, no outcome yet
    ("effect:1", "e1"),  # effect of the first event done, receipt not written
    ("settle.cursor.event_recorded:1", None),  # first receipt durable
    ("effect:2", "e2"),
    ("settle.cursor.event_recorded:3", None),  # last receipt of page 1: before promotion
    ("settle.cursor.promoted:1", None),  # promoted, before the worker learns it
    ("settle.cursor.witness_recorded:2", None),  # second page witnessed
    ("effect:5", "e5"),
    ("settle.cursor.promoted:2", None),
]


def run_worker(redis_url: str, namespace: str, url: str, cut: str = "") -> int:
    args = [sys.executable, "-m", "tests.cursor.crash_worker", redis_url, namespace, "s", url]
    proc = subprocess.run(
        [*args, cut] if cut else args,
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(proc.stderr.decode()[-2000:])
    return proc.returncode


@pytest.mark.faults
@pytest.mark.parametrize(("cut", "rerun"), CUTS, ids=[c for c, _ in CUTS])
def test_sigkill_at_each_cut_then_restart(
    cut: str, rerun: str | None, serve, redis_url: str, namespace: str, store: CursorStore
) -> None:
    server = serve(page_size=3, rotate=True, revoke=True)
    p = server.provider
    p.append(8)
    store.start("s", p.token(0).encode())

    assert run_worker(redis_url, namespace, server.url, cut) == -signal.SIGKILL
    assert run_worker(redis_url, namespace, server.url) == 0

    r = redis.Redis.from_url(redis_url)
    effects = sorted(
        r.get(k).decode() for k in r.scan_iter(match=f"{namespace}:effect:*", count=1000)
    )
    calls = {k.decode(): int(v) for k, v in r.hgetall(f"{namespace}:calls").items()}
    r.close()
    expected = truth(p)
    assert effects == sorted(expected)  # none lost, none applied twice
    assert calls == {e: 2 if e == rerun else 1 for e in expected}
    ck = store.checkpoint("s")
    assert ck is not None
    assert ck.boundary == 8
    for w in store.witnesses("s", limit=100):
        if w.successor == ck.cursor:
            assert w.disposition is Disposition.PROMOTED
    assert p.gone == 0  # a revoked successor was never checkpointed


@pytest.mark.faults
@pytest.mark.parametrize("cut", ["effect:1", "settle.cursor.event_recorded:1"])
def test_a_worker_killed_mid_page_then_a_truncated_retry_stands_down_without_skipping(
    cut: str, serve, redis_url: str, namespace: str, store: CursorStore
) -> None:
    server = serve(page_size=3)
    p = server.provider
    p.append(3)
    g0 = store.start("s", p.token(0).encode()).generation
    assert run_worker(redis_url, namespace, server.url, cut) == -signal.SIGKILL
    p.append(2)
    p.faults.append("short")  # the restarted worker's retry: e1, e2 and a successor at e5

    assert run_worker(redis_url, namespace, server.url) == 0  # the retry stood down: LOST

    ck = store.checkpoint("s")
    assert ck is not None
    assert (ck.generation, ck.boundary) == (g0, 0)  # e3 was witnessed: nothing skipped it
    assert run_worker(redis_url, namespace, server.url) == 0  # the full answer again
    r = redis.Redis.from_url(redis_url)
    effects = sorted(
        r.get(k).decode() for k in r.scan_iter(match=f"{namespace}:effect:*", count=1000)
    )
    r.close()
    assert effects == sorted(truth(p))
    assert store.checkpoint("s").boundary == 5
