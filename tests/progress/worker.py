"""A worker process for the crash-cut tests: settle.progress's StreamConsumer with a real
effect (tests/progress/ledger.lua on the progress server). It kills (SIGKILL) or stops
(SIGSTOP) itself at an exact step of an exact delivery when asked, so each cut is exact."""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

import redis

from settle.progress import DeliveryId, EffectContext, ProgressStore, StreamConsumer

LEDGER = (Path(__file__).parent / "ledger.lua").read_text()


def main() -> None:
    p = argparse.ArgumentParser()
    for flag in ("stream-url", "progress-url", "stream", "group", "consumer", "namespace"):
        p.add_argument(f"--{flag}", required=True)
    p.add_argument("--worker", required=True)
    p.add_argument("--kill-at")
    p.add_argument("--kill-delivery")
    p.add_argument("--stop-at")
    p.add_argument("--stop-delivery")
    p.add_argument("--claim-idle", type=float, default=0.3)
    p.add_argument("--max-deliveries", type=int, default=5)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--poison", action="append", default=[])
    a = p.parse_args()

    def observer(step: str, delivery: DeliveryId) -> None:
        if step == a.kill_at and delivery.value == a.kill_delivery:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == a.stop_at and delivery.value == a.stop_delivery:
            os.kill(os.getpid(), signal.SIGSTOP)

    ledger_client = redis.Redis.from_url(a.progress_url)
    ledger = ledger_client.register_script(LEDGER)
    base = f"ledger:{{{a.consumer}}}"
    ledger_keys = [f"{base}:effects", f"{base}:done", f"{base}:invocations"]

    def effect(ctx: EffectContext) -> None:
        if ctx.emission.value in a.poison:
            ledger_client.hincrby(ledger_keys[2], ctx.emission.value, 1)
            raise RuntimeError("poison")
        ledger(keys=ledger_keys, args=[ctx.emission.value, ctx.idempotency_key])

    store = ProgressStore.from_url(
        a.progress_url, consumer=a.consumer, namespace=a.namespace, observer=observer
    )
    consumer = StreamConsumer(
        redis.Redis.from_url(a.stream_url),
        store,
        stream=a.stream,
        group=a.group,
        worker=a.worker,
        claim_idle=a.claim_idle,
        max_deliveries=a.max_deliveries,
        batch=a.batch,
        block=0.05,
        retry_pause=0.05,
    )
    consumer.run(effect)  # forever; the test kills this process


if __name__ == "__main__":
    main()
