"""The packed record layout (SPEC §4): an operation's record and its attempt log as ONE
Redis STRING at the record key, the format ``lua/_lib.lua`` reads and writes.

Why: a 15-field HASH beside an attempt-log LIST cost about 790 bytes per settled operation
(two keys, hex digests, the operation id repeated inside its own key, long field values);
this value costs about 280 (docs/concepts.md, "The record in Redis"; measured by
``python -m benchmarks.memory``). The reference model stores the same bytes, and the tests
and the model checker read stored values through :func:`unpack`.

A value is ``MAGIC``, the record's tokens (:data:`PACKED` then its own expiry; one absent
token when only the log is left), the log's expiry, then six tokens per log entry. A token
is a LEB128 header ``h`` and its bytes: ``h = 0`` absent, ``4i`` word ``i`` of
:data:`WORDS`, ``4n+1`` ``n`` bytes of text, ``4n+2`` / ``4n+3`` a lowercase hex string of
``2n`` / ``2n-1`` digits packed into ``n`` bytes. Integers are stored relative to another
field (see :func:`pack`), so most of them take one or two bytes. Everything here is pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["MAGIC", "PACKED", "WORDS", "Packed", "pack", "unpack"]

MAGIC = b"\x01"
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
_HEX = re.compile(rb"[0-9a-f]+")
_ABSENT = b"\x00"


@dataclass
class Packed:
    """What one value holds: the record's fields as the scripts see them (None: only the log
    is left), each part's expiry in server milliseconds (None: none), the attempt log's
    ``aid|gen|action|verdict|detail|at`` entries, oldest first."""

    record: dict[bytes, bytes] | None
    record_expires: int | None = None
    log: list[bytes] = field(default_factory=list)
    log_expires: int | None = None


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 128:
        out.append(n % 128 + 128)
        n //= 128
    out.append(n)
    return bytes(out)


def token(value: bytes | None, plain: bool = False) -> bytes:
    """One value as a token (the Lua's ``tok``); a plain value (the result) is never packed."""
    if value is None:
        return _ABSENT
    if not plain:
        word = _WORD.get(value)
        if word:
            return _varint(word * 4)
        if value and _HEX.fullmatch(value):
            odd = len(value) % 2
            raw = bytes.fromhex(("0" if odd else "") + value.decode())
            return _varint(len(raw) * 4 + 2 + odd) + raw
    return _varint(len(value) * 4 + 1) + value


def untoken(blob: bytes, pos: int) -> tuple[bytes | None, int]:
    """The token at ``pos``: (value or None, next position). Raises ValueError."""
    h, shift = 0, 0
    while True:
        if pos >= len(blob):
            raise ValueError("truncated token")
        b = blob[pos]
        pos += 1
        h |= (b & 127) << shift
        shift += 7
        if b < 128:
            break
    if h == 0:
        return None, pos
    kind, n = h % 4, h // 4
    if kind == 0:
        if not 1 <= n <= len(WORDS):
            raise ValueError(f"unknown word {n}")
        return WORDS[n - 1], pos
    raw = blob[pos : pos + n]
    if len(raw) != n:
        raise ValueError("truncated token")
    pos += n
    if kind == 1:
        return raw, pos
    text = raw.hex().encode()
    return (text[1:] if kind == 3 else text), pos


def _rel(value: bytes | None, base: bytes | None) -> bytes | None:
    if value is None:
        return None
    if base is None:
        raise ValueError("relative value without its base")
    return b"%d" % (int(base) + int(value))


def _delta(value: bytes | int | None, base: bytes | None) -> bytes | None:
    if value is None:
        return None
    assert base is not None
    return b"%d" % (int(value) - int(base))


def unpack(blob: bytes, log: bool = True) -> Packed:
    """Decode a stored value (the Lua's ``unpack_value`` then ``decode_log``; without
    ``log``, its attempt log is not read). Raises ValueError."""
    if blob[:1] != MAGIC:
        raise ValueError("not a packed settle value")
    value, pos = untoken(blob, 1)
    rec: dict[bytes, bytes] | None = None
    record_expires = None
    if value is not None:
        fields: dict[bytes, bytes | None] = {b"fp": value}
        for name in PACKED[1:]:
            fields[name], pos = untoken(blob, pos)
        fields[b"updated"] = _rel(fields[b"updated"], fields[b"created"])
        fields[b"lease"] = _rel(fields[b"lease"], fields[b"updated"])
        value, pos = untoken(blob, pos)
        if value is not None:
            record_expires = int(_rel(value, fields[b"updated"]) or b"")
        rec = {k: v for k, v in fields.items() if v is not None}
    lexp, pos = untoken(blob, pos)
    base = rec.get(b"created") if rec is not None else b"0"
    log_expires = int(_rel(lexp, base) or b"") if lexp is not None else None
    if not log:  # the record alone (the Lua's load_record with lazy: no decode_log)
        return Packed(rec, record_expires, [], log_expires)
    aid, gen = b"", b""
    at: bytes | None = b"0"
    if rec is not None:
        aid, gen, at = rec.get(b"aid", b""), rec.get(b"gen", b""), rec.get(b"created")
    entries = []
    while pos < len(blob):
        e: list[bytes | None] = []
        for _ in range(6):
            value, pos = untoken(blob, pos)
            e.append(value)
        aid = e[0] if e[0] is not None else aid
        gen = e[1] if e[1] is not None else gen
        at = _rel(e[5], at)
        entries.append(b"|".join([aid, gen, e[2] or b"", e[3] or b"", e[4] or b"", at or b""]))
    return Packed(rec, record_expires, entries, log_expires)


def pack(p: Packed) -> bytes:
    """Encode a value (the Lua's ``save``): ``updated`` relative to ``created``, ``lease``
    and the record's expiry to ``updated``; in the log, ``aid`` and ``gen`` absent when equal
    to the previous entry's (the first one's previous: the record's aid, gen and created),
    ``at`` relative to the previous entry's, the log's expiry to the record's ``created``
    (absolute when there is no record)."""
    out = [MAGIC]
    rec = p.record
    aid, gen, at = b"", b"", b"0"
    if rec is not None:
        stored = [rec.get(f) for f in PACKED]
        stored[8] = _delta(rec.get(b"updated"), rec.get(b"created"))
        stored[9] = _delta(rec.get(b"lease"), rec.get(b"updated"))
        out += [token(v, f == b"result") for f, v in zip(PACKED, stored, strict=True)]
        out.append(token(_delta(p.record_expires, rec.get(b"updated"))))
        aid, gen, at = rec.get(b"aid", b""), rec.get(b"gen", b""), rec.get(b"created", b"0")
    else:
        out.append(_ABSENT)
    if p.log:
        out.append(token(_delta(p.log_expires, rec.get(b"created") if rec is not None else b"0")))
    else:
        out.append(_ABSENT)
    for entry in p.log:
        e = entry.split(b"|", 5)
        out.append(_ABSENT if e[0] == aid else token(e[0]))
        out.append(_ABSENT if e[1] == gen else token(e[1]))
        out += [token(v) for v in e[2:5]]
        out.append(token(_delta(e[5], at)))
        aid, gen, at = e[0], e[1], e[5]
    return b"".join(out)
