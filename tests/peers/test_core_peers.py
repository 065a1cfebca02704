"""aws-lambda-powertools' ``test_redis_orphan_record_race_condition`` against settle's
scripts on a real Redis: workers racing to take over an attempt whose lease passed (its
worker crashed) get exactly one new reservation."""

from __future__ import annotations

import threading
import time
from collections import Counter

from settle import InProgress, Reserved, Settler

WHO = "tenant:acme"
REQ = {"amount": 500}


def test_32_threads_taking_over_a_lapsed_attempt_get_exactly_one_reservation(
    redis_url: str, namespace: str
) -> None:
    settler = Settler.from_url(redis_url, namespace=namespace, shards=4)
    try:
        crashed = settler.reserve("orphan", REQ, principal=WHO, lease=0.2)
        assert isinstance(crashed, Reserved)
        time.sleep(0.3)  # its worker died: nothing renews the lease
        barrier = threading.Barrier(32)
        results: list[object] = []
        lock = threading.Lock()

        def worker() -> None:
            barrier.wait()
            outcome = settler.reserve("orphan", REQ, principal=WHO, lease=30)
            with lock:
                results.append(outcome)

        threads = [threading.Thread(target=worker) for _ in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert Counter(type(r).__name__ for r in results) == {"Reserved": 1, "InProgress": 31}
        winner = next(r for r in results if isinstance(r, Reserved))
        assert winner.reservation.generation > crashed.reservation.generation
        assert {r.generation for r in results if isinstance(r, InProgress)} == {
            winner.reservation.generation
        }
        record = settler.get("orphan")
        assert record is not None
        assert record.reservations == 2
    finally:
        settler.close()
