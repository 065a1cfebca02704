"""The rules of ``settle.progress`` with no I/O: plan each script call, decode each reply,
parse stream replies, decide what a delivery needs. The sync and async shells only run what
this plans (one core, two thin shells)."""

from __future__ import annotations

import dataclasses
import json
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, NoReturn

from settle._input import is_utf8
from settle._log import logger
from settle._runtime import Call, parse_reply
from settle._text import as_text
from settle.errors import BackendError, CorruptRecord, InvalidInput
from settle.progress._keys import ProgressKeys, StreamKeys
from settle.progress.errors import (
    InvalidDelivery,
    ProgressLost,
    ProviderReset,
    UnprovenListing,
    check_reason,
    recorded_reason,
)
from settle.progress.identity import (
    AttemptId,
    DeliveryId,
    EmissionId,
    ProviderScope,
    ReplayCursor,
    SettlementAuthority,
    check_name,
)
from settle.progress.identity import check_delivery as _delivery
from settle.progress.models import (
    DeferredDelivery,
    IntentKind,
    Progress,
    ProviderFloor,
    SettleIntent,
    SettlementOutcome,
    SettlementReceipt,
    check_kind,
)

__all__ = [
    "ConsumerOptions",
    "Disposition",
    "ProgressCore",
    "ProgressReply",
    "StreamEntry",
    "StreamVerdict",
    "parse_entries",
]


def _flat(values: Sequence[Any]) -> dict[str, str]:
    it = iter(values)
    return {as_text(k): as_text(v) for k, v in zip(it, it, strict=True)}


def _dt(ms: str | int) -> datetime:
    return datetime.fromtimestamp(int(ms) / 1000, tz=UTC)


# Identities are never taken as plain strings: a delivery id passed where an emission id
# belongs (or the reverse) is the mix-up SPEC 10 forbids, so it is refused, not converted.
def _emission(value: object) -> EmissionId:
    if isinstance(value, EmissionId):
        return value
    raise InvalidDelivery(f"expected an EmissionId, got {type(value).__name__}")


def _attempt(value: object) -> AttemptId:
    if isinstance(value, AttemptId):
        return value
    raise InvalidDelivery(f"expected an AttemptId, got {type(value).__name__}")


def _scope(value: object) -> ProviderScope:
    if not isinstance(value, ProviderScope):
        raise InvalidDelivery(f"expected a ProviderScope, got {type(value).__name__}")
    return value


def check_apply(effect: object, fields: object) -> dict[str, bytes]:
    """``apply``'s effect and fields, checked before anything is sent: a bad one would
    otherwise come out of the effect's call after ``begin`` claimed the emission."""
    if not callable(effect):
        raise InvalidDelivery(
            f"effect must be a callable taking an EffectContext, got {type(effect).__name__}"
        )
    if fields is not None and not isinstance(fields, Mapping):
        raise InvalidDelivery(
            f"fields must be a mapping of field name to bytes, got {type(fields).__name__}"
        )
    return dict(fields or {})


def _cli(arg: str, *, quote: bool = False) -> str:
    """``arg`` as redis-cli reads it back exactly (one argument of a command the operator
    runs as written): bare when it is plain, else in single quotes (everything literal),
    else, when it holds a single quote or ends in a backslash, in double quotes with
    backslashes and double quotes escaped."""
    if not quote and arg and not any(c.isspace() or c in "'\"\\" for c in arg):
        return arg
    if "'" not in arg and not arg.endswith("\\"):
        return f"'{arg}'"
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def scope_json(scope: ProviderScope) -> str:
    return json.dumps(
        {"stream": scope.stream, "group": scope.group, "incarnation": scope.incarnation},
        sort_keys=True,
    )


@dataclass(frozen=True, slots=True)
class ProgressReply:
    code: str
    detail: str
    progress: Progress


@dataclass(frozen=True, slots=True)
class StreamEntry:
    delivery: DeliveryId
    fields: dict[str, bytes]  # field names as text, values exactly as stored


@dataclass(frozen=True, slots=True)
class StreamVerdict:
    outcome: SettlementOutcome
    owner: str | None
    delivery_count: int
    acknowledged: int


class Disposition(StrEnum):
    """What a worker must do with a delivery before consulting progress."""

    APPLY = "apply"
    POISON = "poison"  # delivered more often than the limit: dead-letter it
    MALFORMED = "malformed"  # no usable emission id: dead-letter it


def parse_entries(raw: Any) -> list[StreamEntry]:
    """Entries of an XRANGE / XREADGROUP / XAUTOCLAIM reply (``[(id, {field: value})]``).
    An entry whose fields are gone (deleted while pending) comes back with no fields, so it
    is treated as malformed and dead-lettered."""
    out = []
    for entry_id, fields in raw or []:
        if entry_id is None:  # Redis 6.2 XAUTOCLAIM: an entry deleted while pending, no id
            continue
        pairs = fields or {}
        if isinstance(pairs, list):
            it = iter(pairs)
            pairs = dict(zip(it, it, strict=True))
        out.append(
            StreamEntry(
                DeliveryId(as_text(entry_id)),
                {as_text(k, "replace"): _raw(v) for k, v in pairs.items()},
            )
        )
    return out


def _raw(value: Any) -> bytes:
    return bytes(value) if isinstance(value, bytes | bytearray) else str(value).encode()


#: The reason of a dead_letter or defer intent written before intents kept their reason.
UNKNOWN_REASON = "unknown"

#: The most settlement receipts a consumer's stream keeps (``XADD MAXLEN ~``).
MAX_RECEIPTS_CAP = 10_000_000


def _count(value: object, what: str) -> int:
    """A count a broker reported (deliveries, pending entries): stored as evidence, so
    refused beyond what a record holds exactly (an int of thousands of digits would also
    crash hiredis) rather than sent."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**53:
        raise InvalidDelivery(f"{what} must be an int from 0 to 2**53 - 1")
    return value


#: The most entries one XREADGROUP / XAUTOCLAIM asks for (Redis 7 allocates room for COUNT
#: ids per XAUTOCLAIM, and the pending rows read after it are a few times as many).
MAX_BATCH = 10_000
#: The most rows one observation lists (stream entries, pending rows): each is an argument
#: of the observe script.
MAX_LISTING = 100_000
#: The longest wait an option gives in milliseconds (Redis reads times as 64-bit ints).
_MAX_MS = 2**53 - 1


def _option_int(value: object, what: str, top: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        raise InvalidInput(f"{what} must be an int from 1 to {top}, got {value!r}")
    return value


def _option_seconds(value: object, what: str, *, zero: bool) -> float:
    least = "0 or more" if zero else "more than 0"
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or value * 1000 > _MAX_MS  # first: math.isfinite(10**400) raises OverflowError
        or not math.isfinite(value)
        or not (value >= 0 if zero else value > 0)
    ):
        raise InvalidInput(f"{what} must be a finite number of seconds, {least}, got {value!r}")
    return float(value)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


@dataclass(frozen=True, slots=True)
class ConsumerOptions:
    """A stream consumer's options, checked when it is made: a bad one raises
    :class:`~settle.errors.InvalidInput` before anything is sent (SPEC 11). Times the
    consumer sends to Redis are in whole milliseconds, at least 1."""

    emission_field: str
    max_deliveries: int
    claim_idle_ms: int
    batch: int
    block_ms: int
    listing: int
    retry_pause: float

    @classmethod
    def check(
        cls,
        *,
        emission_field: object,
        max_deliveries: object,
        claim_idle: object,
        batch: object,
        block: object,
        listing: object,
        retry_pause: object,
    ) -> ConsumerOptions:
        if not isinstance(emission_field, str) or not emission_field:
            raise InvalidInput(
                f"emission_field must be a non-empty str (a field name), got {emission_field!r}"
            )
        if not is_utf8(emission_field):
            # No stream field is named so (a lone surrogate has no UTF-8): every delivery
            # would be malformed, and dead-lettered.
            raise InvalidInput(
                f"emission_field must be text UTF-8 can encode, got {emission_field!r}"
            )
        return cls(
            emission_field=emission_field,
            max_deliveries=_option_int(max_deliveries, "max_deliveries", 2**53 - 1),
            claim_idle_ms=_ms(_option_seconds(claim_idle, "claim_idle", zero=False)),
            batch=_option_int(batch, "batch", MAX_BATCH),
            block_ms=_ms(_option_seconds(block, "block", zero=True)),
            listing=_option_int(listing, "listing", MAX_LISTING),
            retry_pause=_option_seconds(retry_pause, "retry_pause", zero=True),
        )


@dataclass
class ProgressCore:
    """Planning and decoding for one consumer (in a namespace) on the progress server."""

    namespace: str
    consumer: str
    receipts_cap: int = 10_000

    def __post_init__(self) -> None:
        if isinstance(self.receipts_cap, bool) or not (
            isinstance(self.receipts_cap, int) and 1 <= self.receipts_cap <= MAX_RECEIPTS_CAP
        ):
            raise InvalidInput(f"receipts_cap must be an int from 1 to {MAX_RECEIPTS_CAP}")
        self.keys = ProgressKeys(self.namespace, self.consumer)
        self.log = logger.bind(namespace=self.namespace, consumer=self.consumer)

    # -- progress server -------------------------------------------------------------------

    def _call(
        self, script: str, scope: ProviderScope, emission: EmissionId | None, *args: str | int
    ) -> Call:
        keys = (
            *self.keys.scope(scope.scope_id),
            self.keys.emission(emission),
            self.keys.holds(scope.scope_id),
        )
        # ARGV[3], the claim flag, is '' as planned: claiming() sets it (see _lib.lua).
        return Call(
            script,
            keys,
            (scope.scope_id, scope_json(scope), "", *args),
            operation_id=self.consumer,
        )

    @staticmethod
    def claiming(call: Call) -> Call:
        """``call`` with its claim flag set: it creates the scope's state when there is none
        (``unclaimed()`` in ``lua/_lib.lua``). Only for a caller that may: the store's own
        calls, or a stream consumer right after :meth:`evidence` found the scope unused."""
        return dataclasses.replace(call, args=(*call.args[:2], "1", *call.args[3:]))

    @staticmethod
    def scope_of(call: Call) -> ProviderScope:
        """The scope a planned progress call is about (its ARGV[2])."""
        data = json.loads(as_text(call.args[1]))
        return ProviderScope(data["stream"], data["group"], data["incarnation"])

    def plan_begin(
        self, scope: ProviderScope, delivery: DeliveryId, emission: EmissionId, attempt: AttemptId
    ) -> Call:
        d, e = _delivery(delivery), _emission(emission)
        return self._call("begin", _scope(scope), e, d.value, e.value, _attempt(attempt).value)

    def plan_record(
        self, scope: ProviderScope, delivery: DeliveryId, emission: EmissionId, attempt: AttemptId
    ) -> Call:
        d, e = _delivery(delivery), _emission(emission)
        return self._call("record", _scope(scope), e, d.value, e.value, _attempt(attempt).value)

    def plan_dead_letter(
        self,
        scope: ProviderScope,
        delivery: DeliveryId,
        emission: EmissionId | None,
        reason: str,
        delivery_count: int,
    ) -> Call:
        d = _delivery(delivery)
        e = _emission(emission) if emission is not None else None
        return self._call(
            "dead_letter",
            _scope(scope),
            None,
            d.value,
            e.value if e else "",
            check_reason(reason),
            _count(delivery_count, "delivery_count"),
        )

    def plan_defer(
        self, scope: ProviderScope, delivery: DeliveryId, emission: EmissionId, reason: str
    ) -> Call:
        d, e = _delivery(delivery), _emission(emission)
        return self._call("defer", _scope(scope), None, d.value, e.value, check_reason(reason))

    def plan_receipt(
        self,
        scope: ProviderScope,
        delivery: DeliveryId,
        kind: IntentKind,
        verdict: StreamVerdict,
        worker: str,
    ) -> Call:
        check_kind(kind)
        if not isinstance(verdict, StreamVerdict):
            raise InvalidDelivery(f"expected a StreamVerdict, got {type(verdict).__name__}")
        check_name(worker, "worker")
        return self._call(
            "receipt",
            _scope(scope),
            None,
            _delivery(delivery).value,
            kind.value,
            verdict.outcome.value,
            "1" if verdict.outcome.conclusive else "0",
            worker,
            verdict.owner or "",
            verdict.delivery_count,
            verdict.acknowledged,
            self.receipts_cap,
        )

    def plan_observe(
        self,
        scope: ProviderScope,
        after: DeliveryId | None,
        listing: Sequence[DeliveryId],
        *,
        last_delivered: DeliveryId | None,
        oldest_pending: DeliveryId | None,
        pending: int,
        held: Sequence[DeliveryId] = (),
        proven_through: DeliveryId | None = None,
    ) -> Call:
        """The observe call. ``held``: the group's pending deliveries after the floor (the
        floor stops below the first one progress has not resolved, listed or not: one whose
        entry was deleted while it was pending is not in the listing); ``proven_through``:
        the last of them when the pending listing was cut at its limit (the floor stops
        there: past it, pending deliveries are unknown). The oldest pending id holds the
        floor as one of ``held``."""
        if after is not None:
            _delivery(after)
        if isinstance(listing, str | bytes) or not isinstance(listing, Sequence):
            raise InvalidDelivery(
                f"listing must be a list of DeliveryId, got {type(listing).__name__}"
            )
        for bound in (last_delivered, oldest_pending):
            if bound is not None:
                _delivery(bound)
        start = after.value if after else "0-0"
        previous = after
        for d in listing:
            if not isinstance(d, DeliveryId) or (previous is not None and not previous < d):
                raise UnprovenListing("a provider listing must be strictly ascending ids")
            previous = d
        holds = [_delivery(d).value for d in (*([oldest_pending] if oldest_pending else []), *held)]
        cut = f";{_delivery(proven_through).value}" if proven_through is not None else ""
        return self._call(
            "observe",
            _scope(scope),
            None,
            start,
            last_delivered.value if last_delivered else "",
            oldest_pending.value if oldest_pending else "",
            _count(pending, "pending"),
            ",".join(holds) + cut,
            *(d.value for d in listing),
        )

    def plan_lost(self, scope: ProviderScope, candidates: Sequence[DeliveryId]) -> Call:
        return self._call("lost", _scope(scope), None, *(_delivery(d).value for d in candidates))

    def lost(self, scope: ProviderScope, reply: ProgressReply) -> list[DeliveryId]:
        """The deliveries the ``lost`` script made gaps now; each is logged."""
        found = [DeliveryId(d) for d in reply.detail.split(",") if d]
        for d in found:
            self.log.warning(
                "settle.progress.lost",
                stream=scope.stream,
                group=scope.group,
                delivery=d.value,
                floor=reply.progress.floor.value if reply.progress.floor else None,
            )
        return found

    def plan_read(self, scope: ProviderScope) -> Call:
        return self._call("read", _scope(scope), None)

    def plan_receipts(self, scope: ProviderScope, limit: int) -> Call:
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise InvalidDelivery("limit must be an int from 1 to 10000")
        key = self.keys.scope(_scope(scope).scope_id)[7]
        return Call("receipts", (key,), (limit,), operation_id=self.consumer)

    def decode_receipts(self, call: Call, raw: Any) -> list[SettlementReceipt]:
        (entries,) = parse_reply(raw, call, body=1).body
        out = []
        for entry_id, flat in entries or []:
            f = _flat(flat)
            out.append(
                SettlementReceipt(
                    delivery=DeliveryId(f["delivery"]),
                    kind=IntentKind(f["kind"]),
                    outcome=SettlementOutcome(f["outcome"]),
                    worker=f["worker"],
                    owner=f["owner"] or None,
                    delivery_count=int(f["deliveries"]),
                    acknowledged=int(f["acked"]),
                    receipt_id=as_text(entry_id),
                )
            )
        return out

    def plan_scopes(self) -> Call:
        return Call("scopes", (self.keys.scopes,), (), operation_id=self.consumer)

    def decode_scopes(self, call: Call, raw: Any) -> list[ProviderScope]:
        (flat,) = parse_reply(raw, call, body=1).body
        out = []
        for text in _flat(flat or []).values():
            data = json.loads(text)
            out.append(ProviderScope(data["stream"], data["group"], data["incarnation"]))
        return sorted(out, key=str)

    @staticmethod
    def read_apart(meta: dict[Any, Any], parts: Sequence[Any]) -> list[Any]:
        """The reply ``read.lua`` gives (``progress_reply``), from the scope's keys read one
        at a time (the store's reads apart, while a Redis Cluster migration splits them):
        the meta, applied, resolved, gaps (their ids), intents and deferred hashes, each as
        HGETALL (a dict) or HKEYS (a list) gave it. Its server time is unread: the decoding
        of a read does not use it."""
        flat = [
            [part for pair in got.items() for part in pair] if isinstance(got, dict) else got
            for got in (meta, *parts)
        ]
        return ["progress", "", 0, *flat]

    def decode(self, call: Call, raw: Any) -> ProgressReply:
        """A progress script's reply. A read that found no state for the scope (no meta:
        its state is new, or the progress server lost it) answers ``unclaimed``, as a write
        that found none does, so that ``_step.progress`` asks the stream's server which one
        it is for both (the read still wrote nothing, and its progress is empty)."""
        reply = parse_reply(raw, call, body=6)
        if reply.code == "corrupt":  # found before the script wrote anything
            raise CorruptRecord(
                f"the progress of consumer {self.consumer!r} holds a {reply.detail} settle "
                "never writes; nothing was written"
            )
        code = reply.code
        if call.script == "read" and not reply.body[0]:
            code = "unclaimed"
        try:
            meta, applied, resolved, gaps, intents, deferred = reply.body
            scope_id = call.args[0]
            scope = self.scope_of(call)
            if scope.scope_id != scope_id:
                raise CorruptRecord("scope id does not match its scope")
            progress = self._progress(
                scope, _flat(meta), applied, resolved, gaps, intents, deferred
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptRecord(f"progress reply cannot be decoded: {exc}") from exc
        return ProgressReply(code, reply.detail, progress)

    def _progress(
        self,
        scope: ProviderScope,
        meta: dict[str, str],
        applied: Sequence[Any],
        resolved: Sequence[Any],
        gaps: Sequence[Any],
        intents: Sequence[Any],
        deferred: Sequence[Any],
    ) -> Progress:
        floor = DeliveryId(meta["floor"]) if meta.get("floor") else None
        provider_floor = None
        if meta.get("pf_at"):
            provider_floor = ProviderFloor(
                last_delivered=DeliveryId(meta["pf_last"]) if meta.get("pf_last") else None,
                oldest_pending=DeliveryId(meta["pf_oldest"]) if meta.get("pf_oldest") else None,
                pending=int(meta.get("pf_pending") or 0),
                observed_at=_dt(meta["pf_at"]),
            )
        open_intents = []
        for d, text in _flat(intents).items():
            item = json.loads(text)
            kind = IntentKind(item["kind"])
            open_intents.append(
                SettleIntent(
                    DeliveryId(d),
                    kind,
                    EmissionId(item["emission"]) if item.get("emission") else None,
                    _dt(item["at"]),
                    recorded_reason(item.get("reason") or "")
                    or ("" if kind is IntentKind.ACK else UNKNOWN_REASON),
                )
            )
        deferrals = []
        for d, text in _flat(deferred).items():
            item = json.loads(text)
            deferrals.append(
                DeferredDelivery(
                    DeliveryId(d),
                    EmissionId(item["emission"]),
                    recorded_reason(item["reason"]),
                    _dt(item["at"]),
                )
            )
        return Progress(
            consumer=self.consumer,
            scope=scope,
            floor=floor,
            applied_above_floor=tuple(sorted(DeliveryId(d) for d in _flat(applied))),
            dead_lettered_above_floor=tuple(sorted(DeliveryId(d) for d in _flat(resolved))),
            gaps=tuple(sorted(DeliveryId(as_text(g)) for g in gaps)),
            provider_floor=provider_floor,
            replay_from=ReplayCursor(DeliveryId(meta["replay"]) if meta.get("replay") else None),
            intents=tuple(sorted(open_intents, key=lambda i: i.delivery)),
            deferred=tuple(sorted(deferrals, key=lambda i: i.delivery)),
            version=int(meta.get("ver") or 0),
            updated_at=_dt(meta["updated"]) if meta.get("updated") else None,
        )

    def receipt(
        self,
        delivery: DeliveryId,
        kind: IntentKind,
        verdict: StreamVerdict,
        worker: str,
        reply: ProgressReply,
    ) -> SettlementReceipt:
        fields = {
            "delivery": delivery.value,
            "kind": kind.value,
            "outcome": verdict.outcome.value,
            "worker": worker,
            "owner": verdict.owner,
            "delivery_count": verdict.delivery_count,
        }
        if verdict.outcome in (SettlementOutcome.ACKED, SettlementOutcome.RELEASED):
            self.log.info("settle.progress.settled", **fields)
        elif verdict.outcome is SettlementOutcome.NOT_PENDING:
            self.log.info("settle.progress.settled_already", **fields)
        else:
            self.log.warning("settle.progress.settle_refused", **fields)
        return SettlementReceipt(
            delivery=delivery,
            kind=kind,
            outcome=verdict.outcome,
            worker=worker,
            owner=verdict.owner,
            delivery_count=verdict.delivery_count,
            acknowledged=verdict.acknowledged,
            receipt_id=reply.detail,
        )

    # -- stream server ---------------------------------------------------------------------

    def plan_stream_scope(self, stream: str, group: str) -> Call:
        keys = StreamKeys(stream)
        check_name(group, "consumer group")
        args = (group, uuid.uuid4().hex[:16])
        return Call("stream_scope", (stream, keys.incarnation), args, operation_id=self.consumer)

    def decode_stream_scope(self, call: Call, raw: Any) -> ProviderScope:
        reply = parse_reply(raw, call, body=1)
        incarnation, created = reply.detail, int(reply.body[0])
        scope = ProviderScope(call.keys[0], as_text(call.args[0]), incarnation)
        self.log.info(
            "settle.progress.scope_opened",
            stream=scope.stream,
            group=scope.group,
            incarnation=incarnation,
            group_created=bool(created),
        )
        return scope

    def plan_stream_settle(
        self,
        scope: ProviderScope,
        authority: SettlementAuthority,
        kind: IntentKind,
        *,
        fenced_count: bool = True,
        emission: EmissionId | None = None,
        reason: str = "",
        release_idle_ms: int = 0,
    ) -> Call:
        """The fenced settlement on the stream's server. Every argument is checked here,
        before anything is read or sent (a kind given as the string ``"ack"`` equals
        ``IntentKind.ACK``, and a ``fenced_count`` of 0 would settle unfenced)."""
        check_kind(kind)
        if not isinstance(authority, SettlementAuthority):
            raise InvalidDelivery(f"expected a SettlementAuthority, got {type(authority).__name__}")
        if not isinstance(fenced_count, bool):
            raise InvalidDelivery(f"fenced_count must be a bool, got {type(fenced_count).__name__}")
        if emission is not None:
            _emission(emission)
        if reason != "":
            check_reason(reason)
        mode = {
            IntentKind.ACK: "ack",
            IntentKind.DEFER: "ack",
            IntentKind.DEAD_LETTER: "dead_letter",
            IntentKind.RELEASE: "release",
        }[kind]
        keys = StreamKeys(scope.stream)
        return Call(
            "stream_settle",
            (scope.stream, keys.dead_letters, keys.incarnation, keys.acknowledged),
            (
                scope.group,
                authority.worker,
                authority.delivery.value,
                str(authority.delivery_count) if fenced_count else "",
                mode,
                emission.value if emission else "",
                reason,
                release_idle_ms,
                scope.incarnation,
                self.mark_field(scope),
            ),
            operation_id=self.consumer,
        )

    def mark_field(self, scope: ProviderScope) -> str:
        """The field of the stream's acknowledged mark for this consumer and ``scope``'s
        group (``lua/stream_settle.lua``)."""
        return json.dumps([self.namespace, self.consumer, scope.group])

    def plan_evidence(self, scope: ProviderScope) -> Call:
        """Ask the stream's server whether ``scope``'s incarnation had a delivery of this
        consumer's group acknowledged (``lua/stream_evidence.lua``)."""
        keys = StreamKeys(scope.stream)
        return Call(
            "stream_evidence",
            (keys.incarnation, keys.acknowledged),
            (self.mark_field(scope), scope.incarnation),
            operation_id=self.consumer,
        )

    def plan_stream_hold(
        self, scope: ProviderScope, worker: str, rows: Sequence[Any], elapsed_ms: int
    ) -> Call:
        """Make the deliveries of ``rows`` (XPENDING rows of ``worker``'s own list) fresh for
        ``worker``, each only while still pending to it and idle at least as listed plus
        ``elapsed_ms`` (what elapsed since the listing on this host's clock), checked on the
        server in the same step as the claim (``lua/stream_hold.lua``)."""
        args: list[str | int] = [scope.group, worker]
        for row in rows:
            args += [as_text(row["message_id"]), int(row["time_since_delivered"]) + elapsed_ms]
        return Call("stream_hold", (scope.stream,), tuple(args), operation_id=self.consumer)

    def decode_stream_hold(self, call: Call, raw: Any, scope: ProviderScope) -> list[Any]:
        """One XCLAIM JUSTID answer per row of the hold (an empty one: not made fresh);
        :class:`ProviderReset` when the stream or its group is gone."""
        reply = parse_reply(raw, call, body=1)
        if reply.code == "no_group":
            self.group_gone(scope)
        held = reply.body[0]
        if (
            reply.code != "held"
            or not isinstance(held, list)
            or 2 * len(held) + 2 != len(call.args)
        ):
            raise CorruptRecord(f"unexpected stream_hold reply {reply.code!r}")
        return held

    def evidence(self, scope: ProviderScope, call: Call, raw: Any) -> bool:
        """Decide on the stream's evidence about a scope the progress server had no state
        for: False when the scope is unused (its state may be created); True when
        deliveries of it were acknowledged (its progress existed: lost, unless another
        worker of the group created it since the call found none, which the caller asks
        the progress server again; :meth:`progress_lost`); raises :class:`ProviderReset`
        when the stream is no longer that incarnation."""
        reply = parse_reply(raw, call, body=0)
        fields = {"scope": str(scope), "stream": scope.stream, "group": scope.group}
        if reply.code == "no_group":
            self.log.warning("settle.progress.provider_reset", **fields)
            raise ProviderReset(
                f"stream {scope.stream!r} is no longer incarnation {scope.incarnation!r}; start "
                "again (a new incarnation scope is opened)"
            )
        if reply.code == "acknowledged":
            return True
        if reply.code != "unused":
            raise CorruptRecord(f"unknown stream evidence {reply.code!r}")
        return False

    def scope_claimed(self, scope: ProviderScope) -> None:
        """Log that ``scope``'s state is being created, the stream having shown it unused
        (not for a read, which creates nothing)."""
        fields = {"scope": str(scope), "stream": scope.stream, "group": scope.group}
        self.log.info("settle.progress.scope_claimed", **fields)

    def progress_lost(self, scope: ProviderScope) -> NoReturn:
        """Refuse a scope whose deliveries were acknowledged and whose progress the
        progress server no longer has: :class:`ProgressLost` (nothing was written)."""
        fields = {"scope": str(scope), "stream": scope.stream, "group": scope.group}
        self.log.error("settle.progress.state_lost", **fields)
        mark = StreamKeys(scope.stream).acknowledged
        raise ProgressLost(
            f"the progress server has no progress of consumer {self.consumer!r} for scope "
            f"{scope}, whose deliveries were acknowledged: it lost that progress (a "
            "restart without persistence, FLUSHALL, a DEL). Nothing was written. To go "
            f"on, stop the workers of group {scope.group!r}, run on the stream's server "
            f"XGROUP DESTROY {_cli(scope.stream)} {_cli(scope.group)} and HDEL {_cli(mark)} "
            f"{_cli(self.mark_field(scope), quote=True)}, then start them again: every entry "
            "still in the stream is applied again under its idempotency key "
            "(docs/delivery-progress.md, 'Progress lost')",
            scope=scope,
            operation_id=self.consumer,
        )

    def decode_stream_settle(self, call: Call, raw: Any) -> StreamVerdict:
        reply = parse_reply(raw, call, body=2)
        count, acknowledged = reply.body
        try:
            outcome = SettlementOutcome(reply.code)
        except ValueError as exc:
            raise CorruptRecord(f"unknown stream settlement outcome {reply.code!r}") from exc
        return StreamVerdict(outcome, reply.detail or None, int(count), int(acknowledged))

    @staticmethod
    def delivered(raw: Any) -> list[StreamEntry]:
        """The entries of an XREADGROUP reply (``[(stream, entries)]``)."""
        return [e for _, batch in list(raw or []) for e in parse_entries(batch)]

    def claimed(
        self, raw: Any, pending: Any | None
    ) -> tuple[list[StreamEntry], list[tuple[StreamEntry, int]]]:
        """An XAUTOCLAIM reply and the XPENDING listing of what it claimed: the entries, and
        each one still pending for this worker with its delivery count (``pending`` None
        before it is read)."""
        entries = parse_entries(raw[1])
        if pending is None:
            return entries, []
        counts = {DeliveryId(as_text(p["message_id"])): int(p["times_delivered"]) for p in pending}
        return entries, [(e, counts[e.delivery]) for e in entries if e.delivery in counts]

    @staticmethod
    def autoclaim_scan(raw: Any) -> tuple[str, list[DeliveryId], bool]:
        """From an XAUTOCLAIM reply: where the next scan starts (``0-0``: the scan wrapped),
        the ids Redis 7 reports deleted (removed from the pending list), and whether Redis
        6.2 answered an entry deleted while pending with nil (it stays pending, claimed by
        this worker, and its id must be read from XPENDING)."""
        nxt = as_text(raw[0])
        deleted = [DeliveryId(as_text(d)) for d in (raw[2] if len(raw) > 2 else None) or []]
        nils = any(entry_id is None for entry_id, _ in raw[1] or [])
        return nxt, deleted, nils

    @staticmethod
    def vanished(
        pending: Any, present: Sequence[Any], claimed: Sequence[StreamEntry]
    ) -> list[tuple[DeliveryId, int]]:
        """Redis 6.2: the entries pending for this worker whose stream entry is gone
        (``present`` holds one XRANGE reply per pending row), with their delivery counts."""
        got = {e.delivery for e in claimed}
        out = []
        for row, found in zip(pending, present, strict=True):
            d = DeliveryId(as_text(row["message_id"]))
            if d not in got and not found:
                out.append((d, int(row["times_delivered"])))
        return out

    @staticmethod
    def own_pending(rows: Any, skip: set[DeliveryId], idle_ms: int) -> list[Any]:
        """The XPENDING rows of this worker's own deliveries that are not in ``skip`` and
        idle less than ``idle_ms`` (claim_idle: XAUTOCLAIM takes the others, a released
        delivery, made idle for it, among them)."""
        return [
            r
            for r in rows or []
            if DeliveryId(as_text(r["message_id"])) not in skip
            and int(r["time_since_delivered"]) < idle_ms
        ]

    @staticmethod
    def pending_ids(rows: Any) -> set[DeliveryId]:
        """The delivery ids of XPENDING rows."""
        return {DeliveryId(as_text(r["message_id"])) for r in rows or []}

    @staticmethod
    def own_rows(rows: Sequence[Any], own: Sequence[tuple[StreamEntry, int]]) -> list[Any]:
        """The XPENDING rows of the deliveries in ``own`` (those whose entries are there)."""
        ids = {entry.delivery for entry, _ in own}
        return [r for r in rows if DeliveryId(as_text(r["message_id"])) in ids]

    @staticmethod
    def still_own(
        own: Sequence[tuple[StreamEntry, int]], kept: Sequence[Any]
    ) -> list[tuple[StreamEntry, int]]:
        """The deliveries of ``own`` (in order) that ``kept`` (one XCLAIM JUSTID reply each,
        in the same order) held for this worker; the others another worker took."""
        return [pair for pair, ids in zip(own, kept, strict=True) if ids]

    @staticmethod
    def own_entries(
        rows: Sequence[Any], present: Sequence[Any]
    ) -> tuple[list[tuple[StreamEntry, int]], list[tuple[DeliveryId, int]]]:
        """This worker's own pending deliveries (``present``: one XRANGE reply per row): the
        entries with their delivery counts, and those whose entries are gone."""
        found: list[tuple[StreamEntry, int]] = []
        gone: list[tuple[DeliveryId, int]] = []
        for row, got in zip(rows, present, strict=True):
            count = int(row["times_delivered"])
            entries = parse_entries(got)
            if entries:
                found.append((entries[0], count))
            else:
                gone.append((DeliveryId(as_text(row["message_id"])), count))
        return found, gone

    @staticmethod
    def stale_intents(progress: Progress, idle_ms: int) -> list[SettleIntent]:
        """The open settle intents older than ``idle_ms`` (by the progress server's clock
        as recorded, against this host's clock)."""
        now = datetime.now(tz=UTC)
        return [i for i in progress.intents if (now - i.since).total_seconds() * 1000 > idle_ms]

    @staticmethod
    def lost_candidates(
        listed: Any, last_delivered: DeliveryId | None, pending: Any, limit: int
    ) -> list[DeliveryId]:
        """Listed deliveries the group handed out (at or below its last-delivered id) that
        are not pending: each must be covered by progress, or it was lost. A pending
        listing cut at ``limit`` rows proves nothing past its last row."""
        if last_delivered is None:
            return []
        rows = list(pending or [])
        held = {as_text(p["message_id"]) for p in rows}
        top = last_delivered
        if len(rows) >= limit:
            top = min(top, DeliveryId(as_text(rows[-1]["message_id"])))
        return [
            e.delivery
            for e in parse_entries(listed)
            if not top < e.delivery and e.delivery.value not in held
        ]

    def plan_observation(
        self,
        scope: ProviderScope,
        after: DeliveryId | None,
        listed: Any,
        groups: Any,
        summary: Any,
        pending: Any = (),
        limit: int = 0,
    ) -> Call:
        """The observe call for what the provider showed: XRANGE after the progress floor,
        XINFO GROUPS, the XPENDING summary and the group's pending rows after the floor
        (XPENDING with a range, cut at ``limit`` rows)."""
        oldest = as_text(summary.get("min") or "")
        rows = [DeliveryId(as_text(row["message_id"])) for row in pending or []]
        return self.plan_observe(
            scope,
            after,
            [e.delivery for e in parse_entries(listed)],
            last_delivered=self.last_delivered(scope, groups),
            oldest_pending=DeliveryId(oldest) if oldest else None,
            pending=int(summary.get("pending") or 0),
            held=rows,
            proven_through=rows[-1] if rows and len(rows) >= limit > 0 else None,
        )

    @staticmethod
    def last_delivered(scope: ProviderScope, groups: Any) -> DeliveryId | None:
        """The group's last-delivered id from an XINFO GROUPS reply (None: none yet)."""
        info = next((g for g in groups if as_text(g["name"]) == scope.group), None)
        last = as_text(info["last-delivered-id"]) if info else ""
        return DeliveryId(last) if last and last != "0-0" else None

    def observed(
        self, scope: ProviderScope, reply: ProgressReply, *, strict: bool = False
    ) -> Progress:
        """The progress an observation left. ``strict`` (a caller's own listing): one that
        started above the floor raises :class:`UnprovenListing` (it wrote nothing); the
        consumer, which lists from the floor it just read, takes it as unchanged."""
        if strict and reply.code == "unproven":
            raise UnprovenListing(
                f"the listing starts above the progress floor ({reply.detail or 'none'}): it "
                "proves nothing about the deliveries before it; nothing was written. List "
                "again from the floor."
            )
        if reply.code == "advanced":
            self.log.info("settle.progress.floor_advanced", stream=scope.stream, floor=reply.detail)
        return reply.progress

    def raise_stream_failure(self, exc: BackendError, scope: ProviderScope) -> NoReturn:
        """Raise what a failed stream command means: the group is gone (Redis error code
        ``NOGROUP``: :class:`ProviderReset`, a new incarnation scope must be opened) or the
        server failed (``exc`` itself, its Redis error kept as its cause)."""
        if exc.code != "NOGROUP":
            raise exc
        self.group_gone(scope, exc)

    def check_group(self, verdict: StreamVerdict, scope: ProviderScope) -> None:
        if verdict.outcome is SettlementOutcome.NO_GROUP:
            self.group_gone(scope)

    def group_gone(self, scope: ProviderScope, cause: BaseException | None = None) -> NoReturn:
        """A stream command or script found ``scope``'s group (or its stream, or its
        incarnation) gone: :class:`ProviderReset` (``cause``, a NOGROUP error, kept as its
        cause), a new incarnation scope must be opened."""
        self.log.warning("settle.progress.provider_reset", stream=scope.stream, group=scope.group)
        reset = ProviderReset(
            f"consumer group {scope.group!r} of stream {scope.stream!r} is gone; start "
            "again (a new incarnation scope is opened)"
        )
        if cause is None:  # (``from None`` would hide the context of a caller's handler)
            raise reset
        raise reset from cause

    def disposition(
        self, entry: StreamEntry, delivery_count: int, emission_field: str, max_deliveries: int
    ) -> tuple[Disposition, EmissionId | None]:
        raw = entry.fields.get(emission_field)
        try:
            emission = EmissionId(raw.decode("utf-8")) if raw is not None else None
        except (InvalidDelivery, UnicodeDecodeError):
            emission = None
        if emission is None:
            return Disposition.MALFORMED, None
        if delivery_count > max_deliveries:
            return Disposition.POISON, emission
        return Disposition.APPLY, emission
