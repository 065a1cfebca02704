"""``python -m benchmarks.memory``: what Redis holds per settled operation.

Starts its own redis-server (``SETTLE_REDIS_SERVER`` picks the binary, as for the tests),
settles ``--ops`` operations (``reserve`` then ``complete`` with a 40-byte result, the ids
``order-000000``, ``order-000001``, ... in the namespace ``orders``), then asks the server
``MEMORY USAGE <key> SAMPLES 0`` for every key of the namespace and prints, per key kind
(the record, the attempt log when the layout has one beside it, the shard and namespace
keys), how many keys there are and their mean size, and the bytes per settled operation:
the operation's own keys (what grows with traffic; the per-shard keys are a constant).

The figure before the packed record layout (a 15-field HASH plus an attempt-log LIST per
operation) was 794 B on Redis 6.2 with the same loop; the target of issue 19 is 320 B.
``docs/operations.md`` turns the figure into a sizing rule.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from typing import Any

import redis

from benchmarks._server import machine, quiet_logs, redis_server
from settle import Settler

__all__ = ["BASELINE_BYTES", "RESULT", "TARGET_BYTES", "main", "measure", "parse"]

#: Bytes per settled operation with the previous layout (HASH record + LIST attempt log).
BASELINE_BYTES = 794
#: What issue 19 asks for.
TARGET_BYTES = 320
#: A 40-byte result, stored as it is.
RESULT = b'{"charge_id":"ch_3PqXb2","status":"ok"}\n'
REQUEST = {"order_id": "order-0", "customer_id": "cus_42", "amount": 1250, "currency": "EUR"}
PRINCIPAL = "tenant:acme"
NAMESPACE = "orders"
#: Key kinds: the last segment before the operation id, or the shard key's suffix.
PER_OPERATION = ("op", "log")


def _kind(key: bytes) -> str:
    text = key.decode("utf-8", "replace")
    tail = text.split("}", 1)[1] if "}" in text else text
    parts = tail.lstrip(":").split(":")
    return parts[0] if parts[0] in PER_OPERATION else ":".join(parts)


def measure(url: str, ops: int) -> dict[str, Any]:
    """Settle ``ops`` operations on ``url`` and read back what each kind of key holds."""
    assert len(RESULT) == 40
    settler = Settler.from_url(url, namespace=NAMESPACE)
    client = redis.Redis.from_url(url)
    try:
        for i in range(ops):
            got = settler.reserve(f"order-{i:06d}", REQUEST, principal=PRINCIPAL)
            settler.complete(got.reservation, RESULT)  # type: ignore[union-attr]
        sizes: dict[str, list[int]] = defaultdict(list)
        for key in client.scan_iter(match=f"settle:{{{NAMESPACE}*", count=1000):
            size = client.memory_usage(key, samples=0)
            if size is not None:
                sizes[_kind(key)].append(int(size))
        version = str(client.info("server")["redis_version"])
    finally:
        settler.close()
        client.close()
    kinds: list[dict[str, Any]] = [
        {
            "kind": kind,
            "keys": len(values),
            "bytes_per_key": round(sum(values) / len(values), 1),
            "per_operation": kind in PER_OPERATION,
        }
        for kind, values in sorted(sizes.items())
    ]
    per_op = sum(k["bytes_per_key"] * k["keys"] for k in kinds if k["per_operation"]) / ops
    return {
        "redis_server": version,
        "ops": ops,
        "result_bytes": len(RESULT),
        "kinds": kinds,
        "bytes_per_operation": round(per_op, 1),
        "baseline_bytes": BASELINE_BYTES,
        "target_bytes": TARGET_BYTES,
        "meets_target": per_op <= TARGET_BYTES,
    }


def _print(result: dict[str, Any]) -> None:
    print(
        f"MEMORY USAGE on Redis {result['redis_server']}, {result['ops']} settled operations, "
        f"a {result['result_bytes']}-byte result each"
    )
    print(f"{'key kind':<24} {'keys':>7} {'bytes/key':>10}  per operation")
    for k in result["kinds"]:
        mark = "yes" if k["per_operation"] else "no (per shard / namespace)"
        print(f"{k['kind']:<24} {k['keys']:>7} {k['bytes_per_key']:>10}  {mark}")
    print(
        f"bytes per settled operation: {result['bytes_per_operation']} "
        f"(before the packed layout: {result['baseline_bytes']}; "
        f"target: at most {result['target_bytes']}: "
        f"{'met' if result['meets_target'] else 'NOT met'})"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__)
    parser.add_argument("--ops", type=int, default=2000, help="operations to settle")
    parser.add_argument("--json", help="also write the figures to this file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    quiet_logs()
    with redis_server() as server:
        result = measure(server.url, args.ops)
        result["machine"] = machine(server)
    _print(result)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(result, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
