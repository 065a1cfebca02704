"""A simulated payment provider on a loopback HTTP port, for ``settle demo``.

It behaves like a payment API that honours ``Idempotency-Key``: the first request with a
key charges (an *effect*), a later request with the same key gets the same charge back and
charges nothing. Each order can be given behaviours, used one per request:

- ``ok``: charge (or deduplicate) and answer 200 with the charge;
- ``slow``: charge (or deduplicate), then answer only after ``slow_seconds``: the client
  times out after the provider's success, the classic way to charge twice;
- ``unavailable``: answer 503 without charging;
- ``decline``: answer 402 without charging (a definite answer).

It counts effects per idempotency key and per order: two charges for one order are a
duplicate downstream effect, which is what settle exists to prevent.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Provider", "ProviderStats"]

BEHAVIOURS = ("ok", "slow", "unavailable", "decline")


@dataclass
class ProviderStats:
    """What the provider saw."""

    requests: int = 0
    effects: int = 0
    deduplicated: int = 0
    declined: int = 0
    unavailable: int = 0
    slow: int = 0
    effects_by_order: Counter[str] = field(default_factory=Counter)
    effects_by_key: Counter[str] = field(default_factory=Counter)
    deduplicated_by_order: Counter[str] = field(default_factory=Counter)
    charge_of_order: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    behaviours_of_order: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    @property
    def duplicate_effects(self) -> int:
        """Charges beyond the first, per order and per key (0 is the only right answer)."""
        per_order = sum(n - 1 for n in self.effects_by_order.values() if n > 1)
        per_key = sum(n - 1 for n in self.effects_by_key.values() if n > 1)
        return max(per_order, per_key)


class Provider:
    """``with Provider() as p:`` serves on ``p.url`` until the block ends."""

    def __init__(self, *, slow_seconds: float = 0.8) -> None:
        self.slow_seconds = slow_seconds
        self.stats = ProviderStats()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._scripts: dict[str, deque[str]] = defaultdict(deque)
        self._charges: dict[str, dict[str, Any]] = {}  # idempotency key -> charge
        self._bodies: dict[str, dict[str, Any]] = {}  # idempotency key -> first request
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="demo-provider", daemon=True
        )

    def __enter__(self) -> Provider:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()

    def script(self, order_id: str, *behaviours: str) -> None:
        """Behaviours for the next requests about ``order_id`` (then ``ok``)."""
        unknown = set(behaviours) - set(BEHAVIOURS)
        if unknown:
            raise ValueError(f"unknown provider behaviours: {sorted(unknown)}")
        with self._lock:
            self._scripts[order_id].extend(behaviours)

    def charge(self, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
        """Handle one charge request: (status, JSON body, seconds to wait before answering)."""
        order_id = str(body.get("order_id", ""))
        with self._lock:
            s = self.stats
            s.requests += 1
            script = self._scripts[order_id]
            behaviour = script.popleft() if script else "ok"
            s.behaviours_of_order[order_id].append(behaviour)
            if not key:
                return 400, {"error": "Idempotency-Key header required"}, 0.0
            if behaviour == "unavailable":
                s.unavailable += 1
                return 503, {"error": "try again later"}, 0.0
            if behaviour == "decline":
                s.declined += 1
                return 402, {"error": "card declined"}, 0.0
            existing = self._charges.get(key)
            if existing is not None:
                if self._bodies[key] != body:
                    return 422, {"error": "Idempotency-Key reused with another request"}, 0.0
                s.deduplicated += 1
                s.deduplicated_by_order[order_id] += 1
                charge = existing
            else:
                charge = {
                    "charge_id": f"ch_{uuid.uuid4().hex[:16]}",
                    "order_id": order_id,
                    "amount": body.get("amount"),
                    "currency": body.get("currency"),
                }
                self._charges[key] = charge
                self._bodies[key] = dict(body)
                s.effects += 1
                s.effects_by_order[order_id] += 1
                s.effects_by_key[key] += 1
                s.charge_of_order[order_id].append(charge["charge_id"])
            delay = 0.0
            if behaviour == "slow":
                s.slow += 1
                delay = self.slow_seconds
            return 200, charge, delay

    def wait(self, seconds: float) -> None:
        self._closing.wait(seconds)


def _handler(provider: Provider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
            del format, args

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            try:
                body = json.loads(self.rfile.read(length))
            except ValueError:
                status, payload, delay = 400, {"error": "body is not JSON"}, 0.0
            else:
                key = self.headers.get("Idempotency-Key", "")
                status, payload, delay = provider.charge(key, body)
            if delay:
                provider.wait(delay)
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:  # the client stopped waiting: a timeout after success
                pass

    return Handler
