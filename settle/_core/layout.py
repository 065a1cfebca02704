"""The packed record layout (SPEC §4): an operation's record and its attempt log as ONE
Redis STRING at the record key, the format ``lua/_lib.lua`` reads and writes.

Why: a 15-field HASH beside an attempt-log LIST cost about 790 bytes per settled operation
(two keys, hex digests, the operation id repeated inside its own key, long field values);
this value costs about 280 (docs/concepts.md, "The record in Redis"; measured by
``python -m benchmarks.memory``). The reference model stores the same bytes, and the tests
and the model checker read stored values through :func:`unpack`.

A value is ``MAGIC`` and then MessagePack values, exactly as Redis's embedded ``cmsgpack``
writes them: the record's (:data:`PACKED`, then its own expiry; one nil when only the log
is left), the log's expiry, then six per log entry. Words (states, actions, verdicts,
details) are their index in :data:`WORDS`; digests and attempt ids of an even number of
lowercase hex digits are the bytes they spell, other text a one-element array
(:func:`hexed`); integers are MessagePack integers, most stored relative to another field
(see :func:`pack`), so they take one or two bytes. Everything here is pure.
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass, field

__all__ = [
    "LOG_MAX",
    "MAGIC",
    "PACKED",
    "WORDS",
    "Packed",
    "arg_text",
    "hex_arg",
    "hexed",
    "pack",
    "stored_arg",
    "stored_digest",
    "unpack",
]

#: The most attempt-log entries one value may hold (``SettleConfig.attempt_log_size``'s
#: maximum): a script decodes a value whole, and Lua's C stack holds about 8000 values (16
#: for the record, 6 per entry). A previous layout's log list is read up to this many.
LOG_MAX = 1000

MAGIC = b"\x02"
#: Words stored as one byte; append only (``WORDS`` in lua/_lib.lua is the same list).
WORDS = (
    b"pending",
    b"provisional",
    b"completed",
    b"failed",
    b"reserve",
    b"complete",
    b"fail",
    b"mark_provisional",
    b"reserved",
    b"accepted",
    b"absorbed",
    b"quarantined",
    b"new",
    b"lease_expired",
    b"resumed",
    b"unknown_operation",
    b"misbound",
    b"stale_generation",
    b"version_conflict",
    b"conflicting_settlement",
)
_WORD = {w: i for i, w in enumerate(WORDS, 1)}
#: The record's fields in stored order (the operation id is the key's own tail).
PACKED = (
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
_HEX = re.compile(rb"(?:[0-9a-f]{2})+")
_DECIMAL = re.compile(rb"-?(?:0|[1-9][0-9]*)")


@dataclass
class Packed:
    """What one value holds: the record's fields as the scripts see them (None: only the log
    is left), each part's expiry in server milliseconds (None: none), the attempt log's
    ``aid|gen|action|verdict|detail|at`` entries, oldest first."""

    record: dict[bytes, bytes] | None
    record_expires: int | None = None
    log: list[bytes] = field(default_factory=list)
    log_expires: int | None = None


# -- msgpack, exactly as the cmsgpack library Redis embeds in its Lua writes it ---------------

Value = bytes | int | list[bytes] | None


def _mp_int(n: int) -> bytes:
    if 0 <= n <= 127:
        return bytes([n])
    if -32 <= n < 0:
        return bytes([n & 0xFF])
    for lo, hi, code, fmt in _INTS:
        if lo <= n <= hi:
            return bytes([code]) + struct.pack(fmt, n)
    raise ValueError(f"integer {n} out of range")


_INTS = (
    (0, 0xFF, 0xCC, ">B"),
    (0, 0xFFFF, 0xCD, ">H"),
    (0, 0xFFFFFFFF, 0xCE, ">I"),
    (0, 2**64 - 1, 0xCF, ">Q"),
    (-128, -1, 0xD0, ">b"),
    (-(2**15), -1, 0xD1, ">h"),
    (-(2**31), -1, 0xD2, ">i"),
    (-(2**63), -1, 0xD3, ">q"),
)


def _mp(value: Value) -> bytes:
    if value is None:
        return b"\xc0"
    if isinstance(value, int):
        return _mp_int(value)
    if isinstance(value, list):
        return bytes([0x90 | len(value)]) + b"".join(_mp(v) for v in value)
    n = len(value)
    if n < 32:
        head = bytes([0xA0 | n])
    elif n <= 0xFF:
        head = b"\xd9" + bytes([n])
    elif n <= 0xFFFF:
        head = b"\xda" + struct.pack(">H", n)
    else:
        head = b"\xdb" + struct.pack(">I", n)
    return head + value


_SIZED = {0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q", 0xD0: ">b", 0xD1: ">h", 0xD2: ">i"}
_SIZED[0xD3] = ">q"
_LENGTH = {0xD9: ">B", 0xDA: ">H", 0xDB: ">I"}


def _take(blob: bytes, pos: int, n: int) -> bytes:
    if pos + n > len(blob):
        raise ValueError("truncated value")
    return blob[pos : pos + n]


def _unmp(blob: bytes, pos: int) -> tuple[Value, int]:
    """The msgpack object at ``pos`` (only what :func:`_mp` writes): (value, next position)."""
    b = _take(blob, pos, 1)[0]
    pos += 1
    if b == 0xC0:
        return None, pos
    if b < 0x80 or b >= 0xE0:
        return (b if b < 0x80 else b - 256), pos
    if b in _SIZED:
        fmt = _SIZED[b]
        n = struct.calcsize(fmt)
        return int(struct.unpack(fmt, _take(blob, pos, n))[0]), pos + n
    if 0x90 <= b <= 0x9F:
        read: list[Value] = []
        for _ in range(b & 0x0F):
            item, pos = _unmp(blob, pos)
            read.append(item)
        while read and read[-1] is None:  # trailing nils: a Lua table does not hold them
            read.pop()
        items: list[bytes] = []
        for item in read:
            if not isinstance(item, bytes):  # corrupt, like every other refusal here
                raise ValueError("not a settle value: array of non-strings")  # noqa: TRY004
            items.append(item)
        return items, pos
    if 0xA0 <= b <= 0xBF:
        n = b & 0x1F
    elif b in _LENGTH:
        fmt = _LENGTH[b]
        k = struct.calcsize(fmt)
        n = int(struct.unpack(fmt, _take(blob, pos, k))[0])
        pos += k
    else:
        raise ValueError(f"not a settle value: msgpack type {b:#x}")
    return _take(blob, pos, n), pos + n


# -- the fields' encodings (the Lua's hexed/num/word/rel and their inverses) ----------------


def hexed(v: bytes | None) -> bytes | list[bytes] | None:
    """How fp, aid and rdig are stored, and how the scripts reply with them (the Lua's
    ``hexed``): an even number of lowercase hex digits as the bytes they spell, other text
    as ``[text]``."""
    if v is None:
        return None
    return bytes.fromhex(v.decode()) if _HEX.fullmatch(v) else [v]


def stored_arg(text: str) -> str | bytes:
    """How the client sends a fingerprint, an attempt id or a digest to the scripts: in the
    form they store it (``hexed``), so no script converts hex: a NUL byte and the bytes an
    even number of lowercase hex digits spell, other text as it is (such text never starts
    with NUL: fingerprints and digests are hex, attempt ids are checked). The Lua's
    ``arg_stored`` and ``arg_text`` read it."""
    arg = hex_arg(text)
    if arg is not None:
        return arg
    if text.startswith("\0"):
        raise ValueError("a fingerprint, attempt id or digest never starts with NUL")
    return text


def hex_arg(text: str) -> bytes | None:
    """:func:`stored_arg` of an even number of lowercase hex digits (a NUL byte and the
    bytes they spell); None for any other text."""
    # The bytes' own hex is the text exactly when the text is an even number of lowercase
    # hex digits (fromhex also reads uppercase digits and skips blanks): a quarter of the
    # instructions of matching ``(?:[0-9a-f]{2})+`` first (re's repeated group), on the
    # fingerprint and the attempt id of every reserve and settlement. Compared as str: a str
    # subclass's own ``==`` (one that ignores case) would take ``'AB'`` for ``'ab'``.
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        return None
    return b"\0" + raw if raw and str.__eq__(raw.hex(), text) else None


def stored_digest(data: bytes) -> bytes:
    """:func:`stored_arg` of the SHA-256 hex digest of ``data``, made from the digest's
    bytes (no hex round trip: a settlement sends its payload's digest on every call)."""
    return b"\0" + hashlib.sha256(data).digest()


def arg_text(v: bytes) -> bytes:
    """The text a :func:`stored_arg` argument stands for (the Lua's ``arg_text``)."""
    return v[1:].hex().encode() if v[:1] == b"\0" else v


def _unhexed(v: Value) -> bytes | None:
    if isinstance(v, bytes):
        return v.hex().encode()
    if v is None or (isinstance(v, list) and len(v) == 1):
        return v[0] if v else None
    raise ValueError("not a settle value: hex field")


def _num(v: bytes | None) -> Value:
    if v is not None and _DECIMAL.fullmatch(v):
        n = int(v)
        if -(2**63) < n < 2**63 and int(float(n)) == n:
            return n
    return v


def _unnum(v: Value) -> bytes | None:
    if isinstance(v, int):
        return b"%d" % v
    return _text(v)


def _word(v: bytes | None) -> Value:
    if v is None:
        return None
    return _WORD.get(v, v)


def _unword(v: Value) -> bytes | None:
    if isinstance(v, int):
        if not 1 <= v <= len(WORDS):
            raise ValueError(f"unknown word {v}")
        return WORDS[v - 1]
    return _text(v)


def _text(v: Value) -> bytes | None:
    if v is not None and not isinstance(v, bytes):
        raise ValueError("not a settle value: text field")
    return v


def _rel(v: bytes | int | None, base: bytes | None) -> int | None:
    if v is None:
        return None
    assert base is not None
    return int(v) - int(base)


def _unrel(v: Value, base: bytes | None) -> bytes | None:
    if v is None:
        return None
    if not isinstance(v, int) or base is None:
        raise ValueError("not a settle value: relative field")
    return b"%d" % (int(base) + v)


def unpack(blob: bytes, log: bool = True) -> Packed:
    """Decode a stored value (the Lua's ``unpack_value`` then ``log_entries``; without
    ``log``, its attempt log is not read). Raises ValueError."""
    if blob[:1] != MAGIC:
        raise ValueError("not a packed settle value")
    t: list[Value] = []
    pos = 1
    while pos < len(blob):
        value, pos = _unmp(blob, pos)
        t.append(value)
    rec: dict[bytes, bytes] | None = None
    record_expires = None
    i = 1
    if t and t[0] is not None:
        if len(t) < 16:
            raise ValueError("truncated value")
        fields = {
            b"fp": _unhexed(t[0]),
            b"fpv": _unnum(t[1]),
            b"bind": _text(t[2]),
            b"gen": _unnum(t[3]),
            b"ver": _unnum(t[4]),
            b"state": _unword(t[5]),
            b"n": _unnum(t[6]),
            b"created": _unnum(t[7]),
        }
        fields[b"updated"] = _unrel(t[8], fields[b"created"])
        fields[b"lease"] = _unrel(t[9], fields[b"updated"])
        fields[b"aid"] = _unhexed(t[10])
        fields[b"reason"] = _unword(t[11])
        fields[b"result"] = _text(t[12])
        fields[b"rdig"] = _unhexed(t[13])
        expiry = _unrel(t[14], fields[b"updated"])
        record_expires = int(expiry) if expiry is not None else None
        rec = {k: v for k, v in fields.items() if v is not None}
        i = 15
    if i >= len(t) + 1 or (len(t) - 1 - i) % 6:
        raise ValueError("truncated value")
    lexp = _unrel(t[i], rec.get(b"created") if rec is not None else b"0")
    log_expires = int(lexp) if lexp is not None else None
    if not log:  # the record alone (the Lua's load_record with lazy: no scan_log)
        return Packed(rec, record_expires, [], log_expires)
    aid, gen, at = b"", b"", b"0"
    if rec is not None:
        aid, gen, at = rec.get(b"aid", b""), rec.get(b"gen", b""), rec.get(b"created", b"0")
    entries = []
    for j in range(i + 1, len(t), 6):
        e = t[j : j + 6]
        aid = (_unhexed(e[0]) or b"") if e[0] is not None else aid
        gen = (_unnum(e[1]) or b"") if e[1] is not None else gen
        at = _unrel(e[5], at) or b""
        if not at:
            raise ValueError("not a settle value: log entry without its time")
        words = [_unword(v) or b"" for v in e[2:5]]
        entries.append(b"|".join([aid, gen, *words, at]))
    return Packed(rec, record_expires, entries, log_expires)


def pack(p: Packed) -> bytes:
    """Encode a value (the Lua's ``save``): ``updated`` relative to ``created``, ``lease``
    and the record's expiry to ``updated``; in the log, ``aid`` and ``gen`` absent when equal
    to the previous entry's (the first one's previous: the record's aid, gen and created),
    ``at`` relative to the previous entry's, the log's expiry to the record's ``created``
    (absolute when there is no record)."""
    rec = p.record
    v: list[Value] = []
    aid, gen, at = b"", b"", b"0"
    if rec is not None:
        g = rec.get
        v = [
            hexed(g(b"fp")),
            _num(g(b"fpv")),
            g(b"bind"),
            _num(g(b"gen")),
            _num(g(b"ver")),
            _word(g(b"state")),
            _num(g(b"n")),
            _num(g(b"created")),
            _rel(g(b"updated"), g(b"created")),
            _rel(g(b"lease"), g(b"updated")),
            hexed(g(b"aid")),
            _word(g(b"reason")),
            g(b"result"),
            hexed(g(b"rdig")),
            _rel(p.record_expires, g(b"updated")),
        ]
        aid, gen, at = g(b"aid", b""), g(b"gen", b""), g(b"created", b"0")
    else:
        v = [None]
    v.append(
        _rel(p.log_expires, rec.get(b"created") if rec is not None else b"0") if p.log else None
    )
    for entry in p.log:
        e = entry.split(b"|", 5)
        v.append(None if e[0] == aid else hexed(e[0]))
        v.append(None if e[1] == gen else _num(e[1]))
        v += [_word(w) for w in e[2:5]]
        v.append(_rel(e[5], at))
        aid, gen, at = e[0], e[1], e[5]
    return MAGIC + b"".join(_mp(x) for x in v)
