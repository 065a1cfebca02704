"""A real paginated HTTP provider for the cursor tests: a ground-truth event log served on a
loopback port, opaque random tokens held server-side, and scheduled faults.

GET /page?cursor=<token>  ->  200 {"events": [...], "next": token, "snapshot", "coverage"}
                              410 when the token expired or was revoked
Faults are queued with ``provider.faults.append(name)`` and consumed one per request: ``drop``
serves nothing after issuing the successor (the connection is closed), ``empty`` answers an
empty page with a successor at the head (a lagging replica), ``expire`` answers 410, ``short``
answers the page without its last event (or without the events from ``short_below`` on) and a
successor at the head (a truncated page from a lagging replica), ``loop`` answers the page with
the request's own cursor as the successor, ``rewind`` with the cursor the request's cursor was
issued for (one already passed). ``tie_bucket``: positions are ``timestamp * tie_bucket + seq``
and an inclusive page starts at the first event of the boundary's timestamp (events tied with
the boundary come before it).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx

from settle.cursor import Coverage, Event, Page, ProviderCursorExpired


@dataclass
class Entry:
    id: str
    position: int
    payload: dict[str, Any]


@dataclass
class Token:
    value: int  # a position (position mode) or an index (offset mode)
    issued: float
    parent: str | None


@dataclass
class Provider:
    page_size: int = 3
    offsets: bool = False  # tokens hold an index into the log instead of a position
    inclusive: bool = False  # pages repeat the event at the token's position
    rotate: bool = False  # every response issues a fresh token
    revoke: bool = False  # issuing a successor for a token revokes the one issued before
    ttl: float | None = None
    watermarks: bool = False
    tie_bucket: int | None = None
    snapshot: str | None = None
    log: list[Entry] = field(default_factory=list)
    faults: deque[str] = field(default_factory=deque)
    names: deque[str] = field(default_factory=deque)  # explicit names for the next tokens
    tokens: dict[str, Token] = field(default_factory=dict)
    issued_for: dict[str, str] = field(default_factory=dict)
    revoked: set[str] = field(default_factory=set)
    requests: int = 0
    gone: int = 0  # 410 answers
    #: Where a ``short`` answer cuts the page (None: before its last event).
    short_below: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    # -- the ground truth -------------------------------------------------------------

    def append(self, n: int = 1, *, gap: int = 1) -> list[Entry]:
        with self.lock:
            out = []
            for _ in range(n):
                pos = (self.log[-1].position if self.log else 0) + gap
                out.append(self._put(Entry(f"e{pos}", pos, {"v": pos})))
            return out

    def _put(self, entry: Entry) -> Entry:
        self.log.append(entry)
        self.log.sort(key=lambda e: e.position)
        return entry

    def insert(self, position: int, eid: str | None = None) -> Entry:
        with self.lock:
            return self._put(Entry(eid or f"e{position}", position, {"v": position}))

    def delete(self, eid: str) -> None:
        with self.lock:
            self.log = [e for e in self.log if e.id != eid]

    def mutate(self, eid: str) -> None:
        with self.lock:
            for e in self.log:
                if e.id == eid:
                    e.payload = {"v": e.payload["v"], "changed": True}

    def token(self, value: int, name: str | None = None) -> str:
        with self.lock:
            return self._issue(value, None, name)

    def _issue(self, value: int, parent: str | None, name: str | None = None) -> str:
        tok = name or (self.names.popleft() if self.names else secrets.token_urlsafe(12))
        self.tokens[tok] = Token(value, time.monotonic(), parent)
        if parent is not None:
            before = self.issued_for.get(parent)
            if self.revoke and before is not None and before != tok:
                self.revoked.add(before)
            self.issued_for[parent] = tok
        return tok

    # -- serving ----------------------------------------------------------------------

    def serve(self, cursor: str) -> tuple[int, dict[str, Any] | None]:
        with self.lock:
            self.requests += 1
            fault = self.faults.popleft() if self.faults else None
            tok = self.tokens.get(cursor)
            if (
                tok is None
                or cursor in self.revoked
                or fault == "expire"
                or (self.ttl is not None and time.monotonic() - tok.issued > self.ttl)
            ):
                self.gone += 1
                return 410, None
            events, nxt = self._page(tok.value, fault == "empty")
            if fault == "short" and events:
                # A lagging replica's copy: what it has of the page, without the event at
                # ``short_below`` and after (by default the page's last event).
                below = events[-1].position if self.short_below is None else self.short_below
                events = [e for e in events if e.position < below]
                nxt = max(e.position for e in self.log)
            if fault in ("loop", "rewind"):
                successor = cursor if fault == "loop" else (tok.parent or cursor)
            elif fault == "short":
                successor = self._issue(nxt, None)
            elif not self.rotate and cursor in self.issued_for and fault != "empty":
                successor = self.issued_for[cursor]
                if self.tokens[successor].value != nxt:
                    successor = self._issue(nxt, cursor)
            else:
                successor = self._issue(nxt, cursor)
            body: dict[str, Any] = {
                "events": [
                    {"id": e.id, "position": e.position, "payload": e.payload} for e in events
                ],
                "next": successor,
                "snapshot": self.snapshot,
                "coverage": None,
            }
            if self.watermarks and not self.offsets and fault != "empty":
                low = tok.value - 1 if self.inclusive else tok.value
                high = (
                    events[-1].position
                    if events
                    else max([tok.value, *(e.position for e in self.log)])
                )
                body["coverage"] = [max(low, 0), high]
            if fault == "drop":
                return 0, None
            return 200, body

    def _page(self, value: int, empty: bool) -> tuple[list[Entry], int]:
        if self.offsets:
            if empty:
                return [], max(value, len(self.log))
            events = self.log[value : value + self.page_size]
            return events, value + len(events)
        if self.inclusive:
            low = value - value % self.tie_bucket if self.tie_bucket else value
            events = [e for e in self.log if e.position >= low][: self.page_size]
        else:
            events = [e for e in self.log if e.position > value][: self.page_size]
        if empty:  # a lagging replica: nothing, and a successor at its idea of the head
            return [], max([value, *(e.position for e in self.log)])
        return events, (events[-1].position if events else value)


class _Handler(BaseHTTPRequestHandler):
    provider: Provider

    def do_GET(self) -> None:
        query = parse_qs(urlparse(self.path).query)
        status, body = self.provider.serve(query.get("cursor", [""])[0])
        if status == 0:  # the successor was issued, the response is lost
            self.close_connection = True
            self.connection.shutdown(2)
            return
        data = json.dumps(body).encode() if body is not None else b"{}"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


class ProviderServer:
    def __init__(self, provider: Provider) -> None:
        handler = type("Handler", (_Handler,), {"provider": provider})
        self.provider = provider
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ProviderServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class TransportLost(Exception):
    """The response never arrived (the provider may have issued a successor)."""


def page_from(body: dict[str, Any]) -> Page:
    cov = body.get("coverage")
    return Page(
        events=[Event(e["id"], e["position"], e["payload"]) for e in body["events"]],
        successor=body["next"].encode(),
        snapshot=body.get("snapshot"),
        coverage=Coverage(cov[0], cov[1]) if cov else None,
    )


def fetcher(url: str, client: httpx.Client) -> Any:
    """A ``fetch_page`` over HTTP, as a user would write it."""

    def fetch_page(cursor: bytes) -> Page:
        try:
            resp = client.get(f"{url}/page", params={"cursor": cursor.decode()})
        except httpx.TransportError as exc:
            raise TransportLost(str(exc)) from exc
        if resp.status_code == 410:
            raise ProviderCursorExpired("the provider answered 410 Gone for the cursor")
        resp.raise_for_status()
        return page_from(resp.json())

    return fetch_page


def async_fetcher(url: str, client: httpx.AsyncClient) -> Any:
    async def fetch_page(cursor: bytes) -> Page:
        try:
            resp = await client.get(f"{url}/page", params={"cursor": cursor.decode()})
        except httpx.TransportError as exc:
            raise TransportLost(str(exc)) from exc
        if resp.status_code == 410:
            raise ProviderCursorExpired("the provider answered 410 Gone for the cursor")
        resp.raise_for_status()
        return page_from(resp.json())

    return fetch_page
