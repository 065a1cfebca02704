"""A real downstream payment provider for the decorator tests: an HTTP server on a loopback
port that honours ``Idempotency-Key`` the way payment APIs do and counts its effects.

Each order can be given a script of behaviours, used one per request:
``ok``; ``slow:S`` (do the charge, then answer after S seconds: the client times out after
the provider's success); ``fail_after`` (do the charge, then answer 503); ``fail_before``
(answer 503 without charging); ``decline`` (answer 402, no charge).
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict, deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Provider:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._scripts: dict[str, deque[str]] = defaultdict(deque)
        self.charges: dict[str, dict[str, Any]] = {}  # idempotency key -> charge
        self.bodies: dict[str, dict[str, Any]] = {}  # idempotency key -> first request body
        self.requests: list[tuple[str, str, str]] = []  # (key, order id, behaviour)
        self.charged = threading.Event()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                key = self.headers.get("Idempotency-Key", "")
                fence = int(self.headers.get("X-Fencing-Token", "0"))
                status, payload, delay = provider._charge(key, fence, body)
                if delay:
                    provider._closing.wait(delay)
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up waiting (a timeout after success)
                    pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Provider:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()

    def script(self, order_id: str, *behaviours: str) -> None:
        with self._lock:
            self._scripts[order_id].extend(behaviours)

    def effects(self, order_id: str) -> int:
        """How many charges the provider made for the order (1 is right; 2 is a double charge)."""
        with self._lock:
            return sum(1 for c in self.charges.values() if c["order_id"] == order_id)

    def requests_for(self, order_id: str) -> int:
        with self._lock:
            return sum(1 for _, order, _ in self.requests if order == order_id)

    def _charge(self, key: str, fence: int, body: dict[str, Any]) -> tuple[int, Any, float]:
        order = body["order_id"]
        with self._lock:
            script = self._scripts[order]
            behaviour = script.popleft() if script else "ok"
            self.requests.append((key, order, behaviour))
            if not key:
                return 400, {"error": "missing_idempotency_key"}, 0
            if key in self.bodies and self.bodies[key] != body:
                return 422, {"error": "idempotency_key_reused"}, 0
            if behaviour == "fail_before":
                return 503, {"error": "unavailable"}, 0
            if behaviour == "decline":
                return 402, {"error": "card_declined"}, 0
            if key not in self.charges:
                self.bodies[key] = body
                self.charges[key] = {
                    "charge_id": f"ch_{len(self.charges) + 1}",
                    "order_id": order,
                    "amount": body["amount"],
                    "currency": body["currency"],
                    "fencing_token": fence,
                }
                self.charged.set()
            charge = self.charges[key]
        if behaviour == "fail_after":
            return 503, {"error": "unavailable"}, 0
        if behaviour.startswith("slow:"):
            return 200, charge, float(behaviour.split(":", 1)[1])
        return 200, charge, 0
