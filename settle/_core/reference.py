"""The reference model: each Lua script of ``settle/lua`` written again in plain Python, over
a tiny in-memory keyspace that keeps hashes, counters, streams and expiry like Redis.

It takes the same planned :class:`~settle._core.engine.Call` and returns the same raw reply
(bytes, ints, nested lists) as redis-py would, so the core decodes both alike. Property tests
hold the Lua scripts against this module; ``settle.testing.MemorySettler`` runs on it.
Keep it a line-for-line reading of the Lua: it is the specification in executable form. Each
function is named after the Lua helper or script it mirrors and carries the Lua's comments on
why; each rule of docs/concepts.md ("Rules") is marked ``# rule: <id>`` at the branch that
implements it, as the Lua marks it ``-- rule: <id>`` (``tests/unit/test_rule_ids.py``).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from settle._core import layout

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


#: Tells one in-process keyspace from another (a token, not the object: nothing keeps it).
_PLACES = itertools.count(1)


class MemoryKeyspace:
    """A thread-safe, in-process stand-in for the few Redis data types settle uses."""

    def __init__(self, clock: Callable[[], int]) -> None:
        #: Where records live, for what must tell two stores apart (the decorator's identity
        #: registry): settlers on one keyspace share its records, on two never do.
        self.place = f"memory-{next(_PLACES)}"
        self.clock = clock
        self.lock = threading.RLock()
        self._data: dict[str, Any] = {}
        self._expire_at: dict[str, int] = {}
        self._last_us = 0
        self._last_ms = 0

    def now_us(self, now_ms: int) -> int:
        """The server clock in microseconds, as a real server's TIME: later on each call, and
        back with the clock when it steps back.

        As ``clock()`` in ``_lib.lua``: the microseconds order quarantine entries of different
        shards with the same stream id, and a live follow; generations are made of them.
        """
        self._last_us, self._last_ms = self.next_us(now_ms), now_ms
        return self._last_us

    def next_us(self, now_ms: int) -> int:
        """What :meth:`now_us` answers next, without moving the clock. More than 1000 calls
        in one millisecond (a clock that is not advanced) run on into the next ones, as a real
        server's TIME never answers the same microsecond twice: going back to the
        millisecond's first, the shards issued again the generations they had issued."""
        start = now_ms * 1000
        return self._last_us + 1 if now_ms >= self._last_ms and self._last_us >= start else start

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

    def hdel_count(self, key: str, now: int, fld: Any) -> int:
        if not self._live(key, now) or _b(fld) not in self._data[key]:
            return 0
        del self._data[key][_b(fld)]
        if not self._data[key]:  # Redis deletes an emptied hash
            del self._data[key]
        return 1

    # -- strings -------------------------------------------------------------------------
    def get(self, key: str, now: int) -> bytes | None:
        if not self._live(key, now):
            return None
        value: bytes = self._data[key]
        return value

    def set(self, key: str, now: int, value: bytes, px: int | None = None) -> None:
        """SET, with PX when ``px`` is given (a plain SET drops any expiry)."""
        self._live(key, now)
        self._data[key] = value
        if px is None:
            self._expire_at.pop(key, None)
        else:
            self._expire_at[key] = now + px

    # -- the whole keyspace ----------------------------------------------------------------
    def flush(self) -> None:
        """FLUSHALL, or a restart without persistence: every key is gone (the clock stays)."""
        self._data.clear()
        self._expire_at.clear()

    def delete(self, key: str) -> None:
        """DEL (or an eviction) of one key."""
        self._data.pop(key, None)
        self._expire_at.pop(key, None)

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

    def xdel(self, key: str, now: int, entry_id: bytes) -> None:
        """XDEL: the entry goes; the stream (and its last id) stays, also when emptied."""
        if self._live(key, now):
            stream = self._data[key]
            stream.entries = [e for e in stream.entries if e[0] != entry_id]


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


# -- _lib.lua ---------------------------------------------------------------------------------

# The order of FIELDS is the reply format: settle/_core/codec.py RECORD_FIELDS matches it.
# The stored fields (layout.PACKED) follow the operation id in the same order.
FIELDS = (b"op", *layout.PACKED)
REQUIRED = 10  # the first ten are always present
STATES = {b"pending", b"provisional", b"completed", b"failed"}


_DECIMAL = re.compile(rb"-?[0-9]+")
_EXACT = 2**53  # the integers a double (Lua's number) holds exactly are below this


def _is_int(value: bytes | None) -> bool:
    """An integer as settle writes one: decimal digits (and a sign), at most 20 characters,
    of a magnitude a double holds exactly (the Lua's ``decimal``; Python's ``int`` alone
    would take ``1_000``, Lua's ``tonumber`` ``1e3``)."""
    return (
        value is not None
        and len(value) <= 20
        and _DECIMAL.fullmatch(value) is not None
        and -_EXACT < int(value) < _EXACT
    )


#: The fields the rules compute with: integers wherever they are present.
_NUMBERS = (b"fpv", b"gen", b"ver", b"n", b"created", b"updated", b"lease")


_HEXED = {b"fp", b"aid", b"rdig"}


def _row(rec: dict[bytes, bytes]) -> list[int | bytes | list[bytes] | None]:
    """The Lua's ``replied(row)``: the record as the scripts return it, in FIELDS order, None
    where a field is absent (Lua's false); fp, aid and rdig as stored (:func:`layout.hexed`);
    the numbers (:data:`_NUMBERS`) as integers (Redis's integer replies); a new record's fpv
    is the caller's text, replied as an integer only where it is :func:`_is_int`."""
    return [_replied(f, rec.get(f)) for f in FIELDS]


def _replied(f: bytes, v: bytes | None) -> int | bytes | list[bytes] | None:
    if f in _HEXED:
        return layout.hexed(v)
    if v is not None and f in _NUMBERS and (f != b"fpv" or _is_int(v)):
        return int(v)  # every number but a new record's fpv is one _is_int checked or made
    return v


@dataclass
class Stored:
    """The Lua's ``st``: the value at the record key as one script call sees it, its live
    record (``rec``), the attempt log and each part's expiry (ms); ``log_key`` is the
    previous layout's attempt log (None for readers of the record only)."""

    key: str
    log_key: str | None
    log: list[bytes] | None = field(default_factory=list)  # None: not decoded yet
    rec: dict[bytes, bytes] | None = None
    blob: bytes = b""
    rexp: int | None = None
    lexp: int | None = None
    legacy: bool = False


def valid(rec: dict[bytes, bytes]) -> bool:
    if any(f not in rec for f in FIELDS[1:REQUIRED]):
        return False
    if rec[b"state"] not in STATES:
        return False
    if not all(_is_int(rec[f]) for f in _NUMBERS if f in rec):
        return False
    return rec[b"state"] != b"pending" or b"lease" in rec


def load_legacy(ks: MemoryKeyspace, st: Stored, now: int) -> dict[bytes, bytes] | None:
    """A record in the layout before this one: a HASH, its attempt log a LIST at log_key."""
    rec = ks.hgetall(st.key, now)
    if b"op" not in rec or not valid(rec):
        return None
    st.legacy = True
    ttl = ks.pttl(st.key, now)
    if ttl >= 0:
        st.rexp = now + ttl
    if st.log_key is not None:
        # The newest LOG_MAX, less any entry that is not six fields (the Lua drops it too).
        newest = ks.lrange(st.log_key, now)[-layout.LOG_MAX :]
        st.log = [entry for entry in newest if entry.count(b"|") >= 5]
        ttl = ks.pttl(st.log_key, now)
        if ttl >= 0:
            st.lexp = now + ttl
    return rec


def load_log(st: Stored) -> bool:
    """Make st.log available: False when the packed log does not decode (nothing may be
    written)."""
    if st.log is None:
        try:
            st.log = _unpack(st.blob).log
        except ValueError:
            return False
    return True


def entries(st: Stored) -> list[bytes]:
    """st.log of a caller that has loaded it."""
    assert st.log is not None
    return st.log


#: Values up to this size are remembered decoded (at most :data:`_REMEMBERED` of them, about
#: 10 MB at worst: a value decodes to up to 18 times its size, an attempt log of one attempt
#: retrying packs to 6 bytes an entry): the model checker's values (under 400 bytes) and a
#: test's; a long attempt log or a large stored result is not kept (4 KiB kept up to 75 MB).
_REMEMBER_UP_TO = 512
_REMEMBERED = 1024


class _Decoded:
    """One remembered value: its record part decoded at once, its attempt log when first
    asked (:func:`layout.unpack` without ``log``, then with it: a log that does not decode
    must not keep the record from being read). One entry a value, whichever is asked."""

    __slots__ = ("blob", "head", "log")

    def __init__(self, blob: bytes) -> None:
        self.blob = blob
        self.head = layout.unpack(blob, log=False)
        self.log: list[bytes] | None = None

    def entries(self) -> list[bytes]:
        """The attempt log's entries (decoded once; raises ValueError, not remembered)."""
        if self.log is None:
            self.log = layout.unpack(self.blob).log
        return self.log


@functools.lru_cache(maxsize=_REMEMBERED)
def _unpacked(blob: bytes) -> _Decoded:
    return _Decoded(blob)


def _unpack(blob: bytes, log: bool = True) -> layout.Packed:
    """:func:`layout.unpack`, remembered per small value and copied per call (the scripts
    change the record and log they load). The model checker and a MemorySettler's tests load
    the same few values again and again; decoding them in Python was most of their time."""
    if len(blob) > _REMEMBER_UP_TO:
        return layout.unpack(blob, log=log)
    d = _unpacked(blob)
    p = d.head
    record = dict(p.record) if p.record is not None else None
    return layout.Packed(record, p.record_expires, list(d.entries()) if log else [], p.log_expires)


def load_record(
    ks: MemoryKeyspace, key: str, log_key: str | None, now: int, lazy: bool = False
) -> tuple[dict[bytes, bytes] | bool | None, Stored]:
    """(the record's fields, st); the fields are None when there is no live record, False
    when the key holds something that is not a settle value (another type, a string of
    another format, fields missing). st carries the attempt log and what :func:`save` needs.
    The Lua also returns the positional row here; the scripts below build it with
    :func:`_row` when they reply. With lazy, st.log is left None for :func:`load_log`."""
    st = Stored(key, log_key)
    kind = ks.type(key, now)
    rec: dict[bytes, bytes] | None = None
    if kind == "hash":
        rec = load_legacy(ks, st, now)
        if rec is None:
            return False, st
    elif kind == "string":
        st.blob, st.log = ks.get(key, now) or b"", None
        try:
            packed = _unpack(st.blob, log=False)
        except ValueError:
            return False, st
        rec, st.rexp, st.lexp = packed.record, packed.record_expires, packed.log_expires
        if st.lexp is not None and st.lexp <= now:
            st.log, st.lexp = [], None
        elif not lazy and not load_log(st):
            return False, st
        if rec is not None:
            if not valid(rec):
                return False, st
            rec[b"op"] = key[key.index("}:op:") + 5 :].encode()
            if st.rexp is not None and st.rexp <= now:
                rec = None
    elif kind != "none":
        return False, st
    st.rec = rec
    return rec, st


def write(st: Stored, rec: dict[bytes, bytes], pairs: dict[str, Any]) -> None:
    """Write field/value pairs to the record's fields (:func:`save` stores them); a value of
    False deletes the field. The Lua's ``write`` also returns the row; here a script builds it
    with :func:`_row` when it replies."""
    for f, v in pairs.items():
        if v is False:
            rec.pop(_b(f), None)
        else:
            rec[_b(f)] = _b(v)
    st.rec = rec


def save(ks: MemoryKeyspace, st: Stored, now: int) -> None:
    """Store st (its live record and attempt log) as one packed value that expires with the
    later of the two; a value written before this layout leaves with its old attempt log."""
    packed = layout.Packed(st.rec, st.rexp, entries(st), st.lexp)
    expires = (st.rexp or 0) if st.rec is not None else 0
    if packed.log and st.lexp is not None:  # a log without its own expiry lives with the record
        expires = max(expires, st.lexp)
    if st.rec is not None and st.rexp is None:
        ks.set(st.key, now, layout.pack(packed))
    else:
        ks.set(st.key, now, layout.pack(packed), expires - now)
    if st.legacy and st.log_key is not None:
        ks.delete(st.log_key)


def effective_state(rec: dict[bytes, bytes], now: int) -> bytes:
    """A pending record whose lease has passed reads as provisional (lease_expired)."""
    # rule: L1
    if rec[b"state"] == b"pending" and int(rec[b"lease"]) <= now:
        return b"provisional"
    return rec[b"state"]


def is_terminal(state: bytes) -> bool:
    return state in (b"completed", b"failed")


def observe(
    st: Stored,
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
    """Append one observation to the operation's capped attempt log (:func:`save` stores it).
    The log expires with the record: ttl is the record's remaining time to live when the
    caller knows it, else None (then the record's own: -2 when there is none)."""
    log = entries(st)
    log.append(b"|".join(_b(v) for v in (aid, gen, action, verdict, detail, now)))
    del log[: max(len(log) - int(cap), 0)]
    if ttl is None:
        ttl = -2
        if st.rec is not None:
            ttl = st.rexp - now if st.rexp is not None else -1
    st.lexp = now + max(ttl, retention)


def guard(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any] | None:
    """The shard-count guard (SPEC §4), run before any write. A shard's state carries the
    shard count it was claimed for, so a client configured with another count never writes,
    also after the namespace metadata was lost and re-created. A shard whose state is missing
    (never used, or lost) is claimed only by a call that says the client has just checked the
    namespace metadata (claim flag '1'); otherwise the script answers 'unclaimed' and writes
    nothing. Returns None when the caller may write, else the reply to return."""
    key, shards, claim = keys[-1], a[-2], a[-1]
    stored = ks.hget(key, now, "shards")
    if stored is None:
        if claim != b"1":
            return [b"unclaimed", b"", now, b"", []]
        ks.hset(key, now, "shards", shards)
    elif stored != shards:
        return [b"shard_mismatch", stored, now, b"", []]
    return None


def next_generation(ks: MemoryKeyspace, key: str, now: int) -> int:
    """The next fencing generation of a shard: a hybrid logical clock, max(last + 1, server
    time in microseconds). The model's clock counts milliseconds; its server's microseconds
    (:meth:`MemoryKeyspace.now_us`) are ``now * 1000``, one later for each call within the
    millisecond, as a server runs one script at a time: generations stay strictly increasing,
    no two shards issue the same one, and after the shard's state was lost they restart above
    every one issued before, as long as the clock did not step back (past 1000 calls in one
    millisecond the microseconds run on into the next ones: :meth:`MemoryKeyspace.next_us`;
    docs/concepts.md, "Generations")."""
    last = ks.hget(key, now, "gen")
    gen = max((int(last) if last is not None and _is_int(last) else 0) + 1, ks.now_us(now))
    ks.hset(key, now, "gen", gen)
    return gen


# The quarantine's helpers (SPEC §3): an entry's identity is the SHA-1 of everything the
# caller presented, so the same rejected response delivered again stays one entry; entries
# leave only with their resolution and their identity.

_IDENTITY = (b"aid", b"action", b"pdig", b"reason", b"gen", b"fp", b"fpv", b"bind", b"op", b"ev")


def identity(f: dict[bytes, bytes]) -> bytes:
    # Each field is length-prefixed: an operation id or a binding may hold any separator,
    # and two different tuples must never share an identity.
    parts = b"".join(b"%d:%s" % (len(v), v) for v in (f.get(k, b"") for k in _IDENTITY))
    return hashlib.sha1(parts).hexdigest().encode()  # noqa: S324 - an identity, not a secret


def entry_fields(flat: Flat) -> dict[bytes, bytes]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


def drop_entry(
    ks: MemoryKeyspace,
    stream: str,
    resolutions: str,
    seen: str,
    entry: tuple[bytes, Flat],
    now: int,
) -> bool:
    """Delete one stream entry with its resolution and its identity; returns whether it had
    been resolved."""
    ident = identity(entry_fields(entry[1]))
    if ks.hget(seen, now, ident) == entry[0]:
        ks.hdel_count(seen, now, ident)
    ks.xdel(stream, now, entry[0])
    return ks.hdel_count(resolutions, now, entry[0]) == 1


# -- reserve.lua ------------------------------------------------------------------------------


def texts(a: list[bytes], *at: int) -> list[bytes]:
    """The arguments with those at ``at`` (fingerprint, attempt id, digest: sent in stored
    form, :func:`layout.stored_arg`) as the text they stand for, as the Lua's ``arg_text``
    reads them (the model keeps those fields as text)."""
    return [layout.arg_text(v) if i in at else v for i, v in enumerate(a)]


def reserve(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    """Claim an operation for a new attempt (SPEC §2, reserve table)."""
    a = texts(a, 1, 6)
    refused = guard(ks, keys, a, now)
    if refused is not None:
        return refused
    rec, st = load_record(ks, keys[0], keys[1], now, lazy=True)
    if rec is False:
        return [b"corrupt", b"", now, b"", []]
    lease, retention = int(a[4]), int(a[5])
    detail = "new"  # rule: R1
    if isinstance(rec, dict):
        # rule: R2
        if rec[b"fp"] != a[1] or rec[b"fpv"] != a[2]:
            return [b"fingerprint_mismatch", b"", now, b"", []]
        # rule: R3
        if rec[b"bind"] != a[3]:
            return [b"binding_mismatch", b"", now, b"", []]
        state = effective_state(rec, now)
        # rule: R4, R5
        if is_terminal(state):
            return [b"replay", state, now, b"", _row(rec)]
        if state == b"pending":
            # rule: R9
            # The same attempt asking again (its first reply was lost on the wire) gets its
            # own reservation back, so reserve is safe to repeat.
            if rec.get(b"aid") == a[6]:
                return [b"reserved", b"resumed", now, b"", _row(rec)]
            # rule: R6
            return [b"in_progress", b"", now, b"", _row(rec)]
        # rule: R7, R8
        detail = "lease_expired" if rec[b"state"] == b"pending" else "provisional"
    if not load_log(st):
        return [b"corrupt", b"", now, b"", []]
    gen = next_generation(ks, keys[2], now)
    if isinstance(rec, dict):
        write(
            st,
            rec,
            {
                "gen": gen,
                "ver": int(rec[b"ver"]) + 1,
                "n": int(rec[b"n"]) + 1,
                "state": "pending",
                "lease": now + lease,
                "aid": a[6],
                "updated": now,
                "reason": False,
            },
        )
    else:
        rec = {}
        write(
            st,
            rec,
            {
                "op": a[0],
                "fp": a[1],
                "fpv": a[2],
                "bind": a[3],
                "gen": gen,
                "ver": 1,
                "n": 1,
                "state": "pending",
                "lease": now + lease,
                "aid": a[6],
                "created": now,
                "updated": now,
            },
        )
    st.rexp = now + lease + retention
    observe(st, a[7], retention, lease + retention, a[6], gen, "reserve", "reserved", detail, now)
    save(ks, st, now)
    return [b"reserved", detail.encode(), now, b"", _row(rec)]


# -- _settle.lua, and complete.lua, fail.lua, mark_provisional.lua that call it ---------------

TERMINAL_OF = {"complete": b"completed", "fail": b"failed"}


def observed(log: list[bytes], aid: bytes, gen: bytes, action: str) -> bool:
    """Whether the attempt log holds this attempt's accepted settlement with this action."""
    prefix = b"|".join([aid, gen, action.encode(), b"accepted"]) + b"|"
    return any(entry.startswith(prefix) for entry in log)


def cap_stream(ks: MemoryKeyspace, keys: list[str], maxlen: int, now: int) -> int:
    """Make room for one entry in a stream of at most maxlen (the last resort of
    quarantine_maxlen): the oldest go with their resolutions and identities. Returns how
    many were unresolved."""
    entries = ks.xrange(keys[2], now)
    over = len(entries) + 1 - maxlen
    unresolved = 0
    for entry in entries[: max(over, 0)]:
        if not drop_entry(ks, keys[2], keys[3], keys[4], entry, now):
            unresolved += 1
    return unresolved


def quarantine(
    ks: MemoryKeyspace,
    keys: list[str],
    a: list[bytes],
    kind: str,
    action: str,
    rec: dict[bytes, bytes] | None,
    now: int,
) -> tuple[bytes, int, bool]:
    """Append the rejected response to the shard's quarantine stream, once: the same response
    delivered again gets the id of its first entry. Returns (entry id, unresolved dropped,
    whether it is that repeat). An entry whose write pushed unresolved ones out holds their
    count (``dropped``), and a repeat answers it again (a lost reply's repeat said 0)."""
    payload = a[7]
    presented = [a[6], action, a[8], a[9], a[4], a[1], a[2], a[3], a[0], a[5]]
    ident = identity(dict(zip(_IDENTITY, (_b(v) for v in presented), strict=True)))
    known = ks.hget(keys[4], now, ident)
    for eid, held in ks.xrange(keys[2], now) if known is not None else []:
        if eid == known:
            stored = dict(zip(held[::2], held[1::2], strict=True))
            return known, int(stored.get(b"dropped", b"0")), True
    dropped = cap_stream(ks, keys, int(a[13]), now) if a[13] else 0
    fields: dict[str, Any] = {
        "op": a[0],
        "kind": kind,
        "action": action,
        "fp": a[1],
        "fpv": a[2],
        "bind": a[3],
        "gen": a[4],
        "ev": a[5],
        "aid": a[6],
        "reason": a[9],
        "payload": payload[: int(a[12])],
        "psize": len(payload),
        "pdig": a[8],
        "at": now,
        "us": ks.now_us(now),
    }
    if rec is not None:
        fields |= {"cstate": effective_state(rec, now), "cgen": rec[b"gen"], "cver": rec[b"ver"]}
    if dropped:
        fields["dropped"] = dropped
    flat = [x for f, v in fields.items() for x in (f, v)]
    entry_id = ks.xadd(keys[2], now, flat)
    ks.hset(keys[4], now, ident, entry_id)
    return entry_id, dropped, False


def settle(action: str, ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    """The settlement rules (SPEC §2, settlement table), one call per settlement."""
    a = texts(a, 1, 6, 8)
    refused = guard(ks, keys, a, now)
    if refused is not None:
        return refused
    rec, st = load_record(ks, keys[0], keys[1], now)
    if rec is False:
        return [b"corrupt", b"", now, b"", []]
    retention = int(a[10])
    kind = ""
    verdict = ""
    ttl: int | None = None
    if not isinstance(rec, dict):
        kind = "unknown_operation"  # rule: S1
    elif rec[b"fp"] != a[1] or rec[b"fpv"] != a[2] or rec[b"bind"] != a[3]:
        kind = "misbound"  # rule: S2
    elif rec[b"gen"] != a[4]:
        if action == "mark_provisional" and observed(entries(st), a[6], a[4], action):
            # rule: S13
            # The repeat of an accepted mark_provisional whose reply was lost, arriving after
            # another attempt took over: it already counted, it is not a stale response.
            verdict = "absorbed"
        else:
            kind = "stale_generation"  # rule: S3
    else:
        state = effective_state(rec, now)
        if is_terminal(state):
            # rule: S8, S10, S11
            # A duplicate of the settlement that made the record terminal is absorbed, also
            # when it carries the version it saw before that settlement; success is never
            # downgraded.
            if action == "mark_provisional" or (
                TERMINAL_OF.get(action) == state and rec.get(b"rdig") == a[8]
            ):
                verdict = "absorbed"
            elif a[5] != b"" and a[5] != rec[b"ver"]:
                kind = "version_conflict"  # rule: S4
            else:
                kind = "conflicting_settlement"  # rule: S9
        elif (
            action == "mark_provisional"
            and rec[b"state"] == b"provisional"
            and rec.get(b"reason") == a[9]
        ):
            # rule: S12
            # The same uncertainty reported again (a repeat after a lost reply): nothing to
            # update, so it is absorbed, whatever version the repeat carries.
            verdict = "absorbed"
        elif a[5] != b"" and a[5] != rec[b"ver"]:
            kind = "version_conflict"  # rule: S4
        else:
            verdict = "accepted"
            ver = int(rec[b"ver"]) + 1
            if action == "mark_provisional":
                # rule: S6, S7
                write(
                    st,
                    rec,
                    {
                        "state": "provisional",
                        "reason": a[9],
                        "ver": ver,
                        "updated": now,
                        "lease": False,
                    },
                )
            else:
                # rule: S5
                write(
                    st,
                    rec,
                    {
                        "state": TERMINAL_OF[action],
                        "result": a[7],
                        "rdig": a[8],
                        "ver": ver,
                        "updated": now,
                        "lease": False,
                        "reason": False,
                    },
                )
            st.rexp = now + retention
            ttl = retention
    qid, dropped, repeated = b"", 0, False
    if kind:
        verdict = "quarantined"
        qid, dropped, repeated = quarantine(
            ks, keys, a, kind, action, rec if isinstance(rec, dict) else None, now
        )
    observe(st, a[11], retention, ttl, a[6], a[4], action, verdict, kind, now)
    save(ks, st, now)
    # rule: S2 (a misbound caller gets no record: it would show one principal's result to another)
    row = [] if not isinstance(rec, dict) or kind == "misbound" else _row(rec)
    return [verdict.encode(), kind.encode(), now, qid, row, dropped] + ([1] if repeated else [])


def complete(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    return settle("complete", ks, keys, a, now)


def fail(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    return settle("fail", ks, keys, a, now)


def mark_provisional(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    return settle("mark_provisional", ks, keys, a, now)


# -- renew.lua --------------------------------------------------------------------------------


def renew(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    """Extend a live pending lease of the current generation (a heartbeat). A lost lease is
    not a response, so it is never quarantined; the detail says why. Misbound callers get no
    record."""
    a = texts(a, 0)
    refused = guard(ks, keys, a, now)
    if refused is not None:
        return refused
    rec, st = load_record(ks, keys[0], keys[1], now)
    if rec is False:
        return [b"corrupt", b"", now, b"", []]
    if not isinstance(rec, dict):
        return [b"lost", b"unknown_operation", now, b"", []]  # rule: N1
    # rule: N2
    if rec[b"fp"] != a[0] or rec[b"fpv"] != a[1] or rec[b"bind"] != a[2]:
        return [b"lost", b"misbound", now, b"", []]
    row = _row(rec)
    if rec[b"gen"] != a[3]:
        return [b"lost", b"stale_generation", now, b"", row]  # rule: N3
    if rec[b"state"] != b"pending":
        return [b"lost", b"not_pending", now, b"", row]  # rule: N4
    if int(rec[b"lease"]) <= now:
        return [b"lost", b"lease_expired", now, b"", row]  # rule: N5
    # rule: N6 (not a transition: the version stays, so the owner's expected_version holds)
    lease = int(a[4])
    write(st, rec, {"lease": now + lease})
    st.rexp = now + lease + int(a[5])
    save(ks, st, now)
    return [b"renewed", b"", now, b"", _row(rec)]


# -- the read scripts and namespace.lua -------------------------------------------------------


def get(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    """Read a record with the server's clock, so every reader sees the same effective state
    (an expired pending lease reads as provisional)."""
    del a
    rec, _st = load_record(ks, keys[0], None, now, lazy=True)
    if rec is False:
        return [b"corrupt", b"", now, b"", []]
    if not isinstance(rec, dict):
        return [b"missing", b"", now, b"", []]
    return [b"found", b"", now, b"", _row(rec)]


def get_many(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    """Read several records of one shard at once, each as :func:`get` reads one: a reply per
    key, ``[found, row]``, ``[missing]`` or ``[corrupt]``."""
    del a
    out: list[Any] = []
    for key in keys:
        rec, _st = load_record(ks, key, None, now, lazy=True)
        if rec is False:
            out.append([b"corrupt"])
        elif not isinstance(rec, dict):
            out.append([b"missing"])
        else:
            out.append([b"found", _row(rec)])
    return [b"ok", b"", now, b"", out]


def attempts(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    """Read an operation's attempt log, oldest first (it lives in the record's packed value;
    a record written before that layout keeps it in keys[1])."""
    del a
    rec, st = load_record(ks, keys[0], keys[1], now)
    if rec is False:
        return [b"corrupt", b"", now, b"", []]
    return [b"ok", b"", now, b"", entries(st)]


def _lua_number(raw: bytes) -> float | None:
    """Lua's ``tonumber`` of a script argument: C's strtod (decimal or hex digits, an
    exponent, inf, nan; spaces around), else None. Python's ``int`` would refuse ``1e3`` and
    ``0x10``; its ``float`` alone takes ``1_000`` and not hex."""
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    if "_" in text:
        return None
    hexed = text.strip().lstrip("+-")[:2] in ("0x", "0X")
    try:
        return float.fromhex(text) if hexed else float(text)
    except ValueError:
        return None


def _refused(script: str, i: int, what: str, must: str) -> ValueError:
    """The error of an argument a script refuses (arg_refused in _lib.lua): its text, which
    Redis sends as the error reply."""
    return ValueError(f"ERR settle: {script}: {what} (ARGV[{i}]) must be {must}")


def _count(a: list[bytes], i: int, script: str, what: str) -> int:
    """ARGV[i] in arg_refused's 'count' form: a whole number of at least 1 (in any text
    tonumber reads), or refused."""
    x = _lua_number(a[i - 1]) if len(a) >= i else None
    if x is None or not (x >= 1 and x % 1 == 0):  # inf % 1 is nan, as in Lua
        raise _refused(script, i, what, "a whole number of at least 1")
    return int(x)


def _window_bound(a: list[bytes], i: int) -> float | None:
    """ARGV[i] of quarantine_read: a bound of its window by the entries' time, or None
    ('' or absent); anything but a number (nan too) refused, as the script does."""
    if len(a) < i or a[i - 1] == b"":
        return None
    x = _lua_number(a[i - 1])
    if x is None or math.isnan(x):
        raise _refused(
            "quarantine_read",
            i,
            "since" if i == 10 else "until",
            "a number of milliseconds, or '' (open)",
        )
    return x


#: The fields of a quarantine entry a header read returns (quarantine_read.lua, ARGV[9]).
_HEADER = frozenset({b"kind", b"at", b"us"})


def quarantine_read(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    """Read one shard's quarantine stream with the filters applied here, so a filtered listing
    does not ship every entry to the client. ``a[8] == b"1"``: headers only, each match
    ``[id, [kind, at and us fields as stored], b"1" if resolved else b""]``. Without the
    resolutions key every entry reads as unresolved (the caller reads them apart)."""
    low, high = a[0].decode(), a[1].decode()
    limit = _count(a, 3, "quarantine_read", "max matches")
    budget = _count(a, 4, "quarantine_read", "scan budget")
    kind, op, unresolved, newest = a[4], a[5], a[6] == b"1", a[7] == b"1"
    headers = a[8:9] == [b"1"]
    if a[8:9] not in ([], [b"0"], [b"1"]):
        raise _refused(
            "quarantine_read", 9, "headers flag", "'1' (headers only) or '0' (whole entries)"
        )
    since_at, until_at = (_window_bound(a, i) for i in (10, 11))
    entries = [e for e in ks.xrange(keys[0], now) if _in_range(e[0], low, high)]
    if newest:
        entries.reverse()
    out: list[Any] = []
    last = b""
    examined = 0
    # The script's loop: XRANGE chunks of at most 256, up to the budget, each examined until
    # the matches reach the limit; ``done`` only once a chunk came back short (the range is
    # read to its end), so a read that stops at its limit or budget on the range's last
    # entry says ``more``, as the script's does.
    while len(out) < limit and examined < budget:
        want = min(256, budget - examined)
        chunk = entries[examined : examined + want]
        used = 0
        for entry_id, flat in chunk:
            used += 1
            examined += 1
            last = entry_id
            f = dict(zip(flat[::2], flat[1::2], strict=True))
            res = (ks.hget(keys[1], now, entry_id) if keys[1:] else None) or b""
            windowed = since_at is not None or until_at is not None
            t = _lua_number(f.get(b"us", b"")) if windowed else None
            if t is not None and math.isfinite(t):
                t = math.floor(t / 1000)  # inf and nan stay as they are, as in Lua
            elif t is None and windowed:  # written before entries had us; else the id's ms
                t = _lua_number(f.get(b"at", b""))
                t = float(entry_id.split(b"-")[0]) if t is None else t
            if (
                (not kind or f[b"kind"] == kind)
                and (not op or f[b"op"] == op)
                and (not unresolved or res == b"")
                and (since_at is None or (t is not None and t >= since_at))
                and (until_at is None or (t is not None and t <= until_at))
            ):
                if headers:
                    kept = [
                        x
                        for i in range(0, len(flat), 2)
                        if flat[i] in _HEADER
                        for x in flat[i : i + 2]
                    ]
                    out.append([entry_id, kept, b"1" if res else b""])
                else:
                    out.append([entry_id, list(flat), res])
                if len(out) >= limit:
                    break
        if len(chunk) < want and used == len(chunk):
            return [b"done", last, now, b"", out]
    return [b"more", last, now, b"", out]


def quarantine_resolve(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    """Mark a quarantine entry resolved with a note. The entry itself is never changed or
    deleted, and the first resolution stands."""
    refused = guard(ks, keys, a, now)
    if refused is not None:
        return refused
    if not any(eid == a[0] for eid, _ in ks.xrange(keys[0], now)):
        return [b"missing", b"", now, b"", []]
    res = json.dumps({"note": a[1].decode(), "at": now}).encode()
    if ks.hsetnx(keys[1], now, a[0], res) == 0:
        return [b"already_resolved", b"", now, b"", [ks.hget(keys[1], now, a[0])]]
    return [b"resolved", b"", now, b"", [res]]


def quarantine_trim(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    """Explicit quarantine retention (SPEC §3): delete the shard's resolved entries in an id
    range, with their resolutions and identities; unresolved evidence only when the caller
    says so. Examines at most a budget of entries per call. A call repeated with its token
    (``a[4]``; its reply was lost) gets the first run's reply back (kept a day in
    ``keys[3]``), with the entries that run deleted counted."""
    refused = guard(ks, keys, a, now)
    if refused is not None:
        return refused
    token = a[4]
    kept = ks.get(keys[3], now) if token else None
    # A key of another type holds no reply (as the script's pcall); the SET replaces it.
    if isinstance(kept, bytes) and kept.startswith(token + b"|"):
        was = re.fullmatch(rb"([^|]*)\|([^|]*)\|(\d+)\|(\d+)", kept[len(token) + 1 :])
        if was is not None:  # else (not a reply settle wrote) the call runs, as the script's
            code, last, removed, unresolved = was.groups()
            return [code, last, now, b"", [int(removed), int(unresolved)]]
    low = a[0].decode()
    high = "+"
    if a[1] != b"":
        # an age reaching back before the epoch: no entry has id 0-0 (none is that old)
        before = now - int(a[1])
        high = f"({before}-0" if before >= 1 else "0-0"
    everything = a[2] == b"1"
    budget = int(a[3])
    entries = [e for e in ks.xrange(keys[0], now) if _in_range(e[0], low, high)]
    removed = unresolved = 0
    last = b""
    for entry in entries[:budget]:
        last = entry[0]
        if everything or ks.hget(keys[1], now, entry[0]) is not None:
            if not drop_entry(ks, keys[0], keys[1], keys[2], entry, now):
                unresolved += 1
            removed += 1
    code = b"done" if len(entries) < budget else b"more"
    if token:
        reply = b"|".join([token, code, last, b"%d" % removed, b"%d" % unresolved])
        ks.set(keys[3], now, reply, px=86_400_000)
    return [code, last, now, b"", [removed, unresolved]]


def namespace(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    """Check a namespace's shard count against its metadata; create missing metadata only
    when asked to (``a[2] == b"1"``), else answer 'absent' and write nothing."""
    stored = ks.hget(keys[0], now, "shards")
    if stored is None:
        if a[2:3] != [b"1"]:
            return [b"absent", b"", now, b"", []]
        ks.hsetnx(keys[0], now, "shards", a[0])
        ks.hsetnx(keys[0], now, "created", now)
        ks.hsetnx(keys[0], now, "fpv", a[1])
        stored = a[0]
    if stored != a[0]:
        return [b"mismatch", stored, now, b"", []]
    created = ks.hget(keys[0], now, "created")
    return [b"ok", stored, now, b"" if created is None else created, []]


def claim(ks: MemoryKeyspace, keys: list[str], a: list[bytes], now: int) -> list[Any]:
    """Claim one shard for the namespace's shard count at start-up (claim.lua): detail
    ``claimed`` when this call made the state."""
    had = ks.hget(keys[0], now, "shards") is not None
    refused = guard(ks, keys, a, now)
    if refused is not None:
        return refused
    return [b"ok", b"" if had else b"claimed", now, b"", []]


_SCRIPTS: dict[str, Callable[[MemoryKeyspace, list[str], list[bytes], int], list[Any]]] = {
    "reserve": reserve,
    "complete": complete,
    "fail": fail,
    "mark_provisional": mark_provisional,
    "renew": renew,
    "get": get,
    "get_many": get_many,
    "attempts": attempts,
    "quarantine_read": quarantine_read,
    "quarantine_resolve": quarantine_resolve,
    "quarantine_trim": quarantine_trim,
    "namespace": namespace,
    "claim": claim,
}


def run_script(ks: MemoryKeyspace, name: str, keys: list[str], args: list[Any]) -> list[Any]:
    """Run one script atomically (under the keyspace lock) at the keyspace clock's time."""
    with ks.lock:
        return _SCRIPTS[name](ks, keys, [_b(v) for v in args], ks.clock())
