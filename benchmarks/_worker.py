"""A worker process for the fault scenarios that need a worker to stall (SIGSTOP) while it
holds an operation: ``python -m benchmarks._worker LIB URL SCOPE ORDER_ID LEASE EFFECTS``.

Its charge function records one effect downstream (RPUSH to EFFECTS), prints ``charged``,
then waits for a line on stdin: ``ok`` returns the charge, ``fail`` raises the error a
provider connection gives after the charge. The last stdout line is what the caller saw,
as JSON: ``{"saw": "..."}``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import redis

from benchmarks._contenders import Peer, Settle, order
from benchmarks._outcomes import outcome
from benchmarks._server import quiet_logs


def main(argv: list[str]) -> int:
    lib, url, scope, order_id, lease, effects = argv
    quiet_logs()
    contender = Settle(url, scope) if lib == "settle" else Peer(url, scope)
    downstream = redis.Redis.from_url(url)

    def body(order: dict[str, Any]) -> dict[str, Any]:
        charge_id = f"ch_{downstream.rpush(effects, 'A')}"
        print("charged", flush=True)
        if sys.stdin.readline().strip() == "fail":
            raise ConnectionResetError("the provider's connection dropped after the charge")
        return {"charge_id": charge_id, "by": "A", "order_id": order["order_id"]}

    charge = contender.function(body, lease=float(lease))
    print(json.dumps({"saw": outcome(lambda: charge(order=order(order_id)))}), flush=True)
    contender.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
