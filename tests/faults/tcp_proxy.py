"""A loopback TCP proxy in front of a real redis-server that breaks chosen requests.

``proxy.cut(needle, at)`` arms a fault for the next request whose bytes contain ``needle``
(a script's SHA, a command name):

- ``before_request``: the request is dropped and the client's connection closed; the
  server never sees it.
- ``reset``: the same, the client's connection reset (an RST, ``ECONNRESET`` on its next
  read) rather than closed.
- ``after_request``: the request reaches the server, which runs it; as soon as the first
  byte of its reply comes back the client's connection is closed and the reply is lost.
- ``mid_reply``: the request runs and half of the first reply chunk reaches the client.
- ``stall``: the request runs and the reply is withheld until the client gives up (a
  client ``socket_timeout``), as on a network partition.
- ``slow``: the request reaches the server ``proxy.slow_by`` seconds late (its
  connection's later requests wait behind it), as from a loaded machine or a slow link.
- ``hold``: the request is held on its way to the server (``proxy.holding`` is set) until
  ``proxy.release()``, then goes on: a request held up on the network as long as a test
  needs, however long the client has waited.

``fired`` lists the faults that happened, so a test can check its fault really struck.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Literal

Point = Literal["before_request", "reset", "after_request", "mid_reply", "stall", "slow", "hold"]


#: SO_LINGER on, 0 seconds: close() resets the connection.
_NO_LINGER = struct.pack("ii", 1, 0)


@dataclass
class _Fault:
    needles: tuple[bytes, ...]
    at: Point
    times: int


@dataclass
class _Link:
    client: socket.socket
    upstream: socket.socket
    swallow: Point | None = None
    closed: threading.Event = field(default_factory=threading.Event)

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class FaultyProxy:
    """Start with ``FaultyProxy(port).start()``; connect clients to ``proxy.port``."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._faults: list[_Fault] = []
        self._links: list[_Link] = []
        self._lock = threading.Lock()
        self.fired: list[Point] = []
        self.slow_by = 0.01
        """How late a ``slow`` request reaches the server (seconds)."""
        self.holding = threading.Event()
        """Set once a ``hold`` request is held (until :meth:`release`)."""
        self._released = threading.Event()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> FaultyProxy:
        self._listener.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def cut(self, needle: bytes | str | tuple[bytes | str, ...], at: Point, times: int = 1) -> None:
        """Arm a fault for requests holding ``needle`` (any one of a tuple of needles: a
        script call is EVALSHA of its SHA or FCALL of its function name)."""
        alternatives = needle if isinstance(needle, tuple) else (needle,)
        raw = tuple(n.encode() if isinstance(n, str) else n for n in alternatives)
        with self._lock:
            self._faults.append(_Fault(raw, at, times))

    def release(self) -> None:
        """Let a ``hold`` request (and every later one) go on to the server."""
        self._released.set()

    def disarm(self) -> None:
        with self._lock:
            self._faults.clear()

    def drop_connections(self) -> None:
        """Close every open connection, as a restarted load balancer would."""
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close()

    def close(self) -> None:
        """Stop listening (new connections are refused) and drop every open connection."""
        self.release()
        with contextlib.suppress(OSError):
            # Without shutdown the thread blocked in accept() keeps the port listening.
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        self.drop_connections()

    def _take(self, chunk: bytes) -> Point | None:
        with self._lock:
            for fault in self._faults:
                if any(needle in chunk for needle in fault.needles):
                    fault.times -= 1
                    if fault.times == 0:
                        self._faults.remove(fault)
                    self.fired.append(fault.at)
                    return fault.at
        return None

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            link = _Link(client, upstream)
            with self._lock:
                self._links.append(link)
            threading.Thread(target=self._requests, args=(link,), daemon=True).start()
            threading.Thread(target=self._replies, args=(link,), daemon=True).start()

    def _requests(self, link: _Link) -> None:
        while not link.closed.is_set():
            try:
                chunk = link.client.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            at = self._take(chunk)
            if at == "before_request":
                break
            if at == "reset":  # no shutdown first: that would send a FIN before the RST
                with contextlib.suppress(OSError):
                    link.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _NO_LINGER)
                    link.client.close()
                break
            if at == "slow":
                time.sleep(self.slow_by)
            elif at == "hold":
                self.holding.set()
                self._released.wait()
            elif at is not None:
                link.swallow = at
            try:
                link.upstream.sendall(chunk)
            except OSError:
                break
        link.close()

    def _replies(self, link: _Link) -> None:
        while not link.closed.is_set():
            try:
                chunk = link.upstream.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            if link.swallow == "after_request":
                break
            if link.swallow == "mid_reply":
                with contextlib.suppress(OSError):
                    link.client.sendall(chunk[: max(1, len(chunk) // 2)])
                break
            if link.swallow == "stall":
                continue
            try:
                link.client.sendall(chunk)
            except OSError:
                break
        link.close()
