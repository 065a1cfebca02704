"""Plan each cursor script call and decode its reply; no I/O.

A shell method is ``call = core.plan_x(...)``, ``raw = await backend.run(call)``,
``core.decode_x(call, raw)``. Logging happens here, after a script's reply, so a log
line means the transition it names is durable. Cursors and successors appear in logs only
as digests (the first 16 hex digits of their SHA-256).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from settle._input import key_part
from settle._log import event_digest, logger
from settle._runtime import Call, parse_reply
from settle._text import as_text
from settle.config import check_namespace
from settle.cursor._classify import (
    HELD_REASON,
    Decision,
    View,
    check_page,
    classify,
    witness_events,
)
from settle.cursor._keys import check_stream, stream_keys
from settle.cursor.errors import (
    CheckpointMissing,
    CursorDivergence,
    CursorError,
    CursorExpired,
    InvalidResponse,
    ReceiptConflict,
)
from settle.cursor.models import (
    MAX_POSITION,
    NOTHING_APPLIED,
    Checkpoint,
    Classification,
    Disposition,
    Event,
    EventContext,
    Page,
    ProviderContract,
    Receipt,
    Recovery,
    StepOutcome,
    StepResult,
    Witness,
    WitnessEvent,
    cursor_digest,
    ms_datetime,
)
from settle.errors import CorruptRecord, InvalidInput

__all__ = ["MAX_STAND_DOWN", "STAND_DOWN_FOR", "CursorCore", "Outcome", "Reply"]

_MAX_OUTCOME = 32

#: Seconds another worker's pending response may go without progress (no receipt, no
#: change) while a shorter copy of it stands down (``LOST``) by default; then its worker is
#: taken for gone and the shorter copy stops the stream instead (``CoverageNotProven``).
STAND_DOWN_FOR = 300.0
#: The most ``stand_down_for`` may be (a week).
MAX_STAND_DOWN = 7 * 86_400


def short(digest: str) -> str:
    return digest[:16]


@dataclass(frozen=True, slots=True)
class Reply:
    code: str
    detail: str
    now_ms: int
    checkpoint: Checkpoint | None
    extra: list[Any]


def event_key(namespace: str, stream: str, event_id: str) -> str:
    """``EventContext.key``: ``<namespace>:<stream>:<event id>``, one key per event. The
    namespace has no ``:``; a ``:`` or ``%`` in the stream name is written ``%3A`` / ``%25``,
    so the first two colons always separate the parts (stream ``a:b`` with event ``c`` and
    stream ``a`` with event ``b:c`` gave the same key, and the second event was taken for
    the first by the handler's deduplication). A stream name with neither keeps its key."""
    return f"{namespace}:{key_part(stream)}:{event_id}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What recording one event outcome found."""

    recorded: bool
    """False: a matching receipt already existed (the event was applied before)."""
    live: bool
    """False: the checkpoint moved past this witness's generation, stop this response."""


def _stream(call: Call) -> str:
    """The stream a call is about (the runtime's ``Call`` names it ``operation_id``)."""
    return call.operation_id or ""


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def _fields(flat: list[Any]) -> dict[str, Any]:
    it = iter(flat)
    return {as_text(k): v for k, v in zip(it, it, strict=True)}


def _cursor(value: object, what: str, stream: str) -> bytes:
    if isinstance(value, bytearray | memoryview):
        value = bytes(value)
    if not isinstance(value, bytes) or len(value) > 64 << 10:
        raise InvalidInput(f"{what} must be bytes of at most 65536", operation_id=stream)
    return value


def _position(value: object, what: str, stream: str, *, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_POSITION:
        raise InvalidInput(f"{what} must be an integer in [{low}, 2**53 - 1]", operation_id=stream)
    return value


def _boundary(value: object, stream: str) -> int:
    """An applied boundary: the highest position applied, or ``NOTHING_APPLIED`` (-1) for a
    stream none of whose positions is applied yet, position 0 included (a provider that
    counts from 0)."""
    return _position(value, "boundary", stream, low=NOTHING_APPLIED)


class WitnessesChanged(Exception):
    """Another response to the same (cursor, generation) was witnessed meanwhile."""


#: The attributes of a witness in the witnesses hash (lua/_lib.lua's WITNESS_ATTRS).
WITNESS_ATTRS = (
    b"gen",
    b"input",
    b"cdig",
    b"events",
    b"succ",
    b"sdig",
    b"snap",
    b"cov",
    b"class",
    b"nbound",
    b"disp",
    b"reason",
    b"created",
    b"updated",
)

_CANONICAL_INT = re.compile(rb"-?[1-9][0-9]*|0")


def _canonical_int(value: object) -> int:
    """A checkpoint's generation or boundary as settle writes it (the Lua's canonical_int:
    the scripts compare generations as text, so ``01`` would never match 1)."""
    raw = value if isinstance(value, bytes) else str(value).encode()
    if not _CANONICAL_INT.fullmatch(raw) or abs(int(raw)) >= 2**53:
        raise ValueError(f"not an integer as settle writes one: {value!r}")
    return int(raw)


@dataclass
class CursorCore:
    """The rules of one namespace's cursor checkpoints, shared by both shells."""

    namespace: str
    keep_generations: int = 64
    receipt_horizon: int | None = None

    def __post_init__(self) -> None:
        check_namespace(self.namespace)
        keep = self.keep_generations
        if type(keep) is not int or not 1 <= keep <= 10_000:  # 1.5 was kept, "5" a TypeError
            raise InvalidInput(f"keep_generations must be an int from 1 to 10000, got {keep!r}")
        if self.receipt_horizon is not None and (
            isinstance(self.receipt_horizon, bool)
            or not isinstance(self.receipt_horizon, int)
            or not 1 <= self.receipt_horizon <= MAX_POSITION
        ):
            raise InvalidInput(
                f"receipt_horizon must be a number of positions from 1 to {MAX_POSITION}, or None"
            )

    @staticmethod
    def check_consumer(
        stream: str, contract: object, stand_down_for: object
    ) -> tuple[str, ProviderContract, int]:
        """The consumer's stream, contract and ``stand_down_for`` in ms, checked."""
        if not isinstance(contract, ProviderContract):
            raise InvalidInput(
                f"contract must be a settle.cursor.ProviderContract, got {type(contract).__name__}"
            )
        wait = stand_down_for
        if (
            isinstance(wait, bool)
            or not isinstance(wait, int | float)
            or not 0 < wait <= MAX_STAND_DOWN  # NaN fails both
        ):
            raise InvalidInput(
                f"stand_down_for must be a number of seconds above 0, at most {MAX_STAND_DOWN}, "
                f"got {wait!r}"
            )
        return check_stream(stream), contract, max(1, round(wait * 1000))

    def _call(self, script: str, stream: str, *args: str | bytes | int) -> Call:
        s = check_stream(stream)
        return Call(script, stream_keys(self.namespace, s), tuple(args), operation_id=s)

    def _log(self, stream: str) -> Any:
        return logger.bind(namespace=self.namespace, stream=stream)

    # -- replies --------------------------------------------------------------------------

    def _reply(self, call: Call, raw: Any, *, reading: bool = False) -> Reply:
        """The script's reply; :class:`CorruptRecord` or :class:`CheckpointMissing` (each
        logged, unless ``reading``: a caller that only asks whether the checkpoint exists)."""
        reply = parse_reply(raw, call, body=2)
        code, (ckpt, extra) = reply.code, reply.body
        if code == "corrupt":
            raise self._corrupt(
                call,
                f"the checkpoint of stream {_stream(call)!r} is not a settle checkpoint; "
                "inspect the key, nothing was written",
            )
        with self._reading(call):
            checkpoint = self._checkpoint(ckpt) if ckpt else None
        if code == "missing" or (checkpoint is None and code not in ("no_witness",)):
            raise self._missing(
                call,
                f"stream {_stream(call)!r} has no checkpoint: call start(stream, cursor) first",
                reading=reading,
            )
        return Reply(code, reply.detail, reply.now_ms, checkpoint, list(extra or []))

    @contextmanager
    def _reading(self, call: Call) -> Iterator[None]:
        """Decoding what ``call``'s script read: a checkpoint, witness or receipt that does
        not read as settle writes it is :class:`CorruptRecord`, logged as the others are."""
        try:
            yield
        except CorruptRecord:
            self._log(_stream(call)).error("settle.cursor.corrupt", script=call.script)
            raise

    def _corrupt(self, call: Call, message: str) -> CorruptRecord:
        """A stream's keys hold what settle did not write: logged, nothing written."""
        self._log(_stream(call)).error("settle.cursor.corrupt", script=call.script)
        return CorruptRecord(message, operation_id=_stream(call))

    def _missing(self, call: Call, message: str, *, reading: bool = False) -> CheckpointMissing:
        """The stream has no checkpoint (never started, or its keys were lost: a restart
        without persistence, FLUSHALL, a key deleted): logged, unless only ``reading``."""
        if not reading:
            self._log(_stream(call)).warning("settle.cursor.checkpoint_missing", script=call.script)
        return CheckpointMissing(message, stream=_stream(call))

    def _checkpoint(self, flat: list[Any]) -> Checkpoint:
        f = _fields(flat)
        try:
            return Checkpoint(
                stream=as_text(f["stream"]),
                cursor=_bytes(f["cursor"]),
                cursor_digest=as_text(f["cdig"]),
                generation=_canonical_int(f["gen"]),
                boundary=_canonical_int(f["bound"]),
                created_at=ms_datetime(int(f["created"])),
                updated_at=ms_datetime(int(f["updated"])),
                promoted_witness=as_text(f.get("waid") or b"") or None,
                pruned=_canonical_int(f["pruned"]) if f.get("pruned") else None,
            )
        except (KeyError, ValueError) as exc:
            raise CorruptRecord(f"unreadable checkpoint: {exc}") from exc

    def _witness(self, flat: list[Any]) -> Witness:
        f = _fields(flat)
        try:
            cov = as_text(f["cov"])
            cov_pair = json.loads(cov) if cov else None
            return Witness(
                attempt_id=as_text(f["aid"]),
                generation=int(f["gen"]),
                input_cursor=_bytes(f["input"]),
                input_digest=as_text(f["cdig"]),
                events=tuple(
                    WitnessEvent(id=i, position=p, digest=d)
                    for i, p, d in json.loads(as_text(f["events"]))
                ),
                successor=_bytes(f["succ"]),
                successor_digest=as_text(f["sdig"]),
                snapshot=as_text(f["snap"]) or None,
                coverage=tuple(cov_pair) if cov_pair else None,
                classification=Classification(as_text(f["class"])),
                next_boundary=int(f["nbound"]),
                disposition=Disposition(as_text(f["disp"])),
                reason=as_text(f["reason"]),
                created_at=ms_datetime(int(f["created"])),
                updated_at=ms_datetime(int(f["updated"])),
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise CorruptRecord(f"unreadable witness: {exc}") from exc

    @staticmethod
    def _receipt(event_id: str, value: Any) -> Receipt:
        try:
            pos, digest, gen, aid, outcome, at = as_text(value).split(" ")
            return Receipt(
                event_id=event_id,
                position=int(pos),
                digest=digest,
                generation=int(gen),
                attempt_id=aid,
                outcome=outcome,
                at=ms_datetime(int(at)),
            )
        except ValueError as exc:
            raise CorruptRecord(f"unreadable receipt of event {event_id!r}") from exc

    # -- start, read, reset ----------------------------------------------------------------

    def plan_start(self, stream: str, cursor: bytes, boundary: int = 0) -> Call:
        c = _cursor(cursor, "cursor", stream)
        b = _boundary(boundary, stream)
        return self._call("init", stream, stream, c, cursor_digest(c), b)

    def decode_start(self, call: Call, raw: Any) -> Checkpoint:
        reply = self._reply(call, raw)
        assert reply.checkpoint is not None
        if reply.code == "created":
            self._log(_stream(call)).info(
                "settle.cursor.started",
                generation=reply.checkpoint.generation,
                cursor_digest=short(reply.checkpoint.cursor_digest),
                boundary=reply.checkpoint.boundary,
            )
        return reply.checkpoint

    def plan_witnesses(self, stream: str, limit: int = 20) -> Call:
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= 10_000:
            raise InvalidInput("limit must be 0 to 10000", operation_id=stream)
        return self._call("witnesses", stream, limit)

    @staticmethod
    def apart_code(checkpoint: dict[Any, Any] | None) -> str:
        """The code an inspection script gives for the checkpoint's fields read apart
        (HGETALL; None: the key is not a hash): ``missing`` for none, ``corrupt`` for one
        the scripts do not take for a checkpoint (lua/_lib.lua's load_ckpt: no cursor, or
        a generation, boundary or pruned position that is not an integer as settle writes
        one), else ``ok``."""
        if checkpoint is None:
            return "corrupt"
        if not checkpoint:
            return "missing"
        f = {_bytes(k): v for k, v in checkpoint.items()}
        wanted = [f.get(b"gen"), f.get(b"bound")] + ([f[b"pruned"]] if b"pruned" in f else [])
        try:
            for value in wanted:
                _canonical_int(value if value is not None else b"")
        except ValueError:
            return "corrupt"
        return "ok" if b"cursor" in f else "corrupt"

    @staticmethod
    def apart_reply(code: str, checkpoint: dict[Any, Any], extra: list[Any]) -> list[Any]:
        """The reply an inspection script (``witnesses``, ``receipts``) gives, from its keys
        read one at a time (the store's reads apart, while a Redis Cluster migration splits
        them): ``code`` ``ok``, ``missing`` or ``corrupt``, the checkpoint's fields (HGETALL)
        and ``extra`` (witness flat lists, or receipt id / value pairs). Its server time is
        unread: no inspection decodes it."""
        flat = [part for pair in checkpoint.items() for part in pair]
        return [code, "", 0, flat, extra]

    @staticmethod
    def witness_fields(aids: list[Any]) -> list[bytes]:
        """The fields of the witnesses hash that hold ``aids``' witnesses (HMGET of them,
        in this order, is :meth:`witnesses_apart`'s input): ``<aid>|<attr>``."""
        return [_bytes(aid) + b"|" + attr for aid in aids for attr in WITNESS_ATTRS]

    @staticmethod
    def witnesses_apart(aids: list[Any], values: list[Any]) -> list[list[Any]]:
        """The flat lists ``witnesses.lua`` makes of ``aids``' witnesses from ``values``
        (HMGET of :meth:`witness_fields`): one whose first field is gone is left out (a
        witness deleted after the index was read), as the script leaves it out."""
        n, out = len(WITNESS_ATTRS), []
        for i, aid in enumerate(aids):
            row = values[i * n : (i + 1) * n]
            if row and row[0] is not None:
                pairs = [
                    part for a, v in zip(WITNESS_ATTRS, row, strict=True) for part in (a, v or b"")
                ]
                out.append([b"aid", aid, *pairs])
        return out

    @staticmethod
    def receipts_apart(ids: list[Any], values: list[Any]) -> list[Any]:
        """The event id / receipt pairs ``receipts.lua`` returns, from the ids the receipt
        index gave and their receipts (HMGET): one gone since is left out, as the script
        leaves it out."""
        return [part for i, v in zip(ids, values, strict=True) if v is not None for part in (i, v)]

    def decode_checkpoint(self, call: Call, raw: Any) -> Checkpoint | None:
        try:
            reply = self._reply(call, raw, reading=True)
        except CheckpointMissing:
            return None
        return reply.checkpoint

    def decode_witnesses(self, call: Call, raw: Any) -> list[Witness]:
        reply = self._reply(call, raw)
        with self._reading(call):
            return [self._witness(list(w)) for w in reply.extra]

    def plan_reset(
        self,
        stream: str,
        *,
        cursor: bytes,
        boundary: int,
        expected_generation: int,
        reapply_pruned: bool = False,
    ) -> Call:
        c = _cursor(cursor, "cursor", stream)
        b = _boundary(boundary, stream)
        g = _position(expected_generation, "expected_generation", stream)
        if not isinstance(reapply_pruned, bool):
            raise InvalidInput(
                f"reapply_pruned must be True or False, got {type(reapply_pruned).__name__}",
                operation_id=stream,
            )
        return self._call("reset", stream, g, c, cursor_digest(c), b, "1" if reapply_pruned else "")

    def decode_reset(self, call: Call, raw: Any) -> Checkpoint:
        reply = self._reply(call, raw)
        assert reply.checkpoint is not None
        log = self._log(_stream(call))
        if reply.code == "pruned":
            # Receipts above the boundary asked for were pruned (receipt_horizon): their
            # events would come to handle_event again as new. Refused unless asked for.
            pruned = int(reply.detail)
            log.warning(
                "settle.cursor.reset_rejected",
                reason="receipts_pruned",
                expected_generation=call.args[0],
                generation=reply.checkpoint.generation,
                boundary=call.args[3],
                pruned=pruned,
            )
            raise CursorError(
                f"stream {_stream(call)!r}: the receipts of events up to position {pruned} "
                f"were pruned (receipt_horizon), so a reset to boundary {call.args[3]!s} would "
                "hand those above it to handle_event again as new: nothing was reset; reset "
                f"to a boundary of at least {pruned} with a cursor whose page starts after "
                f"position {pruned} (a stable boundary: a page that shows a pruned event "
                "again stops the stream, CoverageNotProven), or pass reapply_pruned=True if "
                "handle_event is idempotent under ctx.key",
                stream=_stream(call),
            )
        if reply.code != "reset":
            log.warning(
                "settle.cursor.reset_rejected",
                reason="generation",
                expected_generation=call.args[0],
                generation=reply.checkpoint.generation,
            )
            raise CursorError(
                f"stream {_stream(call)!r} is at generation {reply.checkpoint.generation}, not "
                f"{call.args[0]!s}: nothing was reset; read the checkpoint again and decide again",
                stream=_stream(call),
            )
        # reapply_pruned let the boundary below pruned receipts: their events come again.
        again = {"pruned": int(reply.detail)} if reply.detail else {}
        log.warning(
            "settle.cursor.reset",
            generation=reply.checkpoint.generation,
            cursor_digest=short(reply.checkpoint.cursor_digest),
            boundary=reply.checkpoint.boundary,
            **again,
        )
        return reply.checkpoint

    # -- one step of a consumer ----------------------------------------------------------

    def plan_load(self, stream: str, page: Page | None = None, boundary: int = 0) -> Call:
        if page is None:
            return self._call("load", stream, "", "", 0)
        positions = [e.position for e in page.events]
        return self._call(
            "load",
            stream,
            boundary - 1,
            max([boundary, *positions]),
            len(positions),
            *(e.id for e in page.events),
            *positions,
        )

    def decode_load(self, call: Call, raw: Any) -> View:
        reply = self._reply(call, raw)
        assert reply.checkpoint is not None
        witnesses, receipts, passed = [*reply.extra, [], [], []][:3]
        flat = _fields(list(receipts))
        with self._reading(call):
            return View(
                checkpoint=reply.checkpoint,
                witnesses=tuple(self._witness(list(w)) for w in witnesses),
                receipts={k: self._receipt(k, v) for k, v in flat.items()},
                now_ms=reply.now_ms,
                passed=frozenset(as_text(d) for d in passed or []),
            )

    def plan_receipts(self, stream: str, after: int | None, limit: int) -> Call:
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise InvalidInput("limit must be 1 to 10000", operation_id=stream)
        low = "" if after is None else _position(after, "after", stream, low=NOTHING_APPLIED)
        return self._call("receipts", stream, low, limit)

    def decode_receipts(self, call: Call, raw: Any) -> list[Receipt]:
        reply = self._reply(call, raw)
        with self._reading(call):
            return [self._receipt(k, v) for k, v in _fields(reply.extra).items()]

    def check_expiry(self, stream: str, contract: ProviderContract, view: View) -> None:
        ttl = contract.cursor_ttl
        ck = view.checkpoint
        age_ms = view.now_ms - int(ck.updated_at.timestamp() * 1000)
        if ttl is not None and age_ms > ttl * 1000:
            raise self.expired(stream, ck, f"the cursor is {age_ms / 1000:.1f} s old")

    def expired(self, stream: str, ck: Checkpoint, why: str) -> CursorExpired:
        self._log(stream).warning(
            "settle.cursor.expired",
            generation=ck.generation,
            cursor_digest=short(ck.cursor_digest),
            boundary=ck.boundary,
        )
        return CursorExpired(
            f"stream {stream!r}: {why}, past the provider's cursor lifetime",
            stream=stream,
            recovery=Recovery.STABLE_BOUNDARY,
            generation=ck.generation,
            boundary=ck.boundary,
            reason="cursor_expired",
        )

    def check_page(self, stream: str, contract: ProviderContract, page: object) -> Page:
        try:
            return check_page(stream, contract, page)
        except InvalidResponse as exc:
            self._log(stream).warning("settle.cursor.invalid_response", reason=exc.reason)
            raise

    def classify(
        self, stream: str, contract: ProviderContract, view: View, page: Page, stand_down_ms: int
    ) -> Decision:
        decision = classify(stream, contract, view, page, stand_down_ms)
        ck = view.checkpoint
        log = self._log(stream).bind(
            generation=ck.generation,
            cursor_digest=short(ck.cursor_digest),
            successor_digest=short(cursor_digest(page.successor)),
            events=len(page.events),
        )
        if decision.error is not None:
            log.warning(
                "settle.cursor.diverged",
                reason=decision.error.reason,
                recovery=decision.error.recovery.value,
            )
        elif decision.held:
            log.info("settle.cursor.held", classification=decision.classification.value)
        elif decision.lost is not None:
            log.info("settle.cursor.lost", to=decision.lost, at="classify")
        elif decision.stalled:
            log.warning("settle.cursor.no_progress", classification=decision.classification.value)
        else:
            log.info(
                "settle.cursor.classified",
                classification=decision.classification.value,
                resume=decision.resume,
            )
        return decision

    def plan_witness(self, stream: str, view: View, page: Page, decision: Decision) -> Call:
        ck = view.checkpoint
        err = decision.error
        cov = page.coverage
        return self._call(
            "witness",
            stream,
            ck.generation,
            ck.cursor_digest,
            uuid.uuid4().hex,
            ck.cursor,
            json.dumps(
                [[e.id, e.position, e.digest] for e in witness_events(page)],
                separators=(",", ":"),
            ),
            page.successor,
            cursor_digest(page.successor),
            page.snapshot or "",
            json.dumps([cov.after, cov.through]) if cov else "",
            decision.classification.value,
            decision.next_boundary,
            (Disposition.ABANDONED if err else Disposition.PENDING).value,
            f"divergent:{err.reason}" if err else (HELD_REASON if decision.held else ""),
            len(view.witnesses),
        )

    def decode_witness(self, call: Call, raw: Any) -> str | None:
        """The attempt id of the recorded witness; None when the checkpoint moved on.

        Raises :class:`WitnessesChanged` when another response to the same cursor and
        generation was witnessed after this one was classified: classify again.
        """
        reply = self._reply(call, raw)
        aid = as_text(call.args[2])
        log = self._log(_stream(call)).bind(generation=call.args[0], attempt_id=aid)
        if reply.code == "stale":
            log.info("settle.cursor.superseded", at="witness")
            return None
        if reply.code == "changed":
            log.info("settle.cursor.reclassify", reason="witnessed_meanwhile")
            raise WitnessesChanged(_stream(call))
        log.info(
            "settle.cursor.witness_recorded",
            classification=as_text(call.args[9]),
            disposition=as_text(call.args[11]),
            successor_digest=short(as_text(call.args[6])),
        )
        return aid

    def diverged(self, decision: Decision, attempt_id: str | None) -> CursorDivergence:
        err = decision.error
        assert err is not None
        err.attempt_id = attempt_id
        return err

    def context(
        self, stream: str, view: View, attempt_id: str, decision: Decision, event: Event
    ) -> EventContext:
        return EventContext(
            stream=stream,
            generation=view.checkpoint.generation,
            attempt_id=attempt_id,
            classification=decision.classification,
            # The event's identity only, never its payload: two workers that see one id with
            # different payloads must meet in the user's dedup, not apply both.
            key=event_key(self.namespace, stream, event.id),
        )

    def handler_failed(self, stream: str, attempt_id: str, event: Event, error: Exception) -> None:
        """``handle_event`` raised: logged (the error's type only, never its text: it may
        hold the payload), and the step raises it; the event has no receipt."""
        self._log(stream).warning(
            "settle.cursor.handler_failed",
            attempt_id=attempt_id,
            event_digest=event_digest(event.id),
            position=event.position,
            error_type=type(error).__name__,
        )

    def plan_resume(self, stream: str, attempt_id: str, generation: int) -> Call:
        return self._call("resume", stream, attempt_id, generation)

    def decode_resume(self, call: Call, raw: Any) -> bool:
        """Whether the witness was resumed (still pending at the generation the step read);
        else another worker moved the checkpoint on meanwhile."""
        reply = self._reply(call, raw)
        log = self._log(_stream(call)).bind(attempt_id=as_text(call.args[0]))
        if reply.code == "resumed":
            log.info("settle.cursor.resumed")
            return True
        log.info("settle.cursor.superseded", at="resume")
        return False

    def plan_outcome(
        self, stream: str, attempt_id: str, event: Event, outcome: str = "applied"
    ) -> Call:
        if (
            not isinstance(outcome, str)
            or not 1 <= len(outcome) <= _MAX_OUTCOME
            or not all(ch.isalnum() or ch == "_" for ch in outcome)
        ):
            raise InvalidInput("outcome must be 1 to 32 of A-Z a-z 0-9 _", operation_id=stream)
        return self._call(
            "outcome", stream, attempt_id, event.id, event.position, event.digest, outcome
        )

    def decode_outcome(self, call: Call, raw: Any, view: View) -> Outcome:
        reply = self._reply(call, raw)
        event_id = as_text(call.args[1])
        log = self._log(_stream(call)).bind(
            attempt_id=as_text(call.args[0]),
            event_digest=event_digest(event_id),
            position=call.args[2],
        )
        live = reply.detail == "live"
        if reply.code == "recorded":
            log.info("settle.cursor.event_recorded", live=live)
            return Outcome(recorded=True, live=live)
        if reply.code == "duplicate":
            log.info("settle.cursor.event_duplicate", live=live)
            return Outcome(recorded=False, live=live)
        moved = (
            reply.checkpoint is not None
            and reply.checkpoint.generation > view.checkpoint.generation
        )
        if reply.code == "no_witness" and reply.detail == "gone" and moved:
            # A slow worker: while its handler ran, the checkpoint moved on far enough that
            # its witness was pruned. The race it lost, not corruption (SPEC 9: a losing
            # retry never publishes). A witness gone while the checkpoint did not move (or
            # went) is not a race: it falls through to the errors below.
            log.info("settle.cursor.superseded", at="outcome", witness="pruned")
            return Outcome(recorded=False, live=False)
        if reply.code == "no_witness" and reply.checkpoint is None:
            raise self._missing(
                call,
                f"stream {_stream(call)!r} has no checkpoint any more: its keys were deleted "
                "while this step ran; call start(stream, cursor) again",
            )
        if reply.code == "conflict":
            log.warning("settle.cursor.event_conflict")
            ck = view.checkpoint
            raise ReceiptConflict(
                f"event {event_id!r} conflicts with a receipt recorded meanwhile",
                stream=_stream(call),
                recovery=Recovery.FRESH_SNAPSHOT,
                generation=ck.generation,
                boundary=ck.boundary,
                reason="receipt_conflict",
                attempt_id=as_text(call.args[0]),
            )
        gone = "is gone" if reply.detail == "gone" else "does not list event " + repr(event_id)
        raise self._corrupt(
            call,
            f"witness {as_text(call.args[0])} {gone} while the checkpoint still holds its "
            "generation: something other than settle changed the stream's keys",
        )

    def plan_promote(self, stream: str, view: View, attempt_id: str) -> Call:
        ck = view.checkpoint
        return self._call(
            "promote",
            stream,
            ck.generation,
            ck.cursor_digest,
            attempt_id,
            self.keep_generations,
            self.receipt_horizon or 0,
        )

    def decode_promote(
        self, call: Call, raw: Any, decision: Decision, applied: int, skipped: int
    ) -> StepResult:
        reply = self._reply(call, raw)
        ck = reply.checkpoint
        assert ck is not None
        aid = as_text(call.args[2])
        log = self._log(_stream(call)).bind(attempt_id=aid, generation=ck.generation)
        fields: dict[str, Any] = {
            "classification": decision.classification,
            "generation": ck.generation,
            "boundary": ck.boundary,
            "applied": applied,
            "skipped": skipped,
            "attempt_id": aid,
        }
        if reply.code in ("promoted", "already"):
            log.info(
                "settle.cursor.promoted",
                classification=decision.classification.value,
                cursor_digest=short(ck.cursor_digest),
                boundary=ck.boundary,
                repeated=reply.code == "already",
            )
            return StepResult(outcome=StepOutcome.PROMOTED, **fields)
        if reply.code in ("stale", "abandoned"):
            log.info("settle.cursor.superseded", at="promote")
            return StepResult(outcome=StepOutcome.SUPERSEDED, **fields)
        if reply.code == "uncovered":
            # Another worker's pending response to the same cursor holds an event this one
            # lacks: this response lost; the other one (or an exact replay of it) goes on.
            log.info(
                "settle.cursor.lost",
                at="promote",
                missing_event_digest=event_digest(reply.detail),
            )
            return StepResult(outcome=StepOutcome.LOST, **fields)
        raise self._corrupt(
            call,
            f"promotion of witness {aid} refused ({reply.code} {reply.detail}): its events "
            "lack matching receipts",
        )

    def held(self, view: View, decision: Decision) -> StepResult:
        ck = view.checkpoint
        return StepResult(
            outcome=StepOutcome.HELD,
            classification=decision.classification,
            generation=ck.generation,
            boundary=ck.boundary,
        )

    def stalled(self, view: View, decision: Decision) -> StepResult:
        """The result of a step that stood down: ``NO_PROGRESS`` for a loop, ``LOST`` when
        another pending response to the cursor holds more."""
        ck = view.checkpoint
        return StepResult(
            outcome=StepOutcome.LOST if decision.lost else StepOutcome.NO_PROGRESS,
            classification=decision.classification,
            generation=ck.generation,
            boundary=ck.boundary,
        )

    def superseded(
        self, view: View, decision: Decision | None, applied: int = 0, skipped: int = 0
    ) -> StepResult:
        ck = view.checkpoint
        return StepResult(
            outcome=StepOutcome.SUPERSEDED,
            classification=decision.classification if decision else None,
            generation=ck.generation,
            boundary=ck.boundary,
            applied=applied,
            skipped=skipped,
        )

    @staticmethod
    def moved(before: View, after: View) -> bool:
        a, b = before.checkpoint, after.checkpoint
        return (a.generation, a.cursor_digest) != (b.generation, b.cursor_digest)
