"""Encoding of what is stored (results, failures) and decoding of script replies.

A core script's reply is the runtime's one shape with the body ``quarantine_id, payload``
(``[code, detail, now_ms, quarantine_id, payload]``, see ``lua/_lib.lua``);
redis-py hands strings over as bytes. Everything here is pure.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

import pydantic_core
from pydantic import BaseModel

from settle._runtime.calls import parse_reply as runtime_reply
from settle._text import as_text
from settle.errors import CorruptRecord, FingerprintError, ResultTooLarge
from settle.models import (
    Action,
    AttemptObservation,
    CurrentSnapshot,
    OperationRecord,
    PresentedTuple,
    QuarantinedPayload,
    QuarantineEntry,
    QuarantineHeader,
    QuarantineKind,
    Resolution,
    State,
    StoredFailure,
    _trusted,
    ms_to_datetime,
    us_to_datetime,
)

__all__ = [
    "RECORD_FIELDS",
    "AsJson",
    "Reply",
    "decode_attempts",
    "decode_quarantine_entry",
    "decode_quarantine_header",
    "decode_record",
    "digest",
    "encode_failure",
    "encode_result",
    "parse_reply",
    "repeated_key",
]


#: The record's fields in the order the scripts return them (``FIELDS`` in lua/_lib.lua).
RECORD_FIELDS = (
    "op",
    "fp",
    "fpv",
    "bind",
    "gen",
    "ver",
    "state",
    "n",
    "created",
    "updated",
    "lease",
    "aid",
    "reason",
    "result",
    "rdig",
)


class Reply(NamedTuple):
    """Built on every script call: a named tuple is built in a third of a frozen
    dataclass's time (which sets each field through ``object.__setattr__``)."""

    code: str
    detail: str
    now_ms: int
    quarantine_id: str
    payload: list[Any]
    dropped: int = 0  # settlements: unresolved entries quarantine_maxlen pushed out
    repeated: bool = False  # settlements: the quarantine id is an earlier entry's


def parse_reply(raw: Any) -> Reply:
    """The core's body of the one reply shape: ``quarantine_id, payload`` (and, from a
    settlement, the count of unresolved quarantine entries its ``quarantine_maxlen`` dropped,
    then 1 when its quarantine id is an earlier entry's: the same rejected response again)."""
    if type(raw) is list and 5 <= len(raw) <= 7:  # every reply of a core script
        try:
            code, detail, now_ms, qid, payload, *rest = raw
            # as_text inline for the bytes hiredis hands back (a call per value otherwise)
            return Reply(
                code.decode() if type(code) is bytes else as_text(code),
                detail.decode() if type(detail) is bytes else as_text(detail),
                int(now_ms),
                qid.decode() if type(qid) is bytes else as_text(qid),
                list(payload or []),
                int(rest[0]) if rest else 0,
                len(rest) > 1 and int(rest[1]) == 1,
            )
        except (TypeError, ValueError, UnicodeDecodeError):
            pass  # the general path below raises what it raises for this reply
    reply = runtime_reply(raw)
    if len(reply.body) not in (2, 3, 4):
        reply = runtime_reply(raw, body=2)  # raises the typed error for a foreign shape
    qid, payload, *rest = reply.body
    try:
        dropped = int(rest[0]) if rest else 0
        repeated = len(rest) > 1 and int(rest[1]) == 1
        return Reply(
            reply.code,
            reply.detail,
            reply.now_ms,
            as_text(qid),
            list(payload or []),
            dropped,
            repeated,
        )
    except (TypeError, ValueError, UnicodeDecodeError) as exc:
        raise CorruptRecord(f"script reply cannot be decoded: {exc}") from exc


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _refuse_constant(name: str) -> Any:
    raise ValueError(name)


def _non_finite(data: bytes) -> str | None:
    """The first NaN / Infinity / -Infinity token in pydantic's JSON, if any (a string that
    merely contains the word is not one)."""
    if b"NaN" not in data and b"Infinity" not in data:  # the common case, in C
        return None
    try:
        json.loads(data, parse_constant=_refuse_constant)
    except ValueError as exc:
        return str(exc)
    return None


@dataclass(frozen=True, slots=True)
class AsJson:
    """A result to store as JSON even when it is ``bytes``, which :func:`encode_result`
    otherwise stores as they are: the decorator's result whose declared type is not exactly
    ``bytes`` (``bytes | None``, ``Any``...), so that its replay validates it back."""

    value: Any


#: How :func:`repeated_key` walks a value of each type: past it (a scalar), into a model,
#: into a mapping's values, a dataclass's fields, or a list's (tuple's, set's) items, as
#: pydantic stores each one. Filled in per type on first sight (:func:`_walk_of`), so that a
#: scalar of any type (a datetime, a Decimal, an enum) is stepped over at the cost of a look-up.
_LEAF, _MODEL, _MAPPING, _DATACLASS, _ITEMS = range(5)
_WALK: dict[type, int] = {
    **dict.fromkeys((str, int, float, bool, type(None), bytes), _LEAF),
    dict: _MAPPING,
    list: _ITEMS,
    tuple: _ITEMS,
}
#: Types remembered at most (a program that makes model classes on the fly).
_WALK_MAX = 4096


def _walk_of(kind: type) -> int:
    if issubclass(kind, BaseModel):
        walk = _MODEL
    elif issubclass(kind, Mapping):
        walk = _MAPPING  # an OrderedDict, a defaultdict
    elif dataclasses.is_dataclass(kind):
        walk = _DATACLASS
    elif issubclass(kind, list | tuple | set | frozenset | deque):
        walk = _ITEMS
    else:
        walk = _LEAF  # a str subclass, a datetime, an enum...
    if len(_WALK) < _WALK_MAX:
        _WALK[kind] = walk
    return walk


def repeated_key(value: Any) -> str | None:
    """Where ``value``'s stored form (by field name) would name a key twice, as
    ``Model.field``, or None: a model that keeps extras (``extra="allow"``) built from an
    answer that held both a field's alias and its name keeps the name as an extra, and
    dumped by name the field and the extra are one key twice. No JSON reading gives that
    model back (a parser keeps one of the two). Models are looked for wherever pydantic
    stores one (in models, mappings, dataclasses, lists, tuples, sets), in a walk that
    steps over scalars by their type (:data:`_WALK`): a fraction of the encoding's time."""
    kind = type(value)
    walk = _WALK.get(kind)
    if walk is None:
        walk = _walk_of(kind)
    items: Any
    if walk == _ITEMS:
        items = value
    elif walk == _MAPPING:
        items = value.values()
    elif walk == _LEAF:
        return None
    elif walk == _DATACLASS:
        items = [getattr(value, f.name) for f in dataclasses.fields(value)]
    else:
        extra = value.__pydantic_extra__
        if extra:
            # The class's own map (``model_fields`` is the same, through a descriptor).
            fields = kind.__pydantic_fields__
            for key in extra:
                field = fields.get(key)
                if field is not None and not field.exclude:
                    return f"{kind.__qualname__}.{key}"
            items = (*value.__dict__.values(), *extra.values())
        else:
            items = value.__dict__.values()
    walks = _WALK
    for item in items:
        if walks.get(type(item)) != _LEAF:
            found = repeated_key(item)
            if found is not None:
                return found
    return None


def encode_result(
    result: Any,
    limit: int,
    operation_id: str,
    what: str = "result",
    *,
    repeated: bool = False,
) -> bytes:
    """Serialize a result with pydantic; ``bytes`` pass through unchanged (unless wrapped
    in :class:`AsJson`), and so do ``bytearray`` and ``memoryview``, stored as the bytes
    they hold (a replay reads ``bytes`` back). Bytes inside a result are stored as UTF-8
    text, pydantic's JSON default, which is how a model or a dataclass reads them back on
    replay (a model that sets ``ser_json_bytes`` keeps its own setting both ways); bytes
    that are not UTF-8 cannot be, and are refused. A model is stored by field name, its
    computed fields left out, so that its replay validates it back (a replay reads a field
    by name or by alias, so a result stored by alias before still replays). NaN and the
    infinities have no JSON form and are refused, as they are in requests. So is a result
    whose stored form would name a key twice (:func:`repeated_key`: a replay would read
    one of the two values into the field), unless ``repeated`` (the decorator, whose paid
    call already ran: it stores the result, and its first call and every replay refuse
    it, docs/outbound-calls.md). A refused result writes nothing (it would be stored as
    invalid JSON, or replayed as something else). ``what`` names it in the errors:
    :func:`encode_failure` stores a failure through here too."""
    if isinstance(result, bytes | bytearray | memoryview):
        data = bytes(result)
    else:
        if isinstance(result, AsJson):
            result = result.value
        try:
            # In the form pydantic validates back (a replay reads it into the declared
            # type): fields by name, which a model reads whatever its aliases (a
            # validation_alias, a serialization_alias); computed fields left out (a model
            # that forbids extras refuses them); a Json field as its JSON text.
            data = pydantic_core.to_json(
                result, inf_nan_mode="constants", by_alias=False, round_trip=True
            )
        except pydantic_core.PydanticSerializationError as exc:
            if "invalid utf-8 sequence" in str(exc):  # bytes; a lone surrogate in a str is not
                raise FingerprintError(
                    "result holds bytes that are not UTF-8 text, which have no JSON form: "
                    "return them alone from a function declared -> bytes (stored as they "
                    "are), or encode them (base64) into a str",
                    operation_id=operation_id,
                ) from exc
            raise FingerprintError(
                f"result cannot be serialized to JSON: {exc}", operation_id=operation_id
            ) from exc
        constant = _non_finite(data)
        if constant is not None:
            raise FingerprintError(
                f"{what} holds {constant}, which has no JSON form; store it as a string or None",
                operation_id=operation_id,
            )
        twice = None if repeated else repeated_key(result)
        if twice is not None:
            raise FingerprintError(
                f"{what} cannot be stored so that it reads back: {twice} is both a field and "
                "an extra (a model that allows extras, built from an answer that held the "
                "field's alias and its name), and its JSON would name that key twice. Drop "
                "the extra, or declare the model with extra='ignore'",
                operation_id=operation_id,
            )
    if len(data) > limit:
        raise ResultTooLarge(
            f"{what} is {len(data)} bytes, over the {limit}-byte limit; store a reference "
            "to it instead",
            operation_id=operation_id,
        )
    return data


#: The longest failure message stored whole, in characters. A longer one (a provider's HTML
#: error page quoted in the exception) is cut to it by every worker, whatever its
#: ``max_result_bytes``: the stored failure is the same bytes from every worker, so the same
#: decline settled again by a worker with another cap is absorbed, not quarantined as a
#: conflicting settlement. 2048 characters are at most ~12 KiB of JSON (a control character
#: is written as ``\uXXXX``).
MESSAGE_MAX = 2048
#: The shorter cuts, tried in turn, of a failure that does not fit a small cap with a message
#: of ``MESSAGE_MAX`` characters (or its whole shorter message): fixed lengths, so that the
#: workers whose caps take the same cut store the same bytes.
_SHORTER_CUTS = (1024, 512, 256, 128, 64, 32, 16, 0)


def encode_failure(error: BaseException | StoredFailure | Any, limit: int, op: str) -> bytes:
    """Turn an exception (or a failure description) into a stored failure. Data with no
    JSON form (an arbitrary object, also as an exception's ``settle_data``) is refused with
    :class:`FingerprintError`, as a result's is: nothing is written. A message longer than
    :data:`MESSAGE_MAX` characters is cut to it (:func:`_cut`)."""
    try:
        if isinstance(error, StoredFailure):
            failure = error
        elif isinstance(error, BaseException):
            kind = type(error)
            data = getattr(error, "settle_data", None)
            failure = StoredFailure(
                error_type=f"{kind.__module__}.{kind.__qualname__}",
                message=_message(error),
                data=data,
            )
        elif isinstance(error, BaseModel):
            failure = StoredFailure(
                error_type=type(error).__name__, message="", data=error.model_dump(mode="json")
            )
        else:
            failure = StoredFailure(error_type="failure", message="", data=error)
        dumped = failure.model_dump(mode="json")
    # PydanticSerializationError: an unknown object; ValueError: data that nests past
    # pydantic's depth limit or refers to itself (as a result's is, in encode_result).
    except (pydantic_core.PydanticSerializationError, ValueError) as exc:
        raise FingerprintError(
            f"the failure cannot be serialized to JSON: {exc}; give fail() an exception, a "
            "model or plain JSON data",
            operation_id=op,
        ) from exc
    message = dumped.get("message")
    if not isinstance(message, str):
        return encode_result(dumped, limit, op, "failure")
    try:
        if len(message) <= MESSAGE_MAX:
            return encode_result(dumped, limit, op, "failure")
        return encode_result(_cut(dumped, message, MESSAGE_MAX, ""), limit, op, "failure")
    except ResultTooLarge:
        shortened = _shortened(dumped, message, limit, op)
        if shortened is None:
            raise
        return shortened


def _cut(dumped: dict[str, Any], message: str, n: int, why: str) -> dict[str, Any]:
    """The failure ``dumped`` with its message's first ``n`` characters and a note that says
    how long it was (and ``why``, when a cap asked for a shorter cut)."""
    return {
        **dumped,
        "message": f"{message[:n]} [settle: message cut from {len(message)} characters{why}]",
    }


def _shortened(dumped: dict[str, Any], message: str, limit: int, op: str) -> bytes | None:
    """The failure ``dumped`` with its message cut to fit ``limit``: the longest of
    :data:`_SHORTER_CUTS` that fits, or None when none does (its data is too large). A
    failure is the function's definite answer (a decline): refused whole for a long message
    (a provider's HTML error page), it was lost, the operation left provisional, and the
    next call ran the function again. Its type and data are kept whole; the message keeps
    its beginning and says how long it was. Workers with caps this small may store other
    cuts of the same decline (docs/outbound-calls.md)."""
    below = min(len(message), MESSAGE_MAX)
    for n in (n for n in _SHORTER_CUTS if n < below):
        failure = _cut(dumped, message, n, " to fit max_result_bytes")
        try:
            return encode_result(failure, limit, op, "failure")
        except ResultTooLarge:
            continue
    return None


def _message(error: BaseException) -> str:
    """An exception's text for its stored failure. An exception whose ``__str__`` raises is
    still the function's definite answer: it is stored (with a placeholder text, as
    ``traceback`` prints it), never left to escape the settlement with the record pending."""
    try:
        return str(error)
    except Exception:  # noqa: BLE001 - any error of a user's __str__, whatever it is
        return f"<exception str() failed: {type(error).__qualname__}>"


def _fields(flat: Sequence[Any]) -> dict[str, Any]:
    it = iter(flat)
    return {as_text(k): v for k, v in zip(it, it, strict=True)}


#: A record's state as the scripts send it (bytes) and as the reference model does (str).
_STATES: dict[Any, State] = {
    **{s.value.encode(): s for s in State},
    **{s.value: s for s in State},
}


def _hexed(value: Any) -> str:
    """A digest or attempt id as the scripts reply with it (settle/_core/layout.py
    ``hexed``): the bytes of its hex digits, or ``[text]``."""
    if isinstance(value, list):
        return as_text(value[0])
    return bytes(value).hex()


def _not_int(value: Any) -> int:
    """A record row's number that is not an integer reply: the scripts reply every number of
    a row as a Redis integer (``replied`` in settle/lua/_lib.lua), so text, a float or a bool
    there is not a row of ours (``int()`` would read ``b"7"``, ``7.9`` or ``True``)."""
    raise TypeError(f"an integer is due in a record row, not {type(value).__name__}")


def decode_record(row: Sequence[Any], now_ms: int) -> OperationRecord:
    """Decode a record row (values in RECORD_FIELDS order) into its effective state.

    The row comes from our own scripts, which checked it, so the model is built without a
    second validation (this runs on every call).
    """
    if len(row) != len(RECORD_FIELDS):
        raise CorruptRecord(f"record row has {len(row)} fields, expected {len(RECORD_FIELDS)}")
    op, fp, fpv, bind, gen, ver, state_, n, created, updated, lease_, aid, reason_, result, rdig = (
        row
    )
    try:
        state = _STATES.get(state_) or State(as_text(state_))
        reason = None if reason_ is None else as_text(reason_)
        lease = None if lease_ is None else lease_ if type(lease_) is int else _not_int(lease_)
        # rule: L1 (every reader: get, the CLI, the replies of every script)
        if state is State.PENDING and lease is not None and lease <= now_ms:
            state, reason = State.PROVISIONAL, "lease_expired"
        # as_text and _hexed inline for the bytes hiredis hands back (this runs on every
        # call, twice for a new key: a function call per field otherwise)
        return _trusted(
            OperationRecord,
            {
                "operation_id": op.decode() if type(op) is bytes else as_text(op),
                "fingerprint": fp.hex() if type(fp) is bytes else _hexed(fp),
                "fingerprint_version": fpv if type(fpv) is int else _not_int(fpv),
                "binding": bind.decode() if type(bind) is bytes else as_text(bind),
                "generation": gen if type(gen) is int else _not_int(gen),
                "version": ver if type(ver) is int else _not_int(ver),
                "state": state,
                "reason": reason,
                "lease_expires_at": None if lease is None else ms_to_datetime(lease),
                "result": None if result is None else bytes(result),
                "result_digest": (
                    None if rdig is None else rdig.hex() if type(rdig) is bytes else _hexed(rdig)
                ),
                "attempt_id": (
                    None if aid is None else aid.hex() if type(aid) is bytes else _hexed(aid)
                ),
                "reservations": n if type(n) is int else _not_int(n),
                "created_at": ms_to_datetime(
                    created if type(created) is int else _not_int(created)
                ),
                "updated_at": ms_to_datetime(
                    updated if type(updated) is int else _not_int(updated)
                ),
            },
        )
    except (TypeError, ValueError, OverflowError, UnicodeDecodeError) as exc:
        raise CorruptRecord(f"record cannot be decoded: {exc}") from exc


def decode_attempts(entries: Sequence[Any]) -> list[AttemptObservation]:
    out = []
    for raw in entries:
        fields = as_text(raw).split("|")
        if len(fields) != 6:
            raise CorruptRecord(f"attempt log entry has {len(fields)} fields, expected 6")
        aid, gen, action, verdict, detail, at = fields
        out.append(
            AttemptObservation(
                attempt_id=aid,
                generation=int(gen) if gen else None,
                action=action,
                verdict=verdict,
                detail=detail or None,
                at=ms_to_datetime(int(at)),
            )
        )
    return out


def decode_resolution(raw: Any) -> Resolution | None:
    if not raw:
        return None
    data = json.loads(as_text(raw))
    return Resolution(note=data["note"], at=ms_to_datetime(int(data["at"])))


def decode_quarantine_entry(
    shard: int, entry_id: Any, flat: Sequence[Any], res: Any
) -> QuarantineEntry:
    """One quarantine stream entry and its resolution. An entry settle cannot read (fields
    missing or not what settle writes, a kind or action this version does not know, a
    resolution too deeply nested to parse) is a :class:`CorruptRecord` naming it, as
    ``shard/id``."""
    try:
        return _quarantine_entry(shard, entry_id, flat, res)
    # UnicodeDecodeError is a ValueError; RecursionError is json's answer to a resolution
    # nested deeper than the interpreter's stack (another program wrote it).
    except (KeyError, TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise _undecodable(shard, entry_id, exc) from exc


def _undecodable(shard: int, entry_id: Any, exc: Exception) -> CorruptRecord:
    """The error of an entry settle cannot read, naming it as ``shard/id``."""
    ident = entry_id.decode("ascii", "replace") if isinstance(entry_id, bytes) else entry_id
    return CorruptRecord(f"quarantine entry {shard}/{ident} cannot be decoded: {_problem(exc)}")


def _problem(exc: Exception) -> str:
    """Why an entry cannot be decoded, in one line (what :func:`_undecodable` says)."""
    return f"no field {exc}" if isinstance(exc, KeyError) else _first_line(exc)


@dataclass(frozen=True, slots=True)
class UndecodableEntry:
    """A quarantine stream entry this settle version cannot read (another version or
    another program wrote it), as the console lists it: where it is, its operation id when
    that field is text, whether a resolution is stored for it, and why it cannot be read.
    ``at`` is the stream id's millisecond (the entry's own time field may be what failed)."""

    id: str
    shard: int
    at: datetime
    operation_id: str | None
    resolved: bool
    problem: str
    #: The stored fields as they are, each value's first :data:`MARK_VALUE_BYTES` bytes
    #: read as UTF-8 (a byte that is none shown as ``\\xNN``): what a reader can still see.
    fields: tuple[tuple[str, str], ...] = ()

    @property
    def ref(self) -> str:
        return f"{self.shard}/{self.id}"


#: How much of each stored value an :class:`UndecodableEntry` keeps (a payload may be large).
MARK_VALUE_BYTES = 512


def _as_stored(flat: Sequence[Any]) -> tuple[tuple[str, str], ...]:
    """A stream entry's field/value pairs as text, never failing (see ``fields`` above)."""

    def text(value: Any) -> str:
        raw = value if isinstance(value, bytes) else str(value).encode("utf-8", "replace")
        shown = raw[:MARK_VALUE_BYTES].decode("utf-8", "backslashreplace")
        return shown + (f" ... ({len(raw)} bytes)" if len(raw) > MARK_VALUE_BYTES else "")

    pairs = list(flat)
    return tuple((text(pairs[i]), text(pairs[i + 1])) for i in range(0, len(pairs) - 1, 2))


_Read = TypeVar("_Read")


def or_mark(
    decode: Callable[[int, Any, Any, Any], _Read],
) -> Callable[..., _Read | UndecodableEntry]:
    """``decode`` (:func:`decode_quarantine_entry`, :func:`decode_quarantine_header`), with
    an :class:`UndecodableEntry` for an entry it refuses, so that one such entry does not
    hide the others of a listing (the console's pages)."""

    def decoded(
        shard: int, entry_id: Any, flat: Sequence[Any], res: Any
    ) -> _Read | UndecodableEntry:
        try:
            return decode(shard, entry_id, flat, res)
        except CorruptRecord as exc:
            cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
            ident = as_text(entry_id)  # a stream id: Redis makes it, ASCII digits
            operation_id = None
            try:
                op = _fields(flat).get("op")
                operation_id = None if op is None else as_text(op)
            except (TypeError, ValueError):  # odd field count; an id that is no UTF-8
                pass
            return UndecodableEntry(
                id=ident,
                shard=shard,
                at=ms_to_datetime(int(ident.split("-")[0])),
                operation_id=operation_id,
                resolved=bool(res),
                problem=_problem(cause),
                fields=_as_stored(flat),
            )

    return decoded


def decode_quarantine_header(
    shard: int, entry_id: Any, flat: Sequence[Any], resolved: Any
) -> QuarantineHeader:
    """One header of a headers-only read (quarantine_read.lua, ARGV[9]): the entry's kind and
    time fields, and ``1`` when it is resolved. Undecodable as
    :func:`decode_quarantine_entry` says."""
    try:
        f = {k: as_text(v) for k, v in _fields(flat).items()}
        return QuarantineHeader(
            id=as_text(entry_id),
            shard=shard,
            kind=QuarantineKind(f["kind"]),
            at=_entry_time(f),
            resolved=bool(resolved),
        )
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise _undecodable(shard, entry_id, exc) from exc


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _quarantine_entry(shard: int, entry_id: Any, flat: Sequence[Any], res: Any) -> QuarantineEntry:
    raw = _fields(flat)
    payload = raw.pop("payload", b"")
    f = {k: as_text(v) for k, v in raw.items()}
    current = None
    if f.get("cstate"):
        current = CurrentSnapshot(
            state=State(f["cstate"]), generation=int(f["cgen"]), version=int(f["cver"])
        )
    return QuarantineEntry(
        id=as_text(entry_id),
        shard=shard,
        operation_id=f["op"],
        kind=QuarantineKind(f["kind"]),
        action=Action(f["action"]),
        presented=PresentedTuple(
            fingerprint=f["fp"],
            fingerprint_version=int(f["fpv"]),
            binding=f["bind"],
            generation=int(f["gen"]),
            expected_version=int(f["ev"]) if f.get("ev") else None,
        ),
        current=current,
        payload=QuarantinedPayload(data=bytes(payload), size=int(f["psize"]), sha256=f["pdig"]),
        reason=f.get("reason") or None,
        attempt_id=f["aid"],
        at=_entry_time(f),
        resolution=decode_resolution(res),
    )


def _entry_time(f: dict[str, str]) -> datetime:
    """An entry's server time: ``us`` (µs), or ``at`` (ms) of an entry written before."""
    return us_to_datetime(int(f["us"])) if "us" in f else ms_to_datetime(int(f["at"]))
