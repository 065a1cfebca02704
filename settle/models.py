"""The values settle hands to its users: records, reservations, verdicts, quarantine entries.

All are immutable pydantic models. Results and failures are opaque bytes to Redis; here they
are decoded on demand with pydantic (:meth:`OperationRecord.value`).
"""

from __future__ import annotations

import json
import json.scanner
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import lru_cache
from typing import Any, TypeVar, cast, get_args

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError
from pydantic_core.core_schema import ErrorType

from settle.errors import InvalidInput

__all__ = [
    "Action",
    "AttemptObservation",
    "CurrentSnapshot",
    "InProgress",
    "OperationRecord",
    "PresentedTuple",
    "QuarantineEntry",
    "QuarantineHeader",
    "QuarantineKind",
    "QuarantinedPayload",
    "Renewal",
    "Replay",
    "Reservation",
    "Reserved",
    "Resolution",
    "Settlement",
    "State",
    "StoredFailure",
    "TrimResult",
    "Verdict",
]

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class State(StrEnum):
    """Where an operation stands. ``completed`` and ``failed`` are absorbing."""

    PENDING = "pending"
    PROVISIONAL = "provisional"
    COMPLETED = "completed"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in (State.COMPLETED, State.FAILED)


class Verdict(StrEnum):
    """What became of a settlement (a response presented for an attempt)."""

    ACCEPTED = "accepted"
    ABSORBED = "absorbed"
    QUARANTINED = "quarantined"


class Action(StrEnum):
    COMPLETE = "complete"
    FAIL = "fail"
    MARK_PROVISIONAL = "mark_provisional"


class QuarantineKind(StrEnum):
    UNKNOWN_OPERATION = "unknown_operation"
    MISBOUND = "misbound"
    STALE_GENERATION = "stale_generation"
    VERSION_CONFLICT = "version_conflict"
    CONFLICTING_SETTLEMENT = "conflicting_settlement"


_FROZEN = ConfigDict(frozen=True, ser_json_bytes="base64", val_json_bytes="base64")


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@lru_cache(maxsize=64)
def ms_to_datetime(ms: int) -> datetime:
    """Exact, and cached: one record's times repeat across the replies of one operation
    (``created_at`` = ``updated_at`` on a reserve, ``created_at`` again on its settlement),
    and a datetime is immutable. A time no datetime can hold raises ValueError (a
    corrupt record: the decoders turn it into ``CorruptRecord``). The milliseconds are
    passed by position (``timedelta``'s fourth parameter): by keyword its arguments go
    through a dict first, about a quarter of its cost."""
    try:
        return _EPOCH + timedelta(0, 0, 0, ms)
    except OverflowError as exc:
        raise ValueError(f"time {ms} ms is out of range") from exc


def us_to_datetime(us: int) -> datetime:
    """Exact (no float rounding): entries microseconds apart must stay in order. A time
    no datetime can hold raises ValueError."""
    try:
        return _EPOCH + timedelta(microseconds=us)
    except OverflowError as exc:
        raise ValueError(f"time {us} µs is out of range") from exc


def _trusted(cls: type[M], values: dict[str, Any]) -> M:
    """``cls.model_construct(**values)`` for values that name every field of ``cls`` and
    come from settle's own decoding (no validation), without its per-field alias and
    default handling: the hot path builds several models per call. The result is the same
    object ``model_construct`` builds (fields in declaration order, every field set). A
    ``values`` dict already in declaration order becomes the model's own ``__dict__``:
    every caller passes a fresh literal and keeps no reference to it."""
    cached = _FIELDS.get(cls)
    if cached is None:
        # One entry, stored whole: a thread switched in between two stores would find the
        # first without the second (a KeyError on the first concurrent calls of a class).
        names = tuple(cls.model_fields)
        cached = _FIELDS[cls] = (names, frozenset(names))
    fields, field_set = cached
    model = cls.__new__(cls)
    # The hot path's callers list every field in declaration order: their dict is the one.
    _setattr(
        model, "__dict__", values if tuple(values) == fields else {k: values[k] for k in fields}
    )
    # A copy of a set is a copy of its table: no field hashed and inserted again.
    _setattr(model, "__pydantic_fields_set__", set(field_set))
    _setattr(model, "__pydantic_extra__", None)
    _setattr(model, "__pydantic_private__", None)
    return model


_setattr = object.__setattr__
#: Per model class: its field names in declaration order, and the same as a set.
_FIELDS: dict[type[BaseModel], tuple[tuple[str, ...], frozenset[str]]] = {}


@lru_cache(maxsize=256)
def _cached_adapter(type_: Any) -> TypeAdapter[Any]:
    return TypeAdapter(type_)


def _adapter(type_: Any) -> TypeAdapter[Any]:
    """Building a TypeAdapter costs tens of microseconds; replays reuse one per type."""
    try:
        return _cached_adapter(type_)
    except TypeError:  # an unhashable type expression
        return TypeAdapter(type_)


def _replayed(type_: Any, data: bytes) -> Any:
    """The one rule of what a stored result ``data`` is handed back as: the bytes as they
    are for ``bytes`` (a result completed as bytes is stored so, not as JSON), else the JSON
    validated into ``type_`` (a :class:`ValidationError` when it does not). What
    :meth:`OperationRecord.value` returns, what every replay of a decorated function returns,
    and what the decorator checks a first call's result by, so that it never returns what
    its replays would refuse."""
    if type_ is bytes:
        return data
    adapter, aliased, open_ = _reading(type_)
    if aliased or open_:
        # A key named twice (a model's field and an extra named like it, codec.repeated_key)
        # is stored only from a model with an alias, declared or held where any value goes:
        # no reading is the result stored, refused.
        _refuse_repeated_keys(data)
    if not aliased:
        return adapter.validate_json(data)  # one form, by name and by alias alike
    # Stored by field name (encode_result), or by alias by settle before this version: the
    # reading whose own form is the stored JSON, so that neither a field whose alias is
    # another field's name, nor an extra named like an alias, nor a default filled in for
    # a field stored under its alias, changes what a replay returns.
    first: ValidationError | None = None
    try:
        by_name = adapter.validate_json(data, by_alias=False, by_name=True)
    except ValidationError as exc:
        by_name, first = _NONE, exc
    else:
        if _is_form(adapter, by_name, data, by_alias=False):
            return by_name  # stored by name (encode_result): read back as it was
    # Stored by alias by settle before: a reading whose alias form is the stored JSON.
    try:
        by_alias = adapter.validate_json(data, by_alias=True, by_name=True)
    except ValidationError:
        by_alias = _NONE
    if by_alias is not _NONE and _is_form(adapter, by_alias, data, by_alias=True):
        return by_alias
    if first is not None:
        raise first
    return by_name  # neither form is exact (a validator that normalises): by name


def _reading(type_: Any) -> tuple[TypeAdapter[Any], bool, bool]:
    """What :func:`_replayed` reads a result of ``type_`` with: its adapter, and whether it
    is :func:`_aliased` and :func:`_open`, kept together by ``type_`` as each is kept in its
    own cache, so that a replay looks up one entry instead of three."""
    try:
        return _cached_reading(type_)
    except TypeError:  # an unhashable type expression: each built again, as before
        return _adapter(type_), _aliased(type_), _open(type_)


@lru_cache(maxsize=256)
def _cached_reading(type_: Any) -> tuple[TypeAdapter[Any], bool, bool]:
    return _adapter(type_), _aliased(type_), _open(type_)


def _refuse_repeated_keys(data: bytes) -> None:
    """Raise a :class:`ValidationError` (``repeated_key``) when an object of the JSON
    ``data`` names a key twice (a parser keeps one of the two values)."""
    try:
        # json.loads(data, object_pairs_hook=_once), without a decoder made on every call,
        # nor its two Python frames around the C scanner (``decode``, ``raw_decode``): the
        # scanner reads the first value, as they do, and a key named twice in it raises
        # there, before they would look at what follows it (extra data only makes them
        # raise ValueError, as a failed scan does)
        text = data if isinstance(data, str) else data.decode(_encoding(data), "surrogatepass")
        start = _WHITESPACE.match(text)  # always matches (maybe nothing)
        _scan_once(text, start.end() if start else 0)
    except _RepeatedKey:
        raise ValidationError.from_exception_data(
            "stored result",
            [{"type": PydanticCustomError("repeated_key", _REPEATED), "loc": (), "input": None}],
        ) from None
    except (StopIteration, ValueError):  # StopIteration: no JSON value where it starts
        pass  # not JSON: validation says what is wrong with it


def _encoding(data: bytes) -> str:
    """``json.detect_encoding(data)``: UTF-8 at once for what settle stores (an object or
    an array, its second byte not zero), where that function answers UTF-8 too."""
    if data[:1] in (b"{", b"[") and data[1:2] != b"\x00":
        return "utf-8"
    return json.detect_encoding(data)


class _RepeatedKey(Exception):
    pass


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise _RepeatedKey
    return found


#: The decoder of :func:`_refuse_repeated_keys` (a JSON decoder keeps no state between
#: calls: ``json.loads`` shares one too).
_ONCE = json.JSONDecoder(object_pairs_hook=_once)
#: Its C scanner (what ``JSONDecoder`` makes for itself as ``scan_once``; typeshed's
#: stub of ``make_scanner`` names no decoder as its argument).
_scan_once = json.scanner.make_scanner(cast("Any", _ONCE))
#: What ``JSONDecoder.decode`` skips before the value (``json.decoder.WHITESPACE``).
_WHITESPACE = re.compile(r"[ \t\n\r]*")

_REPEATED = (
    "the stored JSON names a key twice (a model's field and an extra named like it), "
    "so no reading of it is the result stored"
)

#: No reading (the read failed).
_NONE: Any = object()


def _is_form(adapter: TypeAdapter[Any], value: Any, data: bytes, *, by_alias: bool) -> bool:
    """Whether ``value`` dumped as settle stores a result (by name, round trip), or as it
    stored one before (by alias, computed fields included), is the stored JSON ``data``."""
    try:
        again = adapter.dump_json(value, by_alias=by_alias, round_trip=not by_alias)
        return bool(_unordered(json.loads(again)) == _unordered(json.loads(data)))
    except Exception:  # noqa: BLE001 - no form to compare: not this one
        return False


def _unordered(value: Any) -> Any:
    """``value`` (parsed JSON) with every list in one order: a set's items are dumped in
    the order the process hashes them, which differs between the writer and the reader.
    The readings compared differ by which field took which key, never by order alone."""
    if isinstance(value, dict):
        return {key: _unordered(item) for key, item in value.items()}
    if isinstance(value, list):
        items = [_unordered(item) for item in value]
        return sorted(items, key=lambda item: json.dumps(item, sort_keys=True))
    return value


def _aliased(type_: Any) -> bool:
    """Whether a field anywhere in ``type_`` has an alias: only there do the stored form (by
    field name) and the form settle stored before (by alias) differ."""
    return _schema_has(type_, "alias")


def _open(type_: Any) -> bool:
    """Whether ``type_`` takes any value somewhere (``Any``, a bare ``dict`` or ``list``, the
    extras of a model that allows them): a function may return a model there that its
    declared type does not name."""
    return _schema_has(type_, "any")


def _schema_has(type_: Any, what: str) -> bool:
    try:
        return _cached_schema_has(type_, what)
    except TypeError:  # an unhashable type expression
        return _holds(_adapter(type_).core_schema, _NODE_TESTS[what])


@lru_cache(maxsize=1024)
def _cached_schema_has(type_: Any, what: str) -> bool:
    return _holds(_adapter(type_).core_schema, _NODE_TESTS[what])


def _holds(node: Any, test: Callable[[dict[str, Any]], bool]) -> bool:
    """Whether a node of the core schema ``node`` passes ``test``."""
    if isinstance(node, dict):
        return test(node) or any(_holds(value, test) for value in node.values())
    if isinstance(node, list | tuple):
        return any(_holds(value, test) for value in node)
    return False


_NODE_TESTS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "alias": lambda node: (
        node.get("validation_alias") is not None or bool(node.get("serialization_alias"))
    ),
    "any": lambda node: node.get("type") == "any" or node.get("extra_fields_behavior") == "allow",
}


#: pydantic's messages that may quote the stored data, in words that do not: a tagged
#: union's names the tag it found, an application's validator says what it likes.
_QUOTING = {
    "union_tag_invalid": "Input tag found using {discriminator} does not match any of the "
    "expected tags: {expected_tags}",
    "value_error": "a validator refused it (value_error)",
    "assertion_error": "a validator's assertion failed (assertion_error)",
    "uuid_parsing": "Input should be a valid UUID",
    "repeated_key": _REPEATED,
}
_BUILT_IN = frozenset(get_args(ErrorType))


def _where_it_fails(exc: ValidationError, type_: Any) -> str:
    """What a stored result's validation error says, without the stored values pydantic's
    text quotes (``input_value=...``): the message is read, logged and recorded by others,
    a receipt's data is not theirs. A location names what ``type_`` declares (a field, a
    union's member) and the positions in a list; any other part is a key the data holds (a
    dict's, a field the model does not have) and reads ``<key>``. A message that may quote
    the data is said in settle's words (:data:`_QUOTING`). The error stays the
    ``__cause__``."""
    declared = _declared_names(type_)
    problems = []
    for e in exc.errors(include_input=False, include_url=False)[:3]:
        where = ".".join(
            str(part) if isinstance(part, int) or part in declared else "<key>" for part in e["loc"]
        )
        kind = e["type"]
        if kind in _QUOTING:
            said = _QUOTING[kind].format(**e.get("ctx", {}))
        elif kind in _BUILT_IN:
            said = e["msg"]
        else:  # an application's PydanticCustomError: its text is its own
            said = f"a validator refused it ({kind})"
        problems.append(f"{where or '(the result)'}: {said}")
    more = exc.error_count() - len(problems)
    return "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")


def _declared_names(type_: Any) -> frozenset[str]:
    """Every name ``type_``'s validation schema holds (its fields and their aliases, its
    unions' members and tags, its types' names, pydantic's ``[key]``): the parts of an
    error's location that are not the stored data's own."""
    names = {"[key]"}
    stack: list[Any] = [_adapter(type_).core_schema]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            names.add(node)
        elif isinstance(node, type):
            names.add(node.__name__)
        elif isinstance(node, dict):
            stack.extend(node)
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)
    return frozenset(names)


class Reservation(BaseModel):
    """The immutable tuple one attempt owns: ``(operation_id, fingerprint, binding, generation)``.

    ``attempt_id`` labels the attempt in the attempt log; it is not part of the check.
    """

    model_config = _FROZEN

    operation_id: str
    fingerprint: str
    fingerprint_version: int
    binding: str
    generation: int
    attempt_id: str


class StoredFailure(BaseModel):
    """A definite failure as it is stored and replayed."""

    # NaN and the infinities in ``data`` dump as themselves, not as null (pydantic's JSON
    # mode default for an ``Any`` field): ``fail()`` then refuses them as ``complete()``
    # refuses them in a result, instead of storing ``{"amount": null}`` for NaN.
    model_config = ConfigDict(**_FROZEN, ser_json_inf_nan="constants")

    error_type: str
    message: str
    data: Any = None


class OperationRecord(BaseModel):
    """The authoritative record of one operation, as read from Redis.

    ``state`` is the effective state: a pending record whose lease has passed reads as
    ``provisional`` with reason ``lease_expired``.
    """

    model_config = _FROZEN

    operation_id: str
    fingerprint: str
    fingerprint_version: int
    binding: str
    generation: int
    version: int
    state: State
    reason: str | None = None
    lease_expires_at: datetime | None = None
    result: bytes | None = None
    result_digest: str | None = None
    attempt_id: str | None = None
    reservations: int
    created_at: datetime
    updated_at: datetime

    def value(self, type_: type[T] | Any = Any) -> T:
        """The stored result (for ``completed``) validated into ``type_`` with pydantic;
        with ``bytes``, the stored bytes as they are (a result completed as ``bytes`` is
        stored so, as the decorator replays a function declared ``-> bytes``).

        Raises :class:`~settle.errors.InvalidInput` (a ``ValueError``) naming the operation
        when the record holds no result (another state: a failed record's failure is
        :attr:`failure`) or the result does not validate into ``type_``."""
        op = self.operation_id
        if self.state is not State.COMPLETED or self.result is None:
            what = (
                "its stored failure is .failure"
                if self.state is State.FAILED
                else "it has no result yet: reserve it again to replay it once it completed"
            )
            raise InvalidInput(
                f"operation {op!r} is {self.state.value}, not completed: {what}",
                operation_id=op,
            )
        try:
            return cast("T", _replayed(type_, self.result))
        except ValidationError as exc:
            raise InvalidInput(
                f"the stored result of operation {op!r} does not validate into {type_!r}: "
                f"{_where_it_fails(exc, type_)}",
                operation_id=op,
            ) from exc

    @property
    def failure(self) -> StoredFailure | None:
        """The stored failure, for ``failed`` records."""
        if self.state is not State.FAILED or self.result is None:
            return None
        return StoredFailure.model_validate_json(self.result)


class Reserved(BaseModel):
    """The caller owns a new attempt: run the operation, then settle ``reservation``."""

    model_config = _FROZEN

    reservation: Reservation
    record: OperationRecord
    takeover: str | None = None
    """Why a previous attempt was replaced: ``lease_expired`` or ``provisional``."""


class Replay(BaseModel):
    """The operation already settled; this is its stored outcome. Nothing was written."""

    model_config = _FROZEN

    record: OperationRecord

    @property
    def completed(self) -> bool:
        return self.record.state is State.COMPLETED

    def value(self, type_: type[T] | Any = Any) -> T:
        return cast("T", self.record.value(type_))

    @property
    def failure(self) -> StoredFailure | None:
        return self.record.failure


class InProgress(BaseModel):
    """Another attempt holds a live lease. Nothing was written."""

    model_config = _FROZEN

    operation_id: str
    generation: int
    lease_expires_at: datetime
    record: OperationRecord


class Renewal(BaseModel):
    """What a heartbeat found: the lease extended, or lost (``reason`` says why).

    A lost lease is never quarantined (a heartbeat is not a response), and the attempt must
    stop: its settlement will be quarantined unless it is still the current generation.
    Except when the lease only :meth:`lapsed`: nobody took the key over, so the attempt
    still owns it and runs on. With ``min_replicas``, a lost renewal no replica acknowledged
    carries no ``record`` (but for a lapsed lease): what the primary showed may not survive a
    failover.
    """

    model_config = _FROZEN

    renewed: bool
    reason: str | None = None
    lease_expires_at: datetime | None = None
    record: OperationRecord | None = None

    def lapsed(self, generation: int) -> bool:
        """Whether the lease of the attempt of ``generation`` only lapsed: not renewed
        (``lease_expired``) with the record still pending at that generation, so no newer
        attempt took the key over. Such an attempt is not lost, and is not stopped: its
        ``complete`` or ``fail`` is accepted (SPEC 2), where stopping it half-way would
        leave its effect uncertain and its retry would run it again. Its heartbeat beats on
        (the lease is not extended: a caller may take the key over now, and the next
        renewal then finds ``stale_generation``). The one home of this rule: the
        decorator's heartbeats and the HTTP middleware's all ask it."""
        record = self.record
        return (
            not self.renewed
            and self.reason == "lease_expired"
            and record is not None
            and record.generation == generation
        )


class Settlement(BaseModel):
    """The verdict on one settlement call and the authoritative record after it.

    ``record`` is None when the operation does not exist, and when the presented binding or
    fingerprint did not match (a misbound caller never sees another principal's record).
    """

    model_config = _FROZEN

    verdict: Verdict
    action: Action
    operation_id: str
    record: OperationRecord | None
    quarantine_id: str | None = None
    kind: QuarantineKind | None = None
    quarantine_repeated: bool = False
    """``QUARANTINED`` only: the same rejected response (the same attempt, action, payload
    digest and tuple) was quarantined before, and ``quarantine_id`` is that entry's: it
    stays one entry (SPEC 3), nothing was appended."""


class AttemptObservation(BaseModel):
    """One line of an operation's attempt log (kept apart from the outcome)."""

    model_config = _FROZEN

    attempt_id: str
    generation: int | None
    action: str
    verdict: str
    detail: str | None = None
    at: datetime


class PresentedTuple(BaseModel):
    model_config = _FROZEN

    fingerprint: str
    fingerprint_version: int
    binding: str
    generation: int
    expected_version: int | None = None


class CurrentSnapshot(BaseModel):
    model_config = _FROZEN

    state: State
    generation: int
    version: int


class QuarantinedPayload(BaseModel):
    """The rejected payload: its first bytes (up to the configured cap), size and SHA-256."""

    model_config = _FROZEN

    data: bytes
    size: int
    sha256: str

    @property
    def truncated(self) -> bool:
        return len(self.data) < self.size


class Resolution(BaseModel):
    model_config = _FROZEN

    note: str
    at: datetime


class TrimResult(BaseModel):
    """What ``quarantine.trim(...)`` deleted: entries (with their resolutions), and how many
    of them were unresolved (0 unless ``include_unresolved=True``)."""

    model_config = _FROZEN

    removed: int
    unresolved: int


class QuarantineEntry(BaseModel):
    """A rejected response, kept as evidence; resolving it adds a note and deletes nothing.

    ``id`` is the stream entry id; ``shard`` names the stream (one per shard).
    """

    model_config = _FROZEN

    id: str
    shard: int
    operation_id: str
    kind: QuarantineKind
    action: Action
    presented: PresentedTuple
    current: CurrentSnapshot | None
    payload: QuarantinedPayload
    reason: str | None = None
    attempt_id: str
    at: datetime
    resolution: Resolution | None = None

    @property
    def ref(self) -> str:
        """``shard/id``: names the entry unambiguously across shards."""
        return f"{self.shard}/{self.id}"


class QuarantineHeader(BaseModel):
    """What an entry is counted by, from ``quarantine.headers()``: its id, kind, time and
    whether it is resolved. Nothing else of the entry is read (no payload, operation or
    note): get the entry itself with ``quarantine.get(header.ref)``."""

    model_config = _FROZEN

    id: str
    shard: int
    kind: QuarantineKind
    at: datetime
    resolved: bool

    @property
    def ref(self) -> str:
        """``shard/id``, as :attr:`QuarantineEntry.ref`."""
        return f"{self.shard}/{self.id}"
