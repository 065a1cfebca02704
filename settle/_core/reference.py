"""The reference model: each Lua script of ``settle/lua`` written again in plain Python, over
a tiny in-memory keyspace that keeps hashes, counters, streams and expiry like Redis.

It takes the same planned :class:`~settle._core.engine.Call` and returns the same raw reply
(bytes, ints, nested lists) as redis-py would, so the core decodes both alike. Property tests
hold the Lua scripts against this module; ``settle.testing.MemorySettler`` runs on it.
Keep it a line-for-line reading of the Lua: it is the specification in executable form.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MemoryKeyspace", "run_script"]

Flat = list[bytes]


def _b(value: Any) -> bytes:
    """Encode an argument the way redis-py sends it (and Lua's redis.call stores it)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, bool):
        raise TypeError("booleans are not valid Redis arguments")
    return str(value).encode("utf-8")


@dataclass
class _Stream:
    entries: list[tuple[bytes, Flat]] = field(default_factory=list)
    last: tuple[int, int] = (0, 0)


class MemoryKeyspace:
    """A thread-safe, in-process stand-in for the few Redis data types settle uses."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self.clock = clock
        self.lock = threading.RLock()
        self._data: dict[str, Any] = {}
        self._expire_at: dict[str, int] = {}
        self._last_us = 0

    def now_us(self, now_ms: int) -> int:
        """Microseconds for ordering, strictly increasing like a real server's TIME."""
        self._last_us = max(self._last_us + 1, now_ms * 1000)
        return self._last_us

    # -- keys ----------------------------------------------------------------------------
    def _live(self, key: str, now: int) -> bool:
        at = self._expire_at.get(key)
        if at is not None and at <= now:
            self._data.pop(key, None)
            self._expire_at.pop(key, None)
        return key in self._data

    def type(self, key: str, now: int) -> str:
        if not self._live(key, now):
            return "none"
        value = self._data[key]
        if isinstance(value, dict):
            return "hash"
        if isinstance(value, _Stream):
            return "stream"
        if isinstance(value, list):
            return "list"
        return "string"

    def pexpire(self, key: str, ms: int, now: int) -> None:
        if self._live(key, now):
            self._expire_at[key] = now + ms

    def pttl(self, key: str, now: int) -> int:
        if not self._live(key, now):
            return -2
        at = self._expire_at.get(key)
        return -1 if at is None else at - now

    def set_raw(self, key: str, value: Any) -> None:
        """Put any value at a key (tests use it to plant corrupt records)."""
        self._data[key] = value
        self._expire_at.pop(key, None)

    # -- hashes --------------------------------------------------------------------------
    def hgetall(self, key: str, now: int) -> dict[bytes, bytes]:
        if not self._live(key, now):
            return {}
        return dict(self._data[key])

    def hset(self, key: str, now: int, *pairs: Any) -> None:
        self._live(key, now)
        h = self._data.setdefault(key, {})
        for i in range(0, len(pairs), 2):
            h[_b(pairs[i])] = _b(pairs[i + 1])

    def hsetnx(self, key: str, now: int, fld: Any, value: Any) -> int:
        self._live(key, now)
        h = self._data.setdefault(key, {})
        if _b(fld) in h:
            return 0
        h[_b(fld)] = _b(value)
        return 1

    def hdel(self, key: str, now: int, *fields: str) -> None:
        if self._live(key, now):
            for f in fields:
                self._data[key].pop(_b(f), None)

    def hget(self, key: str, now: int, fld: Any) -> bytes | None:
        if not self._live(key, now):
            return None
        value: bytes | None = self._data[key].get(_b(fld))
        return value

    # -- counters ------------------------------------------------------------------------
    def incr(self, key: str, now: int) -> int:
        self._live(key, now)
        value = int(self._data.get(key, b"0")) + 1
        self._data[key] = _b(value)
        return value

    # -- lists ---------------------------------------------------------------------------
    def rpush(self, key: str, now: int, value: Any) -> int:
        self._live(key, now)
        items: list[bytes] = self._data.setdefault(key, [])
        items.append(_b(value))
        return len(items)

    def ltrim_tail(self, key: str, now: int, keep: int) -> None:
        if self._live(key, now):
            del self._data[key][:-keep]

    def lrange(self, key: str, now: int) -> list[bytes]:
        if not self._live(key, now):
            return []
        return list(self._data[key])

    # -- streams -------------------------------------------------------------------------
    def xadd(self, key: str, now: int, fields: list[Any], maxlen: int | None = None) -> bytes:
        self._live(key, now)
        stream = self._data.setdefault(key, _Stream())
        ms, seq = stream.last
        stream.last = (ms, seq + 1) if now <= ms else (now, 0)
        entry_id = f"{stream.last[0]}-{stream.last[1]}".encode()
        stream.entries.append((entry_id, [_b(v) for v in fields]))
        if maxlen is not None and len(stream.entries) > maxlen:
            del stream.entries[: len(stream.entries) - maxlen]
        return entry_id

    def xrange(self, key: str, now: int) -> list[tuple[bytes, Flat]]:
        if not self._live(key, now):
            return []
        return list(self._data[key].entries)


def _id(raw: bytes | str) -> tuple[int, int]:
    text = raw.decode() if isinstance(raw, bytes) else raw
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def _in_range(entry_id: bytes, low: str, high: str) -> bool:
    eid = _id(entry_id)
    if low != "-":
        lo = _id(low.lstrip("("))
        if eid < lo or (low.startswith("(") and eid == lo):
            return False
    if high != "+":
        hi = _id(high.lstrip("(")) if "-" in high else (int(high.lstrip("(")), 2**64 - 1)
        if eid > hi or (high.startswith("(") and eid == hi):
            return False
    return True


# -- the scripts, one function each, reading like the Lua ------------------------------------

_REQUIRED = (b"op", b"fp", b"fpv", b"bind", b"gen", b"ver", b"state", b"n", b"created", b"updated")
_STATES = {b"pending", b"provisional", b"completed", b"failed"}
_TERMINAL_OF = {"complete": b"completed", "fail": b"failed"}


def _is_int(value: bytes | None) -> bool:
    try:
        int(value or b"x")
    except ValueError:
        return False
    return True


def _load(ks: MemoryKeyspace, key: str, now: int) -> dict[bytes, bytes] | bool | None:
    kind = ks.type(key, now)
    if kind == "none":
        return None
    if kind != "hash":
        return False
    rec = ks.hgetall(key, now)
    if any(f not in rec for f in _REQUIRED):
        return False
    if rec[b"state"] not in _STATES or not _is_int(rec[b"gen"]) or not _is_int(rec[b"ver"]):
        return False
    if rec[b"state"] == b"pending" and not _is_int(rec.get(b"lease")):
        return False
    return rec


_FIELDS = (
    b"op",
    b"fp",
    b"fpv",
    b"bind",
    b"gen",
    b"ver",
    b"state",
    b"n",
    b"created",
    b"updated",
    b"lease",
    b"aid",
    b"reason",
    b"result",
    b"rdig",
)


def _flat(ks: MemoryKeyspace, key: str, now: int) -> list[bytes | None]:
    """The record as the scripts return it: values in FIELDS order, None where absent."""
    rec = ks.hgetall(key, now)
    return [rec.get(f) for f in _FIELDS]


def _effective(rec: dict[bytes, bytes], now: int) -> bytes:
    if rec[b"state"] == b"pending" and int(rec[b"lease"]) <= now:
        return b"provisional"
    return rec[b"state"]


def _observe(
    ks: MemoryKeyspace,
    log: str,
    record: str,
    cap: bytes,
    retention: int,
    ttl: int | None,
    aid: bytes,
    gen: Any,
    action: str,
    verdict: str,
    detail: str,
    now: int,
) -> None:
    entry = b"|".join(_b(v) for v in (aid, gen, action, verdict, detail, now))
    if ks.rpush(log, now, entry) > int(cap):
        ks.ltrim_tail(log, now, int(cap))
    if ttl is None:
        ttl = ks.pttl(record, now)
    ks.pexpire(log, max(ttl, retention), now)


def _reserve(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    rec = _load(ks, keys[0], now)
    if rec is False:
        return [b"corrupt", b"", now, b"", []]
    lease, retention = int(a[4]), int(a[5])
    detail = "new"
    if isinstance(rec, dict):
        if rec[b"fp"] != a[1] or rec[b"fpv"] != a[2]:
            return [b"fingerprint_mismatch", b"", now, b"", []]
        if rec[b"bind"] != a[3]:
            return [b"binding_mismatch", b"", now, b"", []]
        state = _effective(rec, now)
        if state in (b"completed", b"failed"):
            return [b"replay", state, now, b"", _flat(ks, keys[0], now)]
        if state == b"pending":
            if rec.get(b"aid") == a[6]:
                return [b"reserved", b"resumed", now, b"", _flat(ks, keys[0], now)]
            return [b"in_progress", b"", now, b"", _flat(ks, keys[0], now)]
        detail = "lease_expired" if rec[b"state"] == b"pending" else "provisional"
    gen = ks.incr(keys[1], now)
    if isinstance(rec, dict):
        ks.hdel(keys[0], now, "reason")
        ks.hset(
            keys[0],
            now,
            "gen",
            gen,
            "ver",
            int(rec[b"ver"]) + 1,
            "n",
            int(rec[b"n"]) + 1,
            "state",
            "pending",
            "lease",
            now + lease,
            "aid",
            a[6],
            "updated",
            now,
        )
    else:
        ks.hset(
            keys[0],
            now,
            "op",
            a[0],
            "fp",
            a[1],
            "fpv",
            a[2],
            "bind",
            a[3],
            "gen",
            gen,
            "ver",
            1,
            "n",
            1,
            "state",
            "pending",
            "lease",
            now + lease,
            "aid",
            a[6],
            "created",
            now,
            "updated",
            now,
        )
    ks.pexpire(keys[0], lease + retention, now)
    _observe(
        ks,
        keys[2],
        keys[0],
        a[7],
        retention,
        lease + retention,
        a[6],
        gen,
        "reserve",
        "reserved",
        detail,
        now,
    )
    return [b"reserved", detail.encode(), now, b"", _flat(ks, keys[0], now)]


def _settle(action: str) -> Callable[[MemoryKeyspace, list[str], list[bytes], int], list[Any]]:
    def script(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
        rec = _load(ks, keys[0], now)
        if rec is False:
            return [b"corrupt", b"", now, b"", []]
        retention = int(a[10])
        kind = ""
        verdict = ""
        ttl: int | None = None
        if not isinstance(rec, dict):
            kind = "unknown_operation"
        elif rec[b"fp"] != a[1] or rec[b"fpv"] != a[2] or rec[b"bind"] != a[3]:
            kind = "misbound"
        elif rec[b"gen"] != a[4]:
            prefix = b"|".join([a[6], a[4], action.encode(), b"accepted"]) + b"|"
            if action == "mark_provisional" and any(
                entry.startswith(prefix) for entry in ks.lrange(keys[1], now)
            ):
                verdict = "absorbed"
            else:
                kind = "stale_generation"
        else:
            state = _effective(rec, now)
            if state in (b"completed", b"failed"):
                if action == "mark_provisional" or (
                    _TERMINAL_OF.get(action) == state and rec.get(b"rdig") == a[8]
                ):
                    verdict = "absorbed"
                elif a[5] != b"" and a[5] != rec[b"ver"]:
                    kind = "version_conflict"
                else:
                    kind = "conflicting_settlement"
            elif (
                action == "mark_provisional"
                and rec[b"state"] == b"provisional"
                and rec.get(b"reason") == a[9]
            ):
                verdict = "absorbed"
            elif a[5] != b"" and a[5] != rec[b"ver"]:
                kind = "version_conflict"
            else:
                verdict = "accepted"
                ver = int(rec[b"ver"]) + 1
                if action == "mark_provisional":
                    ks.hdel(keys[0], now, "lease")
                    ks.hset(
                        keys[0],
                        now,
                        "state",
                        "provisional",
                        "reason",
                        a[9],
                        "ver",
                        ver,
                        "updated",
                        now,
                    )
                else:
                    ks.hdel(keys[0], now, "lease", "reason")
                    ks.hset(
                        keys[0],
                        now,
                        "state",
                        _TERMINAL_OF[action],
                        "result",
                        a[7],
                        "rdig",
                        a[8],
                        "ver",
                        ver,
                        "updated",
                        now,
                    )
                ks.pexpire(keys[0], retention, now)
                ttl = retention
        qid = b""
        if kind:
            verdict = "quarantined"
            fields: list[Any] = [
                "op",
                a[0],
                "kind",
                kind,
                "action",
                action,
                "fp",
                a[1],
                "fpv",
                a[2],
                "bind",
                a[3],
                "gen",
                a[4],
                "ev",
                a[5],
                "aid",
                a[6],
                "reason",
                a[9],
                "payload",
                a[7][: int(a[12])],
                "psize",
                len(a[7]),
                "pdig",
                a[8],
                "at",
                now,
                "us",
                ks.now_us(now),
            ]
            if isinstance(rec, dict):
                fields += ["cstate", _effective(rec, now), "cgen", rec[b"gen"], "cver", rec[b"ver"]]
            qid = ks.xadd(keys[2], now, fields, int(a[13]) if a[13] else None)
        _observe(
            ks, keys[1], keys[0], a[11], retention, ttl, a[6], a[4], action, verdict, kind, now
        )
        if rec is None or kind == "misbound":
            return [verdict.encode(), kind.encode(), now, qid, []]
        return [verdict.encode(), kind.encode(), now, qid, _flat(ks, keys[0], now)]

    return script


def _renew(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    rec = _load(ks, keys[0], now)
    if rec is False:
        return [b"corrupt", b"", now, b"", []]
    if rec is None:
        return [b"lost", b"unknown_operation", now, b"", []]
    assert isinstance(rec, dict)
    if rec[b"fp"] != a[0] or rec[b"fpv"] != a[1] or rec[b"bind"] != a[2]:
        return [b"lost", b"misbound", now, b"", []]
    flat = _flat(ks, keys[0], now)
    if rec[b"gen"] != a[3]:
        return [b"lost", b"stale_generation", now, b"", flat]
    if rec[b"state"] != b"pending":
        return [b"lost", b"not_pending", now, b"", flat]
    if int(rec[b"lease"]) <= now:
        return [b"lost", b"lease_expired", now, b"", flat]
    lease = int(a[4])
    ks.hset(keys[0], now, "lease", now + lease)
    ks.pexpire(keys[0], lease + int(a[5]), now)
    return [b"renewed", b"", now, b"", _flat(ks, keys[0], now)]


def _get(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    del a
    rec = _load(ks, keys[0], now)
    if rec is False:
        return [b"corrupt", b"", now, b"", []]
    if rec is None:
        return [b"missing", b"", now, b"", []]
    return [b"found", b"", now, b"", _flat(ks, keys[0], now)]


def _attempts(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    del a
    return [b"ok", b"", now, b"", ks.lrange(keys[0], now)]


def _quarantine_read(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    low, high = a[0].decode(), a[1].decode()
    limit, budget = int(a[2]), int(a[3])
    kind, op, unresolved, newest = a[4], a[5], a[6] == b"1", a[7] == b"1"
    entries = [e for e in ks.xrange(keys[0], now) if _in_range(e[0], low, high)]
    if newest:
        entries.reverse()
    out: list[Any] = []
    last = b""
    examined = 0
    for entry_id, flat in entries:
        if len(out) >= limit or examined >= budget:
            return [b"more", last, now, b"", out]
        examined += 1
        last = entry_id
        f = dict(zip(flat[::2], flat[1::2], strict=True))
        res = ks.hget(keys[1], now, entry_id) or b""
        if (
            (not kind or f[b"kind"] == kind)
            and (not op or f[b"op"] == op)
            and (not unresolved or res == b"")
        ):
            out.append([entry_id, list(flat), res])
    if len(out) >= limit and examined < len(entries):
        return [b"more", last, now, b"", out]
    return [b"done", last, now, b"", out]


def _quarantine_resolve(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    if not any(eid == a[0] for eid, _ in ks.xrange(keys[0], now)):
        return [b"missing", b"", now, b"", []]
    res = json.dumps({"note": a[1].decode(), "at": now}).encode()
    if ks.hsetnx(keys[1], now, a[0], res) == 0:
        return [b"already_resolved", b"", now, b"", [ks.hget(keys[1], now, a[0])]]
    return [b"resolved", b"", now, b"", [res]]


def _namespace(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    ks.hsetnx(keys[0], now, "shards", a[0])
    ks.hsetnx(keys[0], now, "created", now)
    ks.hsetnx(keys[0], now, "fpv", a[1])
    stored = ks.hget(keys[0], now, "shards") or b""
    return [b"mismatch" if stored != a[0] else b"ok", stored, now, b"", []]


_SCRIPTS: dict[str, Callable[[MemoryKeyspace, list[str], list[bytes], int], list[Any]]] = {
    "reserve": _reserve,
    "complete": _settle("complete"),
    "fail": _settle("fail"),
    "mark_provisional": _settle("mark_provisional"),
    "renew": _renew,
    "get": _get,
    "attempts": _attempts,
    "quarantine_read": _quarantine_read,
    "quarantine_resolve": _quarantine_resolve,
    "namespace": _namespace,
}


def run_script(ks: MemoryKeyspace, name: str, keys: list[str], args: list[Any]) -> list[Any]:
    """Run one script atomically (under the keyspace lock) at the keyspace clock's time."""
    with ks.lock:
        return _SCRIPTS[name](ks, keys, [_b(v) for v in args], ks.clock())
