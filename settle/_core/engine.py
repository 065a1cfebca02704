"""Plan each script call and decode its reply: every rule a shell needs, with no I/O.

A shell method is three steps: ``call = core.plan_x(...)``, ``raw = backend.run(call)``,
``return core.decode_x(call, raw)``. The sync and async shells, and the in-memory reference
backend, all go through here, so validation, encoding, decoding and logging exist once.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from logging import DEBUG, INFO
from typing import Any, Generic, Protocol, TypeVar

from settle._core import codec, heartbeat
from settle._core.keys import Keys, check_binding, check_operation_id, has_control, shard_of
from settle._core.layout import hex_arg, stored_arg, stored_digest
from settle._input import is_decimal, is_utf8
from settle._log import binding_digest, logger, operation_digest
from settle._log import enabled as log_enabled
from settle._runtime.calls import Call, Unacknowledged, packs_plain
from settle.config import CLAIM_GRACE_MS, MAX_SHARDS, SettleConfig
from settle.errors import (
    BindingMismatch,
    ConfigurationError,
    CorruptRecord,
    FingerprintMismatch,
    InvalidInput,
    QuarantineNotFound,
)
from settle.fingerprint import FINGERPRINT_VERSION, fingerprint
from settle.models import (
    Action,
    AttemptObservation,
    InProgress,
    OperationRecord,
    QuarantineEntry,
    QuarantineHeader,
    QuarantineKind,
    Renewal,
    Replay,
    Reservation,
    Reserved,
    Resolution,
    Settlement,
    StoredFailure,
    TrimResult,
    Verdict,
    _trusted,
    ms_to_datetime,
)

__all__ = [
    "MAX_LEASE",
    "MAX_NOTE_CHARS",
    "Call",
    "Core",
    "QuarantineFollower",
    "QuarantineQuery",
    "QuarantineScan",
    "QuarantineTrim",
]

_STREAM_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
_ATTEMPT_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,64}")
_MAX_REASON = 256
_VERDICTS = {v.value: v for v in Verdict}
_QUARANTINE_SCAN_BUDGET = 4096
#: The most records one ``get_many`` script call reads (all of one shard: one slot).
GET_MANY = 100


#: The longest lease a reservation or a renewal may ask for (seconds).
MAX_LEASE = 86_400
#: The longest resolution note, in characters (code points) of any kind.
MAX_NOTE_CHARS = 4096
#: The most quarantine entries one listing returns (``quarantine.list(limit=...)``, the
#: CLI's ``--limit``, the console's overview).
MAX_LISTING = 100_000
#: How far past ``until`` a window reads the streams (by stream id, in ms): an entry's ``at``
#: (the script's TIME) can be before its id's time (a script that crosses a millisecond on
#: Redis 6.2 / 7.0; a stream whose last id ran ahead of the server's clock after a failover
#: to a node whose clock is behind). A window selects by ``at``, so the entries of ids up to
#: this far past ``until`` are read and those whose ``at`` is past it left out
#: (docs/concepts.md, "The quarantine").
UNTIL_SLACK_MS = 5 * 60 * 1000
#: How far before ``since`` a window reads the streams (ms): an entry's ``at`` can also be a
#: little after its id's time, where ``XADD *`` takes the time frozen when the script began
#: (Redis 7.2 and later) while ``TIME`` reads the clock a moment later: a script that crossed
#: a millisecond before it read the clock.
SINCE_SLACK_MS = 1000


def _check_seconds(value: object, what: str, operation_id: str | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{what} must be a number of seconds", operation_id=operation_id)
    # In milliseconds from the number as an exact float: a subclass's own arithmetic (an
    # int or float subclass whose ``__mul__`` or ``__round__`` answers what it likes) made
    # its answer the ms sent, an integer beyond 64 bits among them, which hiredis crashes the
    # process on (a reserve's call is packed without a look at its arguments: Call.plain).
    try:
        ms = round(float(value) * 1000)
    except (TypeError, ValueError, OverflowError):  # not the number it compared as
        ms = -1
    if not 0 < value <= MAX_LEASE or not 0 <= ms <= MAX_LEASE * 1000:
        try:
            got = f", got {value}"
        except ValueError:  # an integer of more digits than Python makes text of
            got = ""
        raise InvalidInput(
            f"{what} must be more than 0 and at most {MAX_LEASE} seconds{got}",
            operation_id=operation_id,
        )
    return max(1, ms)


def _check_flag(value: object, name: str) -> bool:
    """A yes/no option: True or False only. Read by its truth value, the string "false" (a
    setting from a config file, an environment variable, a form) was yes: ``trim`` then
    deleted the unresolved evidence it was told to keep."""
    if not isinstance(value, bool):
        raise InvalidInput(f"{name} must be True or False, got {value!r}")
    return value


def _check_reason(reason: object, operation_id: str) -> str:
    if not isinstance(reason, str) or not 1 <= len(reason) <= _MAX_REASON:
        raise InvalidInput(
            f"reason must be a str of 1 to {_MAX_REASON} characters", operation_id=operation_id
        )
    if has_control(reason):
        raise InvalidInput(
            "reason must not contain control characters or line separators (it is shown to "
            "operators as it is)",
            operation_id=operation_id,
        )
    return reason


def _fingerprint_arg(fingerprint: object) -> bytes | None:
    """The fingerprint's :func:`stored_arg` when it is 64 lowercase hex digits, else None:
    checked as it is converted, where a match and then the conversion read it twice."""
    if isinstance(fingerprint, str) and len(fingerprint) == 64:
        return hex_arg(fingerprint)
    return None


def _attempt_arg(attempt_id: object) -> str | bytes | None:
    """The attempt id's :func:`stored_arg` when it is 1 to 64 characters of A-Z a-z 0-9 _ .
    : - (:data:`_ATTEMPT_ID`), else None. A hex one (settle draws them so) is all of those
    characters already: converted without the match."""
    if not isinstance(attempt_id, str) or len(attempt_id) > 64:
        return None
    arg = hex_arg(attempt_id)
    if arg is not None:
        return arg
    # Never starts with NUL: stored_arg sends it as it is.
    return attempt_id if _ATTEMPT_ID.fullmatch(attempt_id) else None


def _check_reservation(reservation: object) -> tuple[Reservation, bytes, str | bytes]:
    """A Reservation may be hand-built or deserialized: check what reaches the scripts.
    Returned with its fingerprint's and its attempt id's :func:`stored_arg`."""
    if not isinstance(reservation, Reservation):
        raise InvalidInput(
            f"expected the Reservation returned by reserve(), got {type(reservation).__name__}"
        )
    op = check_operation_id(reservation.operation_id)
    check_binding(reservation.binding, op)
    fp_arg = _fingerprint_arg(reservation.fingerprint)
    aid_arg = _attempt_arg(reservation.attempt_id)
    if fp_arg is None or aid_arg is None:
        raise InvalidInput("reservation has a malformed fingerprint or attempt_id", operation_id=op)
    # model_construct / model_copy(update=...) skip the model's own checks: a str or a bool
    # was a TypeError or a BackendError, a number past 2**53 (no script issues one, nor
    # holds one exactly) was judged by the script and quarantined.
    for name in ("generation", "fingerprint_version"):
        value = getattr(reservation, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**53:
            raise InvalidInput(
                f"reservation {name} must be an int from 1 to 2**53 - 1", operation_id=op
            )
    return reservation, fp_arg, aid_arg


@dataclass
class Core:
    """The rules of one namespace, shared by every shell."""

    config: SettleConfig
    keys: Keys = field(init=False)
    #: Per shard: its quarantine keys (stream, resolutions, identities) and its state key,
    #: formatted once (every settlement names all four).
    _shard_keys: dict[int, tuple[str, str, str, str]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )
    #: Losses of a shard's state said (``settle.namespace.state_lost``), and whether the
    #: last one's shards are not all claimed again yet: see :meth:`loss_mark`.
    _losses_said: int = field(init=False, repr=False, compare=False, default=0)
    _reclaiming: bool = field(init=False, repr=False, compare=False, default=False)
    _loss_lock: threading.Lock = field(
        init=False, repr=False, compare=False, default_factory=threading.Lock
    )
    #: The namespace metadata's age in ms on the server clock when last checked (None: it
    #: has no ``created``, or was not found): see :meth:`decode_claims`.
    _meta_age_ms: int | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        self.keys = Keys(self.config.namespace, self.config.shards)
        # The config is frozen: its derived numbers, read on every call, computed once.
        self._lease_ms = self.config.lease_ms
        self._retention_ms = self.config.retention_ms
        # And the fields every reserve and settlement reads, read once: a pydantic model's
        # field is read through its class's ``__getattr__`` hook (~500 instructions), a
        # plain attribute in a few dozen.
        self._namespace = self.config.namespace
        self._shards = self.config.shards
        self._attempt_log_size = self.config.attempt_log_size
        self._max_result_bytes = self.config.max_result_bytes
        self._quarantine_args = (
            self.config.quarantine_payload_bytes,
            self.config.quarantine_maxlen or "",
        )
        #: Whether the config's numbers that every reserve and settlement sends are ones
        #: hiredis packs as they are (:func:`packs_plain`; ``quarantine_payload_bytes`` has
        #: no upper bound): then those calls, whose other arguments are the text, bytes and
        #: bounded integers their planners checked or made, are marked ``plain``.
        self._plain = packs_plain(
            (
                self._lease_ms,
                self._retention_ms,
                self._attempt_log_size,
                self._shards,
                *self._quarantine_args,
            )
        )
        #: (shard, record key, log key) of recent operations: a settlement follows its
        #: reserve, and hashing the id again costs as much as the rest of its keys.
        self._keys_of = functools.lru_cache(maxsize=512)(self.keys.of)

    def _keys_of_shard(self, shard: int) -> tuple[str, str, str, str]:
        found = self._shard_keys.get(shard)
        if found is None:
            found = (*self.keys.quarantine_keys(shard), self.keys.generation(shard))
            self._shard_keys[shard] = found
        return found

    # -- start-up ------------------------------------------------------------------------

    def plan_namespace(self, *, create: bool = False) -> Call:
        """Check the namespace metadata; ``create`` writes it when it is missing, which a
        client asks for only after every surviving shard state agreed with its count
        (``plan_claims(claim=False)``): a client refused by a shard never re-creates the
        metadata with its own count, locking out every correct client."""
        return Call(
            "namespace",
            (self.keys.meta,),
            (self.config.shards, FINGERPRINT_VERSION, "1" if create else "0"),
            # The check alone writes nothing: no WAIT, so a settler started while its
            # replicas are down still reads (min_replicas).
            reads_only=not create,
        )

    def plan_claims(self, *, claim: bool = True) -> list[Call]:
        """One ``claim`` per shard, sent right after the namespace metadata was checked: the
        first write on each shard then needs no second round trip. ``claim=False`` only
        checks each surviving shard state's count (a missing one is left missing)."""
        flag = "1" if claim else "0"
        return [
            Call("claim", (self.keys.generation(shard),), (self.config.shards, flag), shard=shard)
            for shard in range(self.config.shards)
        ]

    def decode_claims(self, calls: list[Call], raws: list[Any], *, starting: bool = False) -> None:
        """Raise for a shard claimed for another count (or a state key settle cannot read);
        an ``unclaimed`` answer to a check (``claim=False``) is a shard with no state yet.

        ``starting``: the claims of a settler's start-up. A shard whose state they had to
        make, under metadata older than :data:`CLAIM_GRACE_MS` (its creator claimed every
        shard right after making it), was lost, its records with it: said once
        (:meth:`_state_lost`), as a write that finds a state gone says it. The metadata
        outlives the shard states where one cluster node restarted empty or a DEL took
        them; a settler running then says it at its first write, one started after said
        nothing, and a retry of an operation whose completion was lost ran again."""
        for call, raw in zip(calls, raws, strict=True):
            self.claim(call, raw)
        if not calls or calls[0].args[-1] != "1":
            return
        self._reclaiming = False  # every shard claimed (again)
        age = self._meta_age_ms
        if not starting or age is None or age < CLAIM_GRACE_MS:
            return
        for call, raw in zip(calls, raws, strict=True):
            if codec.parse_reply(raw).detail == "claimed":
                self._state_lost(call)
                return

    def states_beyond(self) -> tuple[str, ...]:
        """The state keys of every shard this client does not use, up to the largest count a
        namespace can have. Asked only when the metadata is missing, before it is created: a
        client configured with fewer shards than the namespace's sees none of the states of
        the shards it lacks, so when the metadata and its own shards' states were lost (a
        node restarted without persistence, with the others intact), the states beyond its
        count are the only evidence left that the namespace has more shards."""
        generation = self.keys.generation
        return tuple(generation(shard) for shard in range(self.config.shards, MAX_SHARDS))

    def decode_beyond(self, found: Any) -> None:
        """Raise when any of :meth:`states_beyond`'s keys exists (``found``: EXISTS's
        count): the namespace was used with more shards than this client's, and creating
        its metadata with this count would send operations to other shards than the ones
        holding their records, so they would run again. ``None``: the user's ACL refuses
        EXISTS; the check is skipped with a warning (as before it existed) rather than
        refusing every start of a new namespace."""
        if found is None:
            logger.warning(
                "settle.namespace.beyond_unchecked",
                namespace=self.config.namespace,
                configured=self.config.shards,
                reason="EXISTS refused by the ACL",
            )
            return
        if not found:
            return
        logger.error(
            "settle.namespace.shard_mismatch",
            namespace=self.config.namespace,
            configured=self.config.shards,
            states_beyond=int(found),
        )
        raise ConfigurationError(
            f"namespace {self.config.namespace!r}: its metadata is missing, and {int(found)} "
            f"shard state(s) beyond this client's {self.config.shards} shards survive, so the "
            "namespace was created with more shards; nothing was written. The shard count of "
            "a namespace never changes: use the stored count (HGET a surviving "
            "settle:{<namespace>:<shard>}:gen key's field 'shards') or a new namespace."
        )

    def decode_namespace(self, raw: Any) -> bool:
        """True when the metadata names this client's shard count; False when there is none
        (asked without ``create``): check the shard states, then create it."""
        reply = codec.parse_reply(raw)
        self._meta_age_ms = None
        if reply.code == "absent":
            return False
        if reply.code == "ok" and reply.quarantine_id.isdigit():  # the metadata's ``created``
            self._meta_age_ms = reply.now_ms - int(reply.quarantine_id)
        if reply.code == "corrupt_state":
            raise self._corrupt_state(reply.detail, "metadata of the namespace", None)
        if reply.code != "ok":
            raise self._shard_mismatch(reply.detail, "the namespace")
        return True

    def _guarded(
        self, shard: int, keys: tuple[str, ...], args: tuple[Any, ...]
    ) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        """A writing call's KEYS and ARGV with the shard guard's own (``guard`` in
        lua/_lib.lua): the shard's state key last, then the shard count and claim flag."""
        return (*keys, self._keys_of_shard(shard)[3]), (*args, self._shards, "0")

    def loss_mark(self) -> int:
        """Taken just before a call is sent and given back to :meth:`claim` with its reply:
        a call that finds its shard's state gone says so only when no loss was said since
        it was sent, and none is being handled (the shards of the last one said are not all
        claimed again yet: -1). A busy process finds a loss with every call it has in
        flight: the first says it; the others found the same loss."""
        return -1 if self._reclaiming else self._losses_said

    @property
    def losses_said(self) -> int:
        """How many losses were said (:meth:`claim`): a shell re-checks the namespace once
        per loss said, for every call that found it."""
        return self._losses_said

    def _first_to_find(self, mark: int | None) -> bool:
        if mark is None:  # a caller that took no mark: said
            return True
        with self._loss_lock:
            if mark != self._losses_said:
                return False
            self._losses_said += 1
            self._reclaiming = True
            return True

    def claim(self, call: Call, raw: Any, mark: int | None = None) -> Call | None:
        """After a writing call: None when it ran; the same call with the claim flag set
        when its shard had no state (never used, or lost), to be sent again once the
        namespace metadata has been checked (``plan_namespace``). A shard claimed for
        another shard count raises :class:`ConfigurationError`: nothing was written.
        ``mark``: :meth:`loss_mark` before the call was sent."""
        code = raw[0] if isinstance(raw, list | tuple) and raw else None
        if code in (b"unclaimed", "unclaimed") and call.args[-1] == "0":
            if call.script != "claim" and self._first_to_find(mark):
                self._state_lost(call)
            return replace(call, args=(*call.args[:-1], "1"))
        if code in (b"shard_mismatch", "shard_mismatch"):
            raise self._shard_mismatch(codec.parse_reply(raw).detail, "this shard")
        if code in (b"corrupt_state", "corrupt_state"):
            detail = codec.parse_reply(raw).detail
            raise self._corrupt_state(detail, "state of a shard", call.operation_id)
        return None

    def _state_lost(self, call: Call) -> None:
        """A write found its shard's state gone. The shells claim every shard before their
        first write (``plan_claims``), so Redis lost it since: a restart without
        persistence, a FLUSHALL, an eviction, a failover that dropped writes, or a DEL. The
        shard is claimed again and the call goes on (generations stay above every earlier
        one: docs/concepts.md, "Generations"), but the shard's records may be gone with it,
        and an operation whose completed record was lost runs again on its next retry:
        an operator must hear of it (docs/operations.md, "When Redis forgets")."""
        logger.error(
            "settle.namespace.state_lost",
            namespace=self.config.namespace,
            state_key=call.keys[-1],
            script=call.script,
            operation_digest=operation_digest(call.operation_id) if call.operation_id else None,
        )

    def _corrupt_state(self, key: str, what: str, operation_id: str | None) -> CorruptRecord:
        logger.error(
            "settle.namespace.corrupt_state", namespace=self.config.namespace, state_key=key
        )
        return CorruptRecord(
            f"namespace {self.config.namespace!r}: the {what}, key {key!r}, is not a hash "
            "(something other than settle wrote it); nothing was written. Inspect it with "
            "redis-cli TYPE / DUMP before repairing or deleting it: settle never overwrites "
            "what it cannot read.",
            operation_id=operation_id,
        )

    def _shard_mismatch(self, stored: str, where: str) -> ConfigurationError:
        logger.error(
            "settle.namespace.shard_mismatch",
            namespace=self.config.namespace,
            stored=stored,
            configured=self.config.shards,
        )
        # A shard's state that disagrees with a count the metadata shares (the metadata made
        # again with another count after its shards were) sent an operator in a circle: "use
        # the stored count" when the client already did, and --shards refused by the metadata.
        again = (
            " If the namespace's metadata holds this client's count, it was made again with "
            "another count after its shards were: settle doctor shows the metadata's count "
            "and each shard's."
            if where == "this shard"
            else ""
        )
        return ConfigurationError(
            f"namespace {self.config.namespace!r}: {where} was created for {stored} shards, "
            f"this client is configured with {self.config.shards}; nothing was written. The "
            "shard count of a namespace never changes: use the stored count or a new namespace."
            + again
        )

    # -- reserve -------------------------------------------------------------------------

    def plan_reserve(
        self,
        operation_id: str,
        request: Any,
        *,
        principal: str,
        lease: float | None = None,
        fingerprint: str | None = None,
        attempt_id: str | None = None,
    ) -> Call:
        op = check_operation_id(operation_id)
        binding = check_binding(principal, op)
        lease_ms = self._lease_ms if lease is None else _check_seconds(lease, "lease", op)
        # The fingerprint and the attempt id in the form the script stores them (stored_arg),
        # checked as they are converted.
        fp_arg: str | bytes | None
        aid_arg: str | bytes | None
        if fingerprint is None:
            fp_arg = stored_arg(_fingerprint_of(request, op))
        elif (fp_arg := _fingerprint_arg(fingerprint)) is None:
            raise InvalidInput("fingerprint must be 64 lowercase hex digits", operation_id=op)
        if attempt_id is None:
            drawn = os.urandom(16)
            aid, aid_arg = drawn.hex(), b"\0" + drawn
        elif (aid_arg := _attempt_arg(attempt_id)) is not None:
            aid = attempt_id
        else:
            raise InvalidInput(
                "attempt_id must be 1 to 64 characters of A-Z a-z 0-9 _ . : -", operation_id=op
            )
        shard, record, log = self._keys_of(op)
        keys, args = self._guarded(
            shard,
            (record, log),
            (
                op,
                fp_arg,
                FINGERPRINT_VERSION,
                binding,
                lease_ms,
                self._retention_ms,
                aid_arg,
                self._attempt_log_size,
            ),
        )
        return Call("reserve", keys, args, operation_id=op, attempt_id=aid, plain=self._plain)

    def decode_reserve(self, call: Call, raw: Any) -> Reserved | Replay | InProgress:
        reply = codec.parse_reply(raw)
        op = call.operation_id or ""
        ns = self._namespace
        if reply.code == "fingerprint_mismatch":
            logger.warning(
                "settle.reserve.rejected",
                namespace=ns,
                operation_digest=operation_digest(op),
                reason="fingerprint_mismatch",
            )
            raise FingerprintMismatch(
                f"operation {op!r} is bound to a different request; a changed request needs "
                "its own operation id",
                operation_id=op,
            )
        if reply.code == "binding_mismatch":
            logger.warning(
                "settle.reserve.rejected",
                namespace=ns,
                operation_digest=operation_digest(op),
                reason="binding_mismatch",
                binding_digest=binding_digest(str(call.args[3])),
            )
            raise BindingMismatch(
                f"operation {op!r} is bound to another principal; use another operation id",
                operation_id=op,
            )
        record = self._record(reply, op)
        # The models below are built from our own decoded record: no second validation.
        if reply.code == "reserved":
            takeover = reply.detail if reply.detail in ("lease_expired", "provisional") else None
            if log_enabled(INFO):
                logger.info(
                    "settle.reserve.reserved",
                    namespace=ns,
                    operation_digest=operation_digest(op),
                    generation=record.generation,
                    version=record.version,
                    takeover=takeover,  # as Reserved.takeover and the span: None if none
                    resumed=reply.detail == "resumed",
                    attempt_id=call.attempt_id,
                )
            reservation = _trusted(
                Reservation,
                {
                    "operation_id": op,
                    "fingerprint": record.fingerprint,
                    "fingerprint_version": record.fingerprint_version,
                    "binding": record.binding,
                    "generation": record.generation,
                    "attempt_id": call.attempt_id or "",
                },
            )
            return _trusted(
                Reserved, {"reservation": reservation, "record": record, "takeover": takeover}
            )
        if reply.code == "replay":
            if log_enabled(INFO):
                logger.info(
                    "settle.reserve.replayed",
                    namespace=ns,
                    operation_digest=operation_digest(op),
                    generation=record.generation,
                    state=record.state.value,
                )
            return _trusted(Replay, {"record": record})
        if reply.code == "in_progress":
            if log_enabled(INFO):
                logger.info(
                    "settle.reserve.in_progress",
                    namespace=ns,
                    operation_digest=operation_digest(op),
                    generation=record.generation,
                )
            assert record.lease_expires_at is not None
            return _trusted(
                InProgress,
                {
                    "operation_id": op,
                    "generation": record.generation,
                    "lease_expires_at": record.lease_expires_at,
                    "record": record,
                },
            )
        raise CorruptRecord(f"unexpected reserve reply {reply.code!r}", operation_id=op)

    # -- settlements ---------------------------------------------------------------------

    def plan_complete(
        self, reservation: Reservation, result: Any, *, expected_version: int | None = None
    ) -> Call:
        checked = _check_reservation(reservation)
        op = checked[0].operation_id
        payload = codec.encode_result(result, self._max_result_bytes, op)
        return self._plan_settle(Action.COMPLETE, checked, payload, "", expected_version)

    def plan_fail(
        self,
        reservation: Reservation,
        error: BaseException | StoredFailure | Any,
        *,
        expected_version: int | None = None,
    ) -> Call:
        checked = _check_reservation(reservation)
        op = checked[0].operation_id
        payload = codec.encode_failure(error, self._max_result_bytes, op)
        return self._plan_settle(Action.FAIL, checked, payload, "", expected_version)

    def plan_mark_provisional(
        self, reservation: Reservation, reason: str, *, expected_version: int | None = None
    ) -> Call:
        checked = _check_reservation(reservation)
        text = _check_reason(reason, checked[0].operation_id)
        return self._plan_settle(Action.MARK_PROVISIONAL, checked, b"", text, expected_version)

    def _plan_settle(
        self,
        action: Action,
        checked: tuple[Reservation, bytes, str | bytes],
        payload: bytes,
        reason: str,
        expected_version: int | None,
    ) -> Call:
        r, fp_arg, aid_arg = checked  # what _check_reservation returned
        if expected_version is not None and (
            isinstance(expected_version, bool)
            or not isinstance(expected_version, int)
            or not 1 <= expected_version < 2**53
        ):
            raise InvalidInput(
                "expected_version must be an int from 1 to 2**53 - 1 (a record's version)",
                operation_id=r.operation_id,
            )
        op = r.operation_id  # checked with the reservation
        shard, record, log = self._keys_of(op)
        keys, args = self._guarded(
            shard,
            (record, log, *self._keys_of_shard(shard)[:3]),
            (
                op,
                fp_arg,
                r.fingerprint_version,
                r.binding,
                r.generation,
                "" if expected_version is None else expected_version,
                aid_arg,
                payload,
                stored_digest(payload),
                reason,
                self._retention_ms,
                self._attempt_log_size,
                *self._quarantine_args,
            ),
        )
        return Call(
            action.value,
            keys,
            args,
            operation_id=op,
            attempt_id=r.attempt_id,
            action=action,
            shard=shard,
            plain=self._plain,
        )

    def decode_settlement(self, call: Call, raw: Any) -> Settlement:
        reply = codec.parse_reply(raw)
        op = call.operation_id or ""
        assert call.action is not None
        if reply.code == "corrupt":
            raise self._corrupt(op)
        try:
            verdict = _VERDICTS.get(reply.code) or Verdict(reply.code)
            kind = QuarantineKind(reply.detail) if reply.detail else None
        except ValueError as exc:
            raise CorruptRecord(
                f"{call.script} answered {reply.code!r}/{reply.detail!r}, which this settle "
                "version does not know: run one settle version against a namespace",
                operation_id=op,
            ) from exc
        record = self._record(reply, op) if reply.payload else None
        qid = f"{call.shard}/{reply.quarantine_id}" if reply.quarantine_id else None
        if verdict is not Verdict.QUARANTINED and not log_enabled(INFO):
            return _settlement(verdict, call.action, op, record, qid, kind, reply.repeated)
        fields: dict[str, Any] = {
            "namespace": self.config.namespace,
            "operation_digest": operation_digest(op),
            "action": call.action.value,
            "generation": int(call.args[4]),
            "attempt_id": call.attempt_id,
        }
        if record is not None:
            fields.update(state=record.state.value, version=record.version)
        if verdict is Verdict.QUARANTINED:
            logger.warning(
                "settle.settlement.quarantined",
                kind=reply.detail,
                quarantine_id=qid,
                repeated=reply.repeated,
                **fields,
            )
            if reply.dropped:
                logger.warning(
                    "settle.quarantine.maxlen_dropped_unresolved",
                    namespace=self.config.namespace,
                    shard=call.shard,
                    dropped=reply.dropped,
                    maxlen=self.config.quarantine_maxlen,
                    # said again by a repeat: of a call whose reply was lost, or a later
                    # delivery of the same response (the drop its entry's write made)
                    repeated=reply.repeated,
                )
        else:
            logger.info(f"settle.settlement.{verdict.value}", **fields)
        return _settlement(verdict, call.action, op, record, qid, kind, reply.repeated)

    # -- renew, get, attempts ------------------------------------------------------------

    def plan_renew(self, reservation: Reservation, *, lease: float | None = None) -> Call:
        r, fp_arg, _ = _check_reservation(reservation)
        op = check_operation_id(r.operation_id)
        lease_ms = self._lease_ms if lease is None else _check_seconds(lease, "lease", op)
        shard, record, log = self._keys_of(op)
        keys, args = self._guarded(
            shard,
            (record, log),
            (
                fp_arg,
                r.fingerprint_version,
                r.binding,
                r.generation,
                lease_ms,
                self._retention_ms,
            ),
        )
        # A lost lease (rules N1-N5) writes nothing and stops the attempt: it stands without
        # replicas (Call.stops), so a takeover stops a fenced-off attempt at once. It waits
        # for its replicas at most a heartbeat (lease / 3): the next renewal is then due.
        return Call(
            "renew",
            keys,
            args,
            operation_id=op,
            attempt_id=r.attempt_id,
            stops=("lost",),
            wait_ms=heartbeat.interval_ms(lease_ms),
        )

    def decode_renew(self, call: Call, raw: Any) -> Renewal:
        unacknowledged = isinstance(raw, Unacknowledged)  # lost, and no replica confirmed it
        reply = codec.parse_reply(raw.reply if unacknowledged else raw)
        op = call.operation_id or ""
        if reply.code == "corrupt":
            raise self._corrupt(op)
        record = self._record(reply, op) if reply.payload else None
        if unacknowledged and reply.detail != "lease_expired":
            # The record the primary showed (another attempt's completion, say) may not
            # survive a failover: the verdict stops the attempt, and nothing of the record is
            # handed on (an HTTP guard would replay it). A lease that only lapsed keeps its
            # record: it is this attempt's own, and says the attempt runs on (lapsed).
            record = None
        renewed = reply.code == "renewed"
        # A renewal is a heartbeat: its event (and the digest's HMAC) only when it is written.
        if not renewed or log_enabled(DEBUG):
            log = logger.bind(
                namespace=self.config.namespace,
                operation_digest=operation_digest(op),
                generation=int(call.args[3]),
            )
            if renewed:
                assert record is not None
                log.debug("settle.renew.renewed", lease_expires_at=record.lease_expires_at)
            else:
                log.warning("settle.renew.lost", reason=reply.detail)
        if renewed:
            assert record is not None
            return Renewal(renewed=True, lease_expires_at=record.lease_expires_at, record=record)
        return Renewal(renewed=False, reason=reply.detail, record=record)

    def plan_get(self, operation_id: str) -> Call:
        op = check_operation_id(operation_id)
        return Call("get", (self.keys.record(op),), (), operation_id=op)

    def decode_get(self, call: Call, raw: Any) -> OperationRecord | None:
        reply = codec.parse_reply(raw)
        if reply.code == "corrupt":
            raise self._corrupt(call.operation_id or "")
        if reply.code == "missing":
            return None
        return self._record(reply, call.operation_id or "")

    def plan_get_many(self, operation_ids: list[str]) -> list[Call]:
        """Script calls that read the records of ``operation_ids``: one per shard and at
        most :data:`GET_MANY` records each, so every call touches one slot (a cluster too)
        and a batch costs a bounded number of calls, not one per record."""
        if not isinstance(operation_ids, list | tuple):
            raise InvalidInput(
                f"get_many takes a list of operation ids, not a {type(operation_ids).__name__}"
            )
        by_shard: dict[int, list[str]] = {}
        # Each id is checked before the duplicates go: an unhashable one (a list) is
        # InvalidInput, not the TypeError of the dict that drops them.
        for op in dict.fromkeys([check_operation_id(o) for o in operation_ids]):
            by_shard.setdefault(shard_of(op, self.keys.shards), []).append(op)
        return [
            Call("get_many", tuple(map(self.keys.record, ops[i : i + GET_MANY])), (), shard=s)
            for s, ops in sorted(by_shard.items())
            for i in range(0, len(ops), GET_MANY)
        ]

    @staticmethod
    def record_by_record(call: Call) -> list[Call]:
        """``call``, a ``get_many``, as one call per record (decoded alike by
        :meth:`decode_get_many`): one key each, which a Redis Cluster node serves while the
        slot migrates, after ASK if it moved. A call of several records is refused
        (TRYAGAIN) while the migration splits them, or while one has no record."""
        return [replace(call, keys=(key,)) for key in call.keys]

    def decode_get_many(
        self, operation_ids: list[str], calls: list[Call], raws: list[Any]
    ) -> list[OperationRecord | None]:
        """The records of ``operation_ids`` in their order (None: no record), as
        :meth:`decode_get` decodes each one."""
        found: dict[str, OperationRecord | None] = {}
        for call, raw in zip(calls, raws, strict=True):
            assert call.shard is not None
            reply = codec.parse_reply(raw)
            skip = len(self.keys.tag(call.shard)) + len(":op:")
            for key, (code, *row) in zip(call.keys, reply.payload, strict=True):
                op = key[skip:]
                if code in (b"missing", "missing"):
                    found[op] = None
                elif code not in (b"found", "found"):  # 'corrupt'
                    raise self._corrupt(op)
                else:
                    try:
                        found[op] = codec.decode_record(row[0], reply.now_ms)
                    except CorruptRecord as exc:
                        raise self._corrupt(op) from exc
        return [found[op] for op in operation_ids]

    def plan_attempts(self, operation_id: str) -> Call:
        op = check_operation_id(operation_id)
        _shard, record, log = self._keys_of(op)
        return Call("attempts", (record, log), (), operation_id=op)

    @staticmethod
    def record_only(call: Call) -> Call:
        """``call``, an ``attempts`` read, on the record alone: one key, which a Redis
        Cluster node serves while the slot migrates, after ASK if it moved. The call of two
        keys is refused (TRYAGAIN) while the migration splits them, and while the previous
        layout's attempt log (its second key) does not exist, which is nearly always. A
        record of the current layout holds its log; a previous layout's record (a HASH)
        gives an empty one: :meth:`attempts_apart` adds that layout's log, read apart."""
        return replace(call, keys=call.keys[:1])

    @staticmethod
    def attempts_apart(raw: Any, legacy: Sequence[Any]) -> Any:
        """The reply of an ``attempts`` call from its :meth:`record_only` read's ``raw`` and
        ``legacy``, the previous layout's log list (LRANGE of its newest ``LOG_MAX``
        entries), read before it and only when the record was a HASH then (else empty):
        that log is the answer when the record's read found none (the record still in that
        layout: a write would have moved the log into the record, and deleted the list), as
        the script reads it (an entry of fewer than 6 fields left out)."""
        if not isinstance(raw, list) or len(raw) < 5 or raw[4] or not legacy:
            return raw
        if raw[0] not in (b"ok", "ok"):
            return raw
        kept = [e for e in legacy if (e.count(b"|") if isinstance(e, bytes) else 0) >= 5]
        return [*raw[:4], kept]

    def decode_attempts(self, call: Call, raw: Any) -> list[AttemptObservation]:
        reply = codec.parse_reply(raw)
        if reply.code == "corrupt":
            raise self._corrupt(call.operation_id or "")
        return codec.decode_attempts(reply.payload)

    # -- quarantine ----------------------------------------------------------------------

    def quarantine_query(
        self,
        *,
        kind: QuarantineKind | str | None = None,
        operation_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        unresolved: bool = False,
        limit: int = 100,
        newest_first: bool = True,
        start: tuple[int, int] | None = None,
    ) -> QuarantineQuery[QuarantineEntry]:
        """``start``: a stream id ``(ms, seq)`` the listing starts at, in its direction,
        inclusive (the console's cursor: every shard is read from there, and the entries
        with that very id are the only ones read again). :meth:`QuarantineQuery.headers`
        plans the same listing of headers."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LISTING:
            raise InvalidInput(f"limit must be an int from 1 to {MAX_LISTING}")
        _check_flag(newest_first, "newest_first")
        window = _Window.of(since, until)
        low, high = window.stream_range()
        if start is not None and newest_first:
            high = "-".join(map(str, min(_id_bound(high, (2**64, 0)), start)))
        elif start is not None:
            low = "-".join(map(str, max(_id_bound(low, (-1, 0)), start)))
        return QuarantineQuery(
            self,
            _Reads(False, self._entries),
            self._shards_for(operation_id),
            _Filter.of(kind, operation_id, unresolved),
            window,
            low,
            high,
            limit,
            newest_first,
        )

    def quarantine_scan(
        self,
        *,
        kind: QuarantineKind | str | None = None,
        operation_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        unresolved: bool = False,
    ) -> QuarantineScan[QuarantineEntry]:
        """Every matching entry, oldest first, read in pages: memory stays bounded by
        :data:`SCAN_HELD` entries whatever the quarantine holds. :meth:`QuarantineScan.headers`
        plans the same walk of headers."""
        window = _Window.of(since, until)
        return QuarantineScan(
            self,
            _Reads(False, self._entries),
            self._shards_for(operation_id),
            _Filter.of(kind, operation_id, unresolved),
            window,
        )

    def quarantine_follower(
        self,
        *,
        kind: QuarantineKind | str | None = None,
        operation_id: str | None = None,
        unresolved: bool = False,
        since: datetime | None = None,
        poll_interval: float = 0.5,
    ) -> QuarantineFollower:
        """``poll_interval`` is only checked here (the shell sleeps it): a bad one failed
        with the sleep's own error once the follower was first idle."""
        if (
            isinstance(poll_interval, bool)
            or not isinstance(poll_interval, int | float)
            or not 0 <= poll_interval <= 3600  # NaN fails too
        ):
            raise InvalidInput(
                f"poll_interval must be a number of seconds from 0 to 3600, got {poll_interval!r}"
            )
        return QuarantineFollower(
            self, self._shards_for(operation_id), _Filter.of(kind, operation_id, unresolved), since
        )

    def plan_quarantine_lookup(self, ref: str) -> list[Call]:
        """Calls that find one entry by ``shard/id`` (or a bare id, searched in every shard)."""
        if not isinstance(ref, str):
            raise InvalidInput("quarantine id must be a str such as '3/1733130000000-0'")
        shard_text, _, entry_id = ref.rpartition("/")
        if not _STREAM_ID.fullmatch(entry_id) or (shard_text and not is_decimal(shard_text)):
            raise InvalidInput(f"{ref!r} is not a quarantine id (shard/ms-seq or ms-seq)")
        if any(int(part) >= 2**64 for part in entry_id.split("-")):
            raise InvalidInput(
                f"{ref!r} is not a quarantine id: both numbers of a stream id (ms-seq) are "
                "below 2^64; copy the id as it is listed"
            )
        shards = [int(shard_text)] if shard_text else list(range(self.keys.shards))
        if any(s >= self.keys.shards for s in shards):
            raise QuarantineNotFound(f"no quarantine entry {ref!r} in this namespace")
        return [self._read_call(s, entry_id, entry_id, 1, 1, _Filter(), False) for s in shards]

    def decode_quarantine_lookup(
        self, ref: str, calls: list[Call], raws: list[Any]
    ) -> QuarantineEntry:
        found = self._looked_up(ref, calls, raws, self._entries)
        assert isinstance(found, QuarantineEntry)
        return found

    def decode_quarantine_lookup_or_mark(
        self, ref: str, calls: list[Call], raws: list[Any]
    ) -> QuarantineEntry | codec.UndecodableEntry:
        """:meth:`decode_quarantine_lookup`, with an entry this version cannot decode as
        an :class:`~settle._core.codec.UndecodableEntry` (the console's entry page)."""
        return self._looked_up(ref, calls, raws, self._entries_or_marks)

    def _looked_up(
        self,
        ref: str,
        calls: list[Call],
        raws: list[Any],
        decode: Callable[[Call, codec.Reply], Sequence[QuarantineEntry | codec.UndecodableEntry]],
    ) -> QuarantineEntry | codec.UndecodableEntry:
        found: list[QuarantineEntry | codec.UndecodableEntry] = []
        for call, raw in zip(calls, raws, strict=True):
            found.extend(decode(call, codec.parse_reply(raw)))
        if not found:
            raise QuarantineNotFound(f"no quarantine entry {ref!r} in this namespace")
        if len(found) > 1:
            refs = ", ".join(e.ref for e in found)
            raise InvalidInput(f"quarantine id {ref!r} is ambiguous; use one of: {refs}")
        return found[0]

    def check_note(self, note: object, operation_id: str | None = None) -> str:
        """A resolution note, checked before its entry is looked up: a bad note is
        ``InvalidInput`` whether or not the entry exists (it was ``QuarantineNotFound`` for a
        missing one, exit 1 in the CLI instead of 2, after a read)."""
        if not isinstance(note, str) or not 1 <= len(note) <= MAX_NOTE_CHARS:
            raise InvalidInput(
                f"note must be a str of 1 to {MAX_NOTE_CHARS} characters",
                operation_id=operation_id,
            )
        if not is_utf8(note):  # a lone surrogate is a Cs "control" too: say what it is
            raise InvalidInput(
                "note must not contain a lone surrogate (bytes that were not UTF-8 text): "
                "type it again as text",
                operation_id=operation_id,
            )
        if has_control(note):
            raise InvalidInput(
                "note must not contain control characters or line breaks: write it on one "
                "line (it is kept with the evidence and shown to operators as it is)",
                operation_id=operation_id,
            )
        return note

    def plan_resolve(self, entry: QuarantineEntry, note: str) -> Call:
        self.check_note(note, entry.operation_id)
        keys, args = self._guarded(
            entry.shard,
            (self.keys.quarantine(entry.shard), self.keys.resolutions(entry.shard)),
            (entry.id, note),
        )
        return Call(
            "quarantine_resolve",
            keys,
            args,
            operation_id=entry.operation_id,
            shard=entry.shard,
        )

    def decode_resolve(self, call: Call, raw: Any) -> Resolution:
        reply = codec.parse_reply(raw)
        ref = f"{call.shard}/{call.args[0]!s}"
        if reply.code == "missing":
            raise QuarantineNotFound(f"no quarantine entry {ref!r} in this namespace")
        resolution = codec.decode_resolution(reply.payload[0])
        assert resolution is not None
        logger.info(
            "settle.quarantine.resolved",
            namespace=self.config.namespace,
            operation_digest=operation_digest(call.operation_id),
            quarantine_id=ref,
            already_resolved=reply.code == "already_resolved",
        )
        return resolution

    def quarantine_trim(
        self, *, older_than: float | None = None, include_unresolved: bool = False
    ) -> QuarantineTrim:
        """Explicit retention: resolved entries (older than ``older_than`` seconds on the
        server clock, when given) go with their resolutions; unresolved evidence only with
        ``include_unresolved=True``, which needs ``older_than``."""
        _check_flag(include_unresolved, "include_unresolved")
        age_ms = ""
        if older_than is not None:
            if isinstance(older_than, bool) or not isinstance(older_than, int | float):
                raise InvalidInput("older_than must be a number of seconds")
            if not 0 < older_than <= 100 * 365 * 86_400:
                raise InvalidInput("older_than must be more than 0 seconds and at most 100 years")
            age_ms = str(round(older_than * 1000))
        if include_unresolved and not age_ms:
            raise InvalidInput(
                "include_unresolved deletes evidence nobody resolved: it needs older_than "
                "(a horizon such as 90 days) so that recent entries stay"
            )
        return QuarantineTrim(self, list(range(self.keys.shards)), age_ms, include_unresolved)

    def _trim_call(self, shard: int, low: str, age_ms: str, everything: bool) -> Call:
        # The token: a repeat of this call (its reply lost) gets this call's reply back,
        # with the entries it deleted counted (lua/quarantine_trim.lua).
        keys, args = self._guarded(
            shard,
            (*self.keys.quarantine_keys(shard), self.keys.trimmed(shard)),
            (
                low,
                age_ms,
                "1" if everything else "0",
                _QUARANTINE_SCAN_BUDGET,
                os.urandom(16).hex(),
            ),
        )
        return Call("quarantine_trim", keys, args, shard=shard)

    # -- helpers -------------------------------------------------------------------------

    def _shards_for(self, operation_id: str | None) -> list[int]:
        if operation_id is None:
            return list(range(self.keys.shards))
        return [shard_of(check_operation_id(operation_id), self.keys.shards)]

    def _read_call(
        self,
        shard: int,
        low: str,
        high: str,
        limit: int,
        budget: int,
        flt: _Filter,
        newest: bool,
        headers: bool = False,
        window: _Window | None = None,
    ) -> Call:
        """A read of one shard's quarantine (quarantine_read.lua); ``headers``: each match
        without its payload and other fields, for :meth:`_headers`; ``window``: the entries
        of that time only (the rest of the range is examined, and not sent)."""
        since = "" if window is None or window.since_ms is None else str(window.since_ms)
        until = "" if window is None or window.until_ms is None else str(window.until_ms)
        return Call(
            "quarantine_read",
            (self.keys.quarantine(shard), self.keys.resolutions(shard)),
            (
                low,
                high,
                limit,
                budget,
                flt.kind,
                flt.operation_id,
                "1" if flt.unresolved else "0",
                "1" if newest else "0",
                "1" if headers else "0",
                since,
                until,
            ),
            shard=shard,
        )

    @staticmethod
    def stream_only(call: Call) -> Call:
        """``call``, a quarantine read, on its stream alone (every entry read as unresolved,
        the unresolved filter not applied): one key, which a Redis Cluster node serves while
        the slot migrates, after ASK if it moved. A read of two keys the migration split
        between the nodes is refused (TRYAGAIN) until the slot has moved. The resolutions are
        read apart and joined with :meth:`with_resolutions`."""
        return replace(call, keys=call.keys[:1])

    @staticmethod
    def match_ids(reply: list[Any]) -> list[bytes]:
        """The entry ids of the matches of a :meth:`stream_only` read's reply."""
        return [match[0] for match in reply[4]]

    @staticmethod
    def unresolved_span(reply: list[Any], found: Sequence[Any]) -> tuple[bytes, bytes] | None:
        """The ids of the first and last match of a :meth:`stream_only` read's ``reply`` that
        ``found`` (their resolutions, read after it) gives no resolution, if any: the span
        read again (XRANGE) to leave out those trimmed with their resolution between the two
        reads, which would otherwise come out unresolved though resolved before the call."""
        ids = [match[0] for match, res in zip(reply[4], found, strict=True) if not res]
        return (min(ids), max(ids)) if ids else None

    @staticmethod
    def with_resolutions(
        call: Call, reply: list[Any], found: Sequence[Any], present: Iterable[Any] = ()
    ) -> list[Any]:
        """The reply ``call`` (a quarantine read) would have given, from its
        :meth:`stream_only` read's ``reply`` and ``found``, the resolutions of its matches
        (HMGET of the resolutions hash, None where there is none): resolved matches dropped
        when the read wants unresolved ones only (a shorter page; the walk goes on after the
        last entry examined), each match's resolution, or its resolved mark in a headers
        read, as the script sets them; a match without a resolution is kept only if it is in
        ``present`` (the ids of :meth:`unresolved_span` read again: still in the stream)."""
        headers, unresolved = call.args[8] == "1", call.args[6] == "1"
        kept = set(present)
        matches = [
            [entry_id, fields, (b"1" if res else b"") if headers else (res or b"")]
            for (entry_id, fields, _), res in zip(reply[4], found, strict=True)
            if (res and not unresolved) or (not res and entry_id in kept)
        ]
        return [*reply[:4], matches]

    def _entries(self, call: Call, reply: codec.Reply) -> list[QuarantineEntry]:
        return self._decoded(call, reply, codec.decode_quarantine_entry)

    def _entries_or_marks(
        self, call: Call, reply: codec.Reply
    ) -> list[QuarantineEntry | codec.UndecodableEntry]:
        return self._decoded(call, reply, codec.or_mark(codec.decode_quarantine_entry))

    def _headers_or_marks(
        self, call: Call, reply: codec.Reply
    ) -> list[QuarantineHeader | codec.UndecodableEntry]:
        return self._decoded(call, reply, codec.or_mark(codec.decode_quarantine_header))

    def _headers(self, call: Call, reply: codec.Reply) -> list[QuarantineHeader]:
        return self._decoded(call, reply, codec.decode_quarantine_header)

    def _decoded(
        self, call: Call, reply: codec.Reply, decode: Callable[[int, Any, Any, Any], _T]
    ) -> list[_T]:
        """A read's matches, each ``[id, fields, resolution]``, decoded by ``decode``."""
        assert call.shard is not None
        try:
            return [
                decode(call.shard, entry_id, flat, res) for entry_id, flat, res in reply.payload
            ]
        except CorruptRecord as exc:
            raise CorruptRecord(
                f"{exc} (stream {self.keys.quarantine(call.shard)!r}); this settle version "
                "never writes such an entry: another version or another program did. Run "
                "one settle version against a namespace, or inspect it with redis-cli XRANGE"
            ) from exc

    def _record(self, reply: codec.Reply, op: str) -> OperationRecord:
        if reply.code == "corrupt" or not reply.payload:
            raise self._corrupt(op)
        try:
            return codec.decode_record(reply.payload, reply.now_ms)
        except CorruptRecord as exc:
            raise self._corrupt(op) from exc

    def _corrupt(self, op: str) -> CorruptRecord:
        logger.error(
            "settle.record.corrupt",
            namespace=self.config.namespace,
            operation_digest=operation_digest(op),
        )
        return CorruptRecord(
            f"the record of operation {op!r} is not a settle record (wrong type or missing "
            "fields); nothing was written. Inspect the key before deleting it.",
            operation_id=op,
        )


def _settlement(
    verdict: Verdict,
    action: Action,
    op: str,
    record: OperationRecord | None,
    qid: str | None,
    kind: QuarantineKind | None,
    repeated: bool = False,
) -> Settlement:
    return _trusted(
        Settlement,
        {
            "verdict": verdict,
            "action": action,
            "operation_id": op,
            "record": record,
            "quarantine_id": qid,
            "kind": kind,
            "quarantine_repeated": repeated,
        },
    )


def _fingerprint_of(request: Any, op: str) -> str:
    try:
        return fingerprint(request)
    except InvalidInput as exc:
        exc.operation_id = op
        raise


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


@dataclass(frozen=True, slots=True)
class _Window:
    """``[since, until]`` by each entry's own time (``at``, to the millisecond, as every
    view shows it), both ends included; either end open when None.

    The streams are read by id: from :data:`SINCE_SLACK_MS` before ``since`` (an entry's
    ``at`` may be a moment after its id's time) to :data:`UNTIL_SLACK_MS` past ``until``
    (its id may be later than its ``at``); the read script leaves out what the id range
    takes in beyond the window (it examines those entries, and sends none), and
    :meth:`keeps` checks each entry sent by the time it is shown with (an entry this version
    cannot decode is the script's to window: it reads that entry's own time field, where the
    mark can show only its id's). By id alone, ``until=<an entry's at>`` left that entry out
    when its id was a millisecond later, and ``since=<an entry's at + 1 ms>`` took it in."""

    since_ms: int | None = None
    until_ms: int | None = None

    @staticmethod
    def of(since: datetime | None, until: datetime | None) -> _Window:
        return _Window(
            _ms(since) if since is not None else None, _ms(until) if until is not None else None
        )

    def stream_range(self) -> tuple[str, str]:
        """XRANGE bounds that hold every entry of the window (and a few beyond it)."""
        low = f"{max(0, self.since_ms - SINCE_SLACK_MS)}-0" if self.since_ms is not None else "-"
        high = f"{self.until_ms + UNTIL_SLACK_MS}-{2**64 - 1}" if self.until_ms is not None else "+"
        return low, high

    def keeps(self, entry: _Listed) -> bool:
        if self.since_ms is None and self.until_ms is None:
            return True
        if isinstance(entry, codec.UndecodableEntry):
            # Its ``at`` is its id's millisecond: past ``until`` exactly when its id ran
            # ahead of its own time, the case the window is by that time for.
            return True
        at_ms = (entry.at - _EPOCH) // _MS
        if self.since_ms is not None and at_ms < self.since_ms:
            return False
        return self.until_ms is None or at_ms <= self.until_ms


def _id_bound(bound: str, open_end: tuple[int, int]) -> tuple[int, int]:
    """An XRANGE bound of :meth:`_Window.stream_range` as ``(ms, seq)``; ``open_end`` for
    '-'/'+'."""
    if bound in ("-", "+"):
        return open_end
    ms, _, seq = bound.rpartition("-")
    return int(ms), int(seq)


def _ms(when: datetime) -> int:
    if not isinstance(when, datetime):
        raise InvalidInput(f"since/until must be datetimes, got {type(when).__name__}")
    if when.tzinfo is None:
        raise InvalidInput("since/until must be timezone-aware datetimes")
    # An instant before 1970 is the stream ids' epoch: no entry is older, and Redis
    # refuses a negative stream id (the CLI's --since does the same, settle/cli/_params.py).
    # Whole milliseconds of the exact instant (an entry's ``at`` is compared with it).
    return max(0, (when - _EPOCH) // _MS)


@dataclass(frozen=True, slots=True)
class _Filter:
    kind: str = ""
    operation_id: str = ""
    unresolved: bool = False

    @staticmethod
    def of(
        kind: QuarantineKind | str | None, operation_id: str | None, unresolved: bool
    ) -> _Filter:
        if kind is not None:
            try:
                kind = QuarantineKind(kind)
            except ValueError:
                known = ", ".join(k.value for k in QuarantineKind)
                raise InvalidInput(f"unknown quarantine kind {kind!r}; one of: {known}") from None
        return _Filter(
            kind.value if kind else "", operation_id or "", _check_flag(unresolved, "unresolved")
        )


class _Listed(Protocol):
    """What a listing orders its items by: an entry or a header."""

    @property
    def id(self) -> str: ...
    @property
    def shard(self) -> int: ...
    @property
    def at(self) -> datetime: ...


_T = TypeVar("_T")
_E = TypeVar("_E", bound=_Listed)


@dataclass(frozen=True, slots=True)
class _Reads(Generic[_E]):
    """What a listing or a walk reads of each match: whole entries, or headers (the
    script's headers flag), and how a read's reply decodes into them."""

    headers: bool
    decode: Callable[[Call, codec.Reply], list[_E]]


def _id_key(entry: _Listed) -> tuple[int, int, datetime, int]:
    """The order of a listing across shards: the stream id's millisecond and sequence, then
    the server time (µs) and the shard. A stream's ids grow with every entry, also when the
    server's clock steps back (XADD then takes the last id's millisecond), so this order
    agrees with each shard's own and a listing cut in it skips nothing; the server time only
    orders entries of different shards that share an id's millisecond and sequence, as they
    were written. Ordered by the server time first, a shard whose ids ran ahead of its clock
    had entries that a listing or a console page skipped (docs/concepts.md, "The
    quarantine")."""
    ms, seq = entry.id.split("-")
    return int(ms), int(seq), entry.at, entry.shard


def _time_key(entry: QuarantineEntry | codec.UndecodableEntry) -> tuple[datetime, int, int, int]:
    """A live follow's order: server time (µs), then stream id, then shard."""
    ms, seq = entry.id.split("-")
    return entry.at, int(ms), int(seq), entry.shard


class QuarantineQuery(Generic[_E]):
    """A filtered listing across shards, merged as it is read: of entries, or of headers
    (``headers``: the script sends each match's kind, time and status only).

    Drive it with ``while calls := q.calls(): q.feed(calls, run_many(calls))``, then
    ``q.result()``. Each shard is read in chunks of the entries still wanted shared out
    among the shards still being read, and an entry is taken once every such shard holds
    one past it: a listing of ``limit`` entries reads at most about twice ``limit`` plus one
    entry a shard (what the last chunks held beyond the cut), not ``limit`` from every
    shard (16 shards and a page of 200 read 3,200 payloads to show 200), and with an
    ``until``, the entries of ids up to :data:`UNTIL_SLACK_MS` past it that :class:`_Window`
    leaves out.
    """

    def __init__(
        self,
        core: Core,
        reads: _Reads[_E],
        shards: list[int],
        flt: _Filter,
        window: _Window,
        low: str,
        high: str,
        limit: int,
        newest_first: bool,
    ) -> None:
        self._core = core
        self._reads = reads
        self._filter = flt
        self._window = window
        self._limit = limit
        self._newest = newest_first
        self._plan = (shards, flt, window, low, high, limit, newest_first)
        #: The shards still being read, and the range of each left to read.
        self._bounds = dict.fromkeys(shards, (low, high))
        #: Entries read and not taken yet, in each shard's order.
        self._held: dict[int, list[_E]] = {s: [] for s in shards}
        self._taken: list[_E] = []

    def headers(self) -> QuarantineQuery[QuarantineHeader]:
        """The same listing, not read yet, of headers: the script leaves every field of a
        match out but its kind and time, and sends whether it is resolved."""
        return QuarantineQuery(self._core, _Reads(True, self._core._headers), *self._plan)

    def marking(self) -> QuarantineQuery[QuarantineEntry | codec.UndecodableEntry]:
        """The same listing of entries, not read yet, with each entry this version cannot
        decode as an :class:`~settle._core.codec.UndecodableEntry` in its place (the
        console's pages), rather than a :class:`CorruptRecord` that ends the listing."""
        return QuarantineQuery(self._core, _Reads(False, self._core._entries_or_marks), *self._plan)

    def header_marking(self) -> QuarantineQuery[QuarantineHeader | codec.UndecodableEntry]:
        """:meth:`marking` of headers (the console's overview)."""
        return QuarantineQuery(self._core, _Reads(True, self._core._headers_or_marks), *self._plan)

    def calls(self) -> list[Call]:
        """A chunk of every shard still being read that holds nothing (none once the
        listing is full)."""
        want = self._limit - len(self._taken)
        if want <= 0:
            return []
        chunk = -(-want // max(1, len(self._bounds)))  # ceil: the shards share what is wanted
        return [
            self._core._read_call(
                s,
                low,
                high,
                chunk,
                _QUARANTINE_SCAN_BUDGET,
                self._filter,
                self._newest,
                self._reads.headers,
                self._window,
            )
            for s, (low, high) in self._bounds.items()
            if not self._held[s]
        ]

    def feed(self, calls: list[Call], raws: list[Any]) -> None:
        for call, raw in zip(calls, raws, strict=True):
            assert call.shard is not None
            reply = codec.parse_reply(raw)
            read = self._reads.decode(call, reply)
            self._held[call.shard].extend(e for e in read if self._window.keeps(e))
            low, high = self._bounds[call.shard]
            if reply.code == "done":
                del self._bounds[call.shard]
            elif self._newest:
                self._bounds[call.shard] = (low, f"({reply.detail}")
            else:
                self._bounds[call.shard] = (f"({reply.detail}", high)
        self._take()

    def _take(self) -> None:
        """Take entries in the listing's order while every shard still being read holds
        one (an entry of a shard read to its end needs no other shard's next one)."""
        pick = max if self._newest else min
        while len(self._taken) < self._limit:
            if any(not self._held[s] for s in self._bounds):
                return
            heads = [s for s, held in self._held.items() if held]
            if not heads:
                return
            first = pick(heads, key=lambda s: _id_key(self._held[s][0]))
            self._taken.append(self._held[first].pop(0))

    def result(self) -> list[_E]:
        return self._taken


#: At most this many entries are held by a :class:`QuarantineScan` across its shards.
SCAN_HELD = 512


class QuarantineScan(Generic[_E]):
    """Every matching entry of every shard, oldest first, in bounded memory: of entries, or
    of headers (``headers``: the script sends each match's kind, time and status only).

    Drive it with ``while not s.finished: calls = s.calls(); if calls: s.feed(calls,
    run_many(calls)); yield from s.ready()``. Each shard is read a page at a time (at most
    ``SCAN_HELD // shards`` entries, at least 4); an entry is handed out once every shard
    still being read has a page that starts after it, so the merge is in order.
    """

    def __init__(
        self, core: Core, reads: _Reads[_E], shards: list[int], flt: _Filter, window: _Window
    ) -> None:
        self._core = core
        self._reads = reads
        self._filter = flt
        self._window = window
        self._plan = (shards, flt, window)
        low, self._high = window.stream_range()
        self._page = max(4, SCAN_HELD // max(1, len(shards)))
        self._low: dict[int, str] = dict.fromkeys(shards, low)
        self._held: dict[int, list[_E]] = {s: [] for s in shards}
        self._open = set(shards)  # shards not read to the end yet

    def headers(self) -> QuarantineScan[QuarantineHeader]:
        """The same walk, not read yet, of headers: the script leaves every field of a
        match out but its kind and time, and sends whether it is resolved (what a count
        needs: ``settle stats`` reads these)."""
        return QuarantineScan(self._core, _Reads(True, self._core._headers), *self._plan)

    def marking(self) -> QuarantineScan[QuarantineEntry | codec.UndecodableEntry]:
        """The same walk of entries, not read yet, with each entry this version cannot
        decode as an :class:`~settle._core.codec.UndecodableEntry` in its place (``settle
        quarantine export``: the entries after it are not lost)."""
        return QuarantineScan(self._core, _Reads(False, self._core._entries_or_marks), *self._plan)

    def header_marking(self) -> QuarantineScan[QuarantineHeader | codec.UndecodableEntry]:
        """:meth:`marking` of headers (``settle stats``: one entry it cannot decode ended
        the count, and no count was shown)."""
        return QuarantineScan(self._core, _Reads(True, self._core._headers_or_marks), *self._plan)

    @property
    def finished(self) -> bool:
        return not self._open and not any(self._held.values())

    def calls(self) -> list[Call]:
        """A page of every open shard that holds nothing."""
        return [
            self._core._read_call(
                s,
                self._low[s],
                self._high,
                self._page,
                _QUARANTINE_SCAN_BUDGET,
                self._filter,
                False,
                self._reads.headers,
                self._window,
            )
            for s in sorted(self._open)
            if not self._held[s]
        ]

    def feed(self, calls: list[Call], raws: list[Any]) -> None:
        for call, raw in zip(calls, raws, strict=True):
            assert call.shard is not None
            reply = codec.parse_reply(raw)
            read = self._reads.decode(call, reply)
            self._held[call.shard].extend(e for e in read if self._window.keeps(e))
            if reply.code == "done":
                self._open.discard(call.shard)
            else:
                self._low[call.shard] = f"({reply.detail}"

    def ready(self) -> list[_E]:
        """Entries that can be handed out in order now (the oldest first)."""
        out: list[_E] = []
        while True:
            if any(not self._held[s] for s in self._open):
                return out  # an open shard must be read before anything newer goes out
            heads = [s for s, held in self._held.items() if held]
            if not heads:
                return out
            first = min(heads, key=lambda s: _id_key(self._held[s][0]))
            out.append(self._held[first].pop(0))


class QuarantineTrim:
    """Trims every shard's quarantine in bounded steps.

    Drive it with ``while call := t.next_call(): t.feed(call, run(call))``, then
    ``t.result()``; each call is a writing script (run it guarded, like any write).
    """

    def __init__(self, core: Core, shards: list[int], age_ms: str, everything: bool) -> None:
        self._core = core
        self._age_ms = age_ms
        self._everything = everything
        self._low = dict.fromkeys(shards, "-")
        self._removed = 0
        self._unresolved = 0

    def next_call(self) -> Call | None:
        for shard, low in self._low.items():
            return self._core._trim_call(shard, low, self._age_ms, self._everything)
        return None

    def feed(self, call: Call, raw: Any) -> None:
        assert call.shard is not None
        reply = codec.parse_reply(raw)
        removed, unresolved = (int(x) for x in reply.payload)
        self._removed += removed
        self._unresolved += unresolved
        if reply.code == "done":
            del self._low[call.shard]
        else:
            self._low[call.shard] = f"({reply.detail}"

    def result(self) -> TrimResult:
        logger.info(
            "settle.quarantine.trimmed",
            namespace=self._core.config.namespace,
            removed=self._removed,
            unresolved=self._unresolved,
        )
        return TrimResult(removed=self._removed, unresolved=self._unresolved)


class QuarantineFollower:
    """Follows every shard's quarantine stream from now (or ``since``, by each entry's own
    time as a listing's window, until the shard is read to its end: every entry written
    after that is shown) on, oldest first.

    Drive it with ``calls = f.calls(); new = f.feed(calls, run_many(calls))``; sleep when
    ``f.idle``. Shards are read one after another (one round trip each on a cluster), so an
    entry can land in a shard already read while a later shard yields a newer one; entries
    are therefore held back until every shard has been read past their time.

    An entry this version cannot decode is handed out as an
    :class:`~settle._core.codec.UndecodableEntry` in its place (``settle quarantine tail``
    marks it, ``quarantine.follow`` skips it), logged once as
    ``settle.quarantine.undecodable``: raising there ended the follow, and a follow made
    again stopped at the same entry, so none after it was ever seen.
    """

    def __init__(self, core: Core, shards: list[int], flt: _Filter, since: datetime | None) -> None:
        self._core = core
        self._filter = flt
        # From ``since`` by the entries' own time, as a listing's window (the ids from
        # :data:`SINCE_SLACK_MS` before it on hold them all; one whose id is later than its
        # ``at`` is left out), until a
        # shard is read to its end: what it gets after that is new, whatever its ``at`` (a
        # node whose clock is behind ``since`` after a failover, a clock stepped back).
        self._window = _Window.of(since, None)
        start = self._window.stream_range()[0] if since is not None else None
        self._low: dict[int, str | None] = dict.fromkeys(shards, start)
        #: The shards not yet read to their end, whose entries ``since`` still selects.
        self._windowed = set(shards) if since is not None else set()
        #: Entries read but not handed out yet, each with the round (``feed``) that read it.
        self._held: list[tuple[QuarantineEntry | codec.UndecodableEntry, int]] = []
        self._round = 0
        self.idle = False

    def calls(self) -> list[Call]:
        out = []
        for s, low in self._low.items():
            if low is None:  # not primed: find the newest existing entry
                out.append(self._core._read_call(s, "-", "+", 1, 1, _Filter(), True))
            else:
                out.append(
                    self._core._read_call(
                        s,
                        low,
                        "+",
                        256,
                        _QUARANTINE_SCAN_BUDGET,
                        self._filter,
                        False,
                        window=self._window if s in self._windowed else None,
                    )
                )
        return out

    def feed(
        self, calls: list[Call], raws: list[Any]
    ) -> list[QuarantineEntry | codec.UndecodableEntry]:
        more = False
        read_at = None
        for call, raw in zip(calls, raws, strict=True):
            assert call.shard is not None
            reply = codec.parse_reply(raw)
            primed = self._low[call.shard] is not None
            windowed = call.shard in self._windowed
            if primed and reply.code == "done":
                self._windowed.discard(call.shard)
            if primed:
                for e in self._core._entries_or_marks(call, reply):
                    if windowed and not self._window.keeps(e):
                        continue
                    if isinstance(e, codec.UndecodableEntry):
                        logger.error(
                            "settle.quarantine.undecodable",
                            namespace=self._core.config.namespace,
                            quarantine_id=e.ref,
                            reason=e.problem,
                        )
                    self._held.append((e, self._round))
            if reply.detail:
                self._low[call.shard] = f"({reply.detail}"
            elif not primed:
                self._low[call.shard] = "-"
            more = more or not primed or reply.code == "more"
            read_at = reply.now_ms if read_at is None else min(read_at, reply.now_ms)
        # Anything not yet seen was written after its shard's read, so at or after the
        # earliest read of this round: entries older than that are complete and in order.
        # By server time, not stream id: a shard whose ids ran ahead of its clock would have
        # its entries held back for as long as that. An entry read in an earlier round goes
        # out now whatever its time (with every held entry of an earlier time): a clock that
        # stepped back, or a node behind the others, holds nothing back for longer than one
        # more read. Each shard is read on from its last id: no order here skips an entry.
        cut = ms_to_datetime(read_at) if read_at is not None else None
        self._held.sort(key=lambda held: _time_key(held[0]))
        due = 0
        for i, (entry, read_in) in enumerate(self._held):
            if read_in < self._round or (cut is not None and entry.at < cut):
                due = i + 1
        ready = [entry for entry, _ in self._held[:due]]
        self._held = self._held[due:]
        self._round += 1
        self.idle = not more and not ready
        return ready
