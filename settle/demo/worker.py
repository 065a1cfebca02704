"""A demo worker process: charges its orders through the decorator and, once the provider
has charged, stops before settling and waits for the demo to crash it (SIGKILL) or freeze
it (SIGSTOP ... SIGCONT, then ``go`` on stdin).

    SETTLE_DEMO_REDIS_URL=URL python -m settle.demo.worker --namespace NS --shards N \\
        --provider URL --lease SECONDS < orders (one JSON line), then "go"

The Redis URL comes in the environment (it may hold a password, and a command line is
readable by every user of the machine).

Speaks JSON lines on stdout: ``charged`` per order once the provider charged, then one
``stale`` / ``result`` / ``error`` per order. It exits when stdin closes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from typing import Any

import structlog

from settle._sync.settler import Settler
from settle.attempt import Attempt
from settle.demo.charge import ChargeRequest, make_charge
from settle.demo.processes import REDIS_URL_ENV
from settle.errors import StaleAttempt

__all__ = ["REDIS_URL_ENV", "main"]


_print_lock = threading.Lock()


def emit(**fields: Any) -> None:
    with _print_lock:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m settle.demo.worker")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--shards", type=int, required=True)
    parser.add_argument("--provider", required=True)
    parser.add_argument("--lease", type=float, required=True)
    args = parser.parse_args(argv)
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    orders = json.loads(sys.stdin.readline())
    go = threading.Event()

    def read_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "go":
                go.set()
        os._exit(0)  # the demo closed our stdin (or died): stop at once

    def charged(request: ChargeRequest, attempt: Attempt) -> None:
        emit(event="charged", order_id=request.order_id, generation=attempt.generation)
        go.wait()

    settler = Settler.from_url(
        os.environ[REDIS_URL_ENV], namespace=args.namespace, shards=args.shards
    )
    charge = make_charge(settler, args.provider, lease=args.lease, wait=0.0, after=charged)

    def run(order: dict[str, Any]) -> None:
        request = ChargeRequest.model_validate(order["request"])
        try:
            receipt = charge(request, order["merchant"])
        except StaleAttempt as exc:
            emit(
                event="stale",
                order_id=request.order_id,
                quarantine_id=exc.quarantine_id,
                state=exc.record.state.value if exc.record else None,
            )
        except Exception as exc:  # noqa: BLE001 - reported to the demo, which counts it
            emit(event="error", order_id=request.order_id, error=f"{type(exc).__name__}: {exc}")
        else:
            emit(event="result", order_id=request.order_id, charge_id=receipt.charge_id)

    threading.Thread(target=read_stdin, name="stdin", daemon=True).start()
    threads = [threading.Thread(target=run, args=(o,), daemon=True) for o in orders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    settler.close()
    emit(event="done")


if __name__ == "__main__":
    main()
