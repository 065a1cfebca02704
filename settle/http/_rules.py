"""Every rule of the ``Idempotency-Key`` middlewares, with no I/O, in one place.

:class:`Guard` hands out one instruction at a time, in the shape of the decorator's
:class:`~settle.decorator._plan.Plan`; the ASGI, WSGI and Django shells carry it out and
feed back what happened. Which requests are guarded, the key, the principal, the body limit,
the fingerprint, the reservation's answers (replay, 409, 422, 503), what a finished
response stores and what is answered when an attempt lost its reservation: all here, once.

    step = guard.start()
    while True:
        match step:
            case Forward():   call the app as it is (not guarded here)
            case Answer():    send step.response; done
            case Identify():  step = guard.identified(principal(request))
                              # or guard.principal_failed(exc) if the callable raised
            case ReadBody():  step = guard.body_read(body)  # or guard.body_too_large(exc),
                              # body_malformed(exc), disconnected() if it ended early
            case Reserve():   step = guard.reserved(settler.reserve(...))  # or reserve_failed
            case Release():   mark provisional step.reservation(settler.get(...)) if any,
                              then step = guard.released()
            case Run():       run the app with step.attempt, then
                              settle guard.finished(...) and send guard.settled(...) or
                              the handler's own response
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final, overload

from pydantic import ValidationError

from settle._core.heartbeat import first_renewal
from settle._log import enabled, logger, operation_digest
from settle.attempt import Attempt
from settle.decorator._plan import UNCONFIRMED, _uuid4_hex, own_reservation
from settle.errors import (
    BackendError,
    BindingMismatch,
    ConfigurationError,
    CorruptRecord,
    DurabilityError,
    FingerprintMismatch,
    ResultTooLarge,
    SettleError,
)
from settle.http.keys import MalformedKey, operation_id, parse_key
from settle.http.policy import (
    Coverage,
    IdempotencyPolicy,
    checked_principal,
    unusable_principal,
)
from settle.http.problems import Problem, ProblemKind, Response
from settle.http.request import (
    RequestHead,
    RequestMalformed,
    RequestTooLarge,
    fingerprint_request,
)
from settle.http.stored import StoredResponse, storable_status
from settle.models import (
    InProgress,
    OperationRecord,
    QuarantineKind,
    Renewal,
    Replay,
    Reservation,
    Reserved,
    Settlement,
    State,
    Verdict,
)

if TYPE_CHECKING:
    from settle._async.settler import AsyncSettler
    from settle._sync.settler import Settler

__all__ = [
    "Answer",
    "Forward",
    "Guard",
    "Identify",
    "ReadBody",
    "Release",
    "Reserve",
    "Run",
    "Settle",
    "Step",
    "stored_response",
]


# -- instructions --------------------------------------------------------------------------


# Plain classes with slots, not frozen dataclasses: a frozen dataclass sets each field with
# ``object.__setattr__`` (~1,300 instructions a field; a new key makes five steps). Their
# fields are ``Final``, read-only to the type checker; nothing compares or hashes a step.


class Forward:
    """The request is not guarded here (not covered, or an outer guard runs its very
    operation: :meth:`Guard.identified`): call the app as it is."""

    __slots__ = ()


class Answer:
    """Send this response; the app is not called."""

    __slots__ = ("response",)

    def __init__(self, response: Response) -> None:
        self.response: Final = response


class Identify:
    """Call the principal callable on the request; feed :meth:`Guard.identified`."""

    __slots__ = ()


class ReadBody:
    """Read the whole body into a :class:`~settle.http.request.BodyBuffer` of ``limit``."""

    __slots__ = ("limit",)

    def __init__(self, limit: int) -> None:
        self.limit: Final = limit


class Reserve:
    __slots__ = ("attempt_id", "fingerprint", "lease", "operation_id", "principal")

    def __init__(
        self,
        operation_id: str,
        principal: str,
        fingerprint: str,
        lease: float | None,
        attempt_id: str,
    ) -> None:
        self.operation_id: Final = operation_id
        self.principal: Final = principal
        self.fingerprint: Final = fingerprint
        self.lease: Final = lease
        self.attempt_id: Final = attempt_id

    @overload
    def call(self, settler: AsyncSettler) -> Awaitable[Reserved | Replay | InProgress]: ...
    @overload
    def call(self, settler: Settler) -> Reserved | Replay | InProgress: ...
    def call(self, settler: AsyncSettler | Settler) -> Any:
        """``settler.reserve(...)`` (await it on an :class:`~settle.AsyncSettler`)."""
        return settler.reserve(
            self.operation_id,
            principal=self.principal,
            fingerprint=self.fingerprint,
            lease=self.lease,
            attempt_id=self.attempt_id,
        )


class Release:
    """``reserve`` raised :class:`DurabilityError`: read the record (``operation_id``) and
    mark provisional (``reason``) the reservation it holds for this request
    (:meth:`reservation`), if any; whatever that answers, feed :meth:`Guard.released`. The
    handler did not run: a reservation left pending would answer every retry 409 (in
    progress) until its lease ends, with nothing running it."""

    __slots__ = ("attempt_id", "operation_id", "reason")

    def __init__(self, operation_id: str, attempt_id: str, reason: str = UNCONFIRMED) -> None:
        self.operation_id: Final = operation_id
        self.attempt_id: Final = attempt_id
        self.reason: Final = reason

    def reservation(self, record: OperationRecord | None) -> Reservation | None:
        return own_reservation(record, self.attempt_id)


class Run:
    """Run the app with ``attempt`` (in ``scope``/``environ``/``request.settle``) while a
    heartbeat renews ``reservation`` every ``lease / 3`` seconds, the first renewal
    ``first`` seconds from now (:func:`~settle._core.heartbeat.first_renewal`)."""

    __slots__ = ("attempt", "first", "lease", "reservation")

    def __init__(
        self, reservation: Reservation, attempt: Attempt, lease: float, first: float
    ) -> None:
        self.reservation: Final = reservation
        self.attempt: Final = attempt
        self.lease: Final = lease
        self.first: Final = first


class Settle:
    """``complete`` the reservation with ``stored``, or (``stored`` None) mark it
    provisional with ``reason``."""

    __slots__ = ("reason", "reservation", "stored")

    def __init__(
        self, reservation: Reservation, stored: StoredResponse | None = None, reason: str = ""
    ) -> None:
        self.reservation: Final = reservation
        self.stored: Final = stored
        self.reason: Final = reason

    @overload
    def call(self, settler: AsyncSettler) -> Awaitable[Settlement]: ...
    @overload
    def call(self, settler: Settler) -> Settlement: ...
    def call(self, settler: AsyncSettler | Settler) -> Any:
        """``complete`` or ``mark_provisional`` (await it on an :class:`~settle.AsyncSettler`)."""
        if self.stored is None:
            return settler.mark_provisional(self.reservation, self.reason)
        # Encoded here, and handed to ``complete`` as these bytes (stored as they are, the
        # size limit checked there), as the decorator does: by StoredResponse's own
        # serializer, the bytes the codec's encode_result makes of it (fields by name, round
        # trip), without its pass for a model: a StoredResponse is validated, forbids
        # extras (no key named twice) and holds no float (no NaN) nor text bytes (base64).
        return settler.complete(self.reservation, _stored_json(self.stored))


def _stored_json(stored: StoredResponse) -> bytes:
    """``stored`` as the codec's ``encode_result`` stores it (the same bytes)."""
    return StoredResponse.__pydantic_serializer__.to_json(stored, by_alias=False, round_trip=True)


Step = Forward | Answer | Identify | ReadBody | Reserve | Release | Run

#: No guard runs the request already (most requests): ``Guard._held``.
_NONE_HELD: frozenset[str] = frozenset()

#: What a problem answer says of the request, as ``Guard.outcome`` (any other: "rejected").
_OUTCOME = {
    ProblemKind.KEY_REUSED: "mismatch",
    ProblemKind.KEY_BOUND: "misbound",
    ProblemKind.IN_PROGRESS: "conflict",
    ProblemKind.RESPONSE_NOT_STORED: "not_replayable",
    ProblemKind.UNAVAILABLE: "unavailable",
    ProblemKind.REQUEST_INCOMPLETE: "disconnected",
    # the server's fault, not the client's: the app's principal callable raised (a 500)
    ProblemKind.PRINCIPAL_FAILED: "principal_failed",
}


# -- the rules -----------------------------------------------------------------------------


class Guard:
    """The decisions for one request, from its head to the response its client gets.

    ``outcome`` says what became of a guarded request (None: not guarded, or not decided
    yet): ``executed``, ``replayed``, ``conflict``, ``mismatch``, ``misbound``,
    ``rejected``, ``unavailable``, ``not_replayable``, ``provisional``, ``superseded``,
    ``timeout``, ``disconnected``, ``store_failed`` or ``error`` (an error let through). The
    shells report it (the current HTTP server span, ``settle.http.requests``;
    docs/observability.md)."""

    def __init__(
        self,
        policy: IdempotencyPolicy,
        namespace: str,
        lease: float,
        head: RequestHead,
        held: Iterable[Attempt] = (),
    ) -> None:
        self.policy = policy
        # The operations of the guards that run this request already (held_attempts in
        # settle.http.attempt: a guarded application this one is mounted in, a middleware
        # around this one, each of them when there are several; see identified).
        self._held = frozenset(a.operation_id for a in held) if held else _NONE_HELD
        self.namespace = namespace
        self.lease = policy.lease or lease
        self.head = head
        # Bound on first use, from what is known by then: most requests log once or twice,
        # an unguarded one never.
        self._context: dict[str, Any] = {
            "namespace": namespace,
            "method": head.method,
            "path": head.path,
        }
        self._log: Any = None
        self._key = ""
        self._principal = ""
        self._operation: str | None = None
        self._reserving: Reserve | None = None
        self._reserving_at = 0.0  # when it was made (sent): time.monotonic()
        self._unconfirmed: DurabilityError | None = None
        self.outcome: str | None = None
        #: The handler ended and its settlement is decided (finished, failed): a renewal
        #: sent beside that settlement reads the settled record, which is no loss.
        self._ended = False

    @property
    def log(self) -> Any:
        """settle's logger bound to this request: namespace, method, path, and the
        operation's digest and generation once known (the digest, an HMAC, is computed
        only for a request that logs)."""
        if self._log is None:
            context = self._context
            if self._operation is not None:
                context = {**context, "operation_digest": operation_digest(self._operation)}
            self._log = logger.bind(**context)
        return self._log

    def _info(self, event: str, **fields: Any) -> None:
        """An INFO event, made only when it can be written: a service that keeps settle's
        INFO events quiet does not bind the request's logger or digest its operation id on
        every request."""
        if enabled(logging.INFO):
            self.log.info(event, **fields)

    def _bind(self, **fields: Any) -> None:
        self._context.update(fields)
        self._log = None

    # -- before the body -----------------------------------------------------------------

    def start(self) -> Step:
        policy = self.policy
        coverage = policy.coverage(self.head.method, self.head.path, self.head.route)
        if coverage is Coverage.UNGUARDED:
            return Forward()
        if not self.head.key_values:
            if coverage is Coverage.KEY_OPTIONAL:
                return Forward()
            detail = f"this endpoint needs an {policy.header} header: a unique value per request"
            return self._reject(ProblemKind.KEY_MISSING, detail)
        try:
            self._key = parse_key(list(self.head.key_values), policy.max_key_length)
        except MalformedKey as exc:
            return self._reject(ProblemKind.KEY_MALFORMED, str(exc))
        return Identify()

    def identified(self, principal: object) -> Step:
        """What the principal callable returned. None, ``""``, an over-long value or one
        with control characters is no usable principal: 401, nothing stored. Anything but
        ``str | None`` means the callable misbehaves: a 500 problem, logged as an error."""
        try:
            value = checked_principal(principal)
        except ConfigurationError as exc:
            return self.principal_failed(exc)
        why = unusable_principal(value)
        if why is not None or value is None:
            if why != "none":
                self.log.warning("settle.http.principal_unusable", why=why)
            detail = "authenticate: a guarded request is bound to the principal that sent it"
            return self._reject(ProblemKind.PRINCIPAL_REQUIRED, detail)
        self._principal = value
        policy = self.policy
        op = operation_id(policy.operation_prefix, self._key, value, policy.key_scope)
        self._operation = op
        self._log = None
        if op in self._held:
            # An outer guard (a guarded application this one is mounted in, a middleware
            # around this one, whatever guards are between them) runs this very operation:
            # reserving it again would find it in progress and answer 409 to every attempt.
            # The request runs under the outer attempt. Another operation (another header,
            # prefix, key scope or principal) is guarded here as any other, so that no key
            # of this guard goes unreserved.
            return Forward()
        return ReadBody(policy.max_request_bytes)

    def principal_failed(self, exc: BaseException) -> Answer:
        """The principal callable raised (or returned something other than ``str | None``):
        a 500 problem; the app is not called and nothing is stored."""
        self.log.error("settle.http.principal_failed", error=type(exc).__name__)
        detail = (
            "the server could not determine who sent this request; nothing was run. "
            "Retry later with the same key."
        )
        return self._answer(ProblemKind.PRINCIPAL_FAILED, detail)

    def body_too_large(self, exc: RequestTooLarge) -> Answer:
        return self._reject(ProblemKind.REQUEST_TOO_LARGE, str(exc))

    def body_malformed(self, exc: RequestMalformed) -> Answer:
        return self._reject(ProblemKind.REQUEST_MALFORMED, str(exc))

    def disconnected(self) -> Answer:
        """The client stopped sending, or left, before its whole body arrived: nothing is
        reserved or run, and this is no error (logged at info). The 400 problem is for a
        shell whose client may still read (WSGI: the body ended early, as it does for a
        client that only closed its sending side); under ASGI the server said the client
        is gone, and nothing is sent."""
        self._info("settle.http.disconnected", stage="reading_request")
        detail = (
            "the request body ended before the length it declared; nothing was run. Send "
            f"the whole request again with the same {self.policy.header}."
        )
        return self._answer(ProblemKind.REQUEST_INCOMPLETE, detail)

    def body_read(self, body: bytes) -> Reserve:
        op = self._operation
        assert op is not None, "identified() names the operation before the body is read"
        fingerprint = fingerprint_request(self.head, body)
        self._reserving = Reserve(op, self._principal, fingerprint, self.policy.lease, _uuid4_hex())
        self._reserving_at = time.monotonic()  # the shell sends it next
        return self._reserving

    # -- the reservation -----------------------------------------------------------------

    def reserve_failed(self, exc: SettleError) -> Answer | Release:
        header = self.policy.header
        if isinstance(exc, FingerprintMismatch):
            detail = (
                f"this {header} was already used for a different request (method, path, "
                "query, content type or body); use a new key for a new request"
            )
            return self._reject(ProblemKind.KEY_REUSED, detail)
        if isinstance(exc, BindingMismatch):
            detail = f"this {header} is in use by another principal; use a new key"
            return self._reject(ProblemKind.KEY_BOUND, detail, level="warning")
        if isinstance(exc, DurabilityError) and self._reserving is not None:
            self._unconfirmed = exc
            return Release(self._reserving.operation_id, self._reserving.attempt_id)
        if isinstance(exc, BackendError | DurabilityError | ConfigurationError):
            return self._unavailable(exc)
        self.escaping(exc)
        raise exc

    def released(self) -> Answer:
        """The 503 of a ``reserve`` that raised :class:`DurabilityError`, after
        :class:`Release`."""
        assert self._unconfirmed is not None, "released() follows reserve_failed()"
        return self._unavailable(self._unconfirmed)

    def _unavailable(self, exc: SettleError) -> Answer:
        self.log.error("settle.http.unavailable", error=type(exc).__name__)
        if isinstance(exc, ConfigurationError):
            # Redis refused settle (credentials in rotation, a cluster missing slots,
            # another shard count): unavailable for the client, an operator's to fix.
            detail = "the idempotency store refused this service; nothing was run."
        elif isinstance(exc, DurabilityError):
            # Reached, and it answered (a replay, a new reservation): no replica confirmed
            # holding the record, so the handler does not run and nothing is replayed.
            detail = (
                "the idempotency store could not confirm that its replicas hold this "
                "request's record; the handler did not run for this request."
            )
        else:
            detail = "the idempotency store cannot be reached; nothing was run."
        return self._answer(ProblemKind.UNAVAILABLE, detail + " Retry later.", retry=True)

    def reserved(self, outcome: Reserved | Replay | InProgress) -> Answer | Run:
        if isinstance(outcome, Replay):
            return Answer(self.replay(outcome.record))
        if isinstance(outcome, InProgress):
            self._info("settle.http.in_progress", generation=outcome.generation)
            detail = (
                f"a request with this {self.policy.header} is still being processed; retry "
                f"after {self.policy.retry_after} s to get its response"
            )
            return self._answer(ProblemKind.IN_PROGRESS, detail, retry=True)
        timeout = self.policy.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        attempt = Attempt.for_reservation(outcome, self.namespace, deadline)
        self._bind(generation=attempt.generation)
        self._info("settle.http.started", number=attempt.number)
        first = first_renewal(self.lease, self._reserving_at, time.monotonic())
        return Run(outcome.reservation, attempt, self.lease, first)

    def replay(self, record: OperationRecord) -> Response:
        """The record's stored response, or a 410 problem if it was too large to store.
        :class:`CorruptRecord` (logged) if the record holds something else."""
        try:
            stored = stored_response(record)
        except CorruptRecord as exc:
            self.escaping(exc)
            raise
        if stored.body is None:
            self._info("settle.http.not_replayable", status=stored.status, size=stored.size)
            detail = (
                f"the request was processed (status {stored.status}) but its {stored.size}-byte "
                "response was too large to store; it will not run again for this key. Fetch "
                "the result through the API, or send a new request with a new key."
            )
            return self._answer(ProblemKind.RESPONSE_NOT_STORED, detail).response
        self._info("settle.http.replayed", status=stored.status, size=stored.size)
        self.outcome = "replayed"
        return Response(stored.status, tuple(stored.replay_headers()), stored.body)

    # -- the handler's response ----------------------------------------------------------

    def keeps(self, status: int, size: int) -> bool:
        """Whether a response of ``status`` is still kept to be stored after ``size`` bytes:
        a finished response (:func:`storable_status`) within ``max_response_bytes``. A
        streaming shell sends on what it no longer keeps."""
        return storable_status(status) and size <= self.policy.max_response_bytes

    def finished(
        self,
        run: Run,
        status: int,
        headers: list[tuple[bytes, bytes]],
        body: bytes | None,
        size: int,
    ) -> Settle:
        """The handler sent its last byte (``body`` None: it was over the limit and was sent
        on without being kept): what to settle."""
        self._ended = True
        if not storable_status(status):
            return Settle(run.reservation, reason=f"status_{status}")
        if body is None or not self.keeps(status, size):
            return self._not_stored(run.reservation, status, size)
        stored = StoredResponse.capture(status, headers, body, self.policy.replay_headers)
        return Settle(run.reservation, stored)

    def failed(self, run: Run, reason: str) -> Settle:
        """The handler raised, timed out or its client left before its last byte."""
        self._ended = True
        return Settle(run.reservation, reason=reason)

    def settles(self, run: Run, step: Settle) -> bool:
        """Whether to carry out ``step``. Not when it stores nothing (an error status, an
        exception) and the attempt's lease is known lost: another attempt may own the
        operation now, so this one settles nothing, as the decorator does, and its client
        gets :meth:`superseded` where it can still be answered (ASGI stops such a handler
        itself; under WSGI it ends on its own: an error, or ``attempt.check()``'s
        ``StaleAttempt``). A response to store still goes to ``complete``, which rejects it
        if it is stale and answers with the authoritative one instead."""
        return step.stored is not None or not run.attempt.lost

    def stops(self, run: Run, exc: BaseException) -> bool:
        """Whether the handler's ``exc`` ends it as superseded: its lease is known lost (a
        newer attempt owns the operation) and ``exc`` is an error (not a ``KeyboardInterrupt``
        or ``SystemExit``). The :class:`StaleAttempt` of ``attempt.check()``, an error raised
        from or beside it, or the handler's own error raised after the loss alike: the
        client gets :meth:`stopped_by_loss`'s 409, as under ASGI, which stops such a handler
        itself and replaces what it raises while stopping. A :class:`StaleAttempt` of
        another operation under a lease still held is the handler's error."""
        return run.attempt.lost and isinstance(exc, Exception)

    def timed_out(self, run: Run, status: int | None = None, at: float | None = None) -> bool:
        """Whether a handler that ended in error ended past its ``timeout``: it raised
        (``status`` None: the ``TimeoutError`` of ``attempt.check()``, or any error after the
        deadline), or it or its framework answered a 5xx (Django's and Flask's 500 for such
        an error). Its client then gets :meth:`abandoned`'s 504 ``handler-timeout`` and the
        attempt is provisional (``timeout``), as under ASGI, where the timeout stops the
        handler itself: ASGI asks this when the handler's loop was held past the deadline,
        so that its timer could not fire first; WSGI, whose thread cannot be stopped, asks
        it of every error. Not when the lease is known lost (:meth:`stops` answers) nor
        without a ``timeout`` configured (a deadline the handler set on its attempt itself
        is its own: no 504 says it did not finish "within None s"); a finished response
        given late is stored (the truth, as the decorator completes a value returned late).
        ``at``: the ``time.monotonic()`` instant the error was caught, when a framework
        reported it before its slow part (Django and Flask log the exception, then render
        their 500); else now."""
        deadline = run.attempt.deadline
        if self.policy.timeout is None or deadline is None or run.attempt.lost:
            return False
        if status is not None and status < 500:
            return False
        return (time.monotonic() if at is None else at) >= deadline

    def reports(self, run: Run, error: BaseException) -> bool:
        """Whether the handler's ``error``, answered with a 504 or a 409 in its place and
        never raised to the server, has its traceback handed to the server's error log: a
        bug would be lost otherwise. Not the ``StaleAttempt`` or ``TimeoutError`` that
        ``attempt.check()`` raised to stop it: settle's own signal, which its 409 or 504
        says (``settle.http.abandoned`` names its type all the same)."""
        return not run.attempt.stopped_by(error)

    def stopped_by_loss(self, error: BaseException | None = None) -> Response:
        """A handler that ended after its lease was lost, with nothing to store
        (:meth:`settles`): the 409 ``attempt-superseded`` its client gets, as under ASGI,
        never the stale attempt's own error (``error``: logged by its type,
        :meth:`abandoned`)."""
        self.abandoned("lease_lost", error)
        return self.superseded(None)

    def settle_failed(self, step: Settle, exc: SettleError) -> Settle | None:
        """The settlement call raised: what to settle instead (None: nothing). The response
        goes out anyway; a record left pending reads as provisional once its lease passes,
        and a retry runs the handler again."""
        stored = step.stored
        if isinstance(exc, ResultTooLarge) and stored is not None and stored.body is not None:
            return self._not_stored(step.reservation, stored.status, stored.size)
        reason = step.reason or None
        self.log.error("settle.http.store_failed", reason=reason, error=type(exc).__name__)
        self.outcome = "store_failed"
        return None

    def settled(self, step: Settle, settlement: Settlement) -> Response | None:
        """What the client gets instead of the handler's response (None: the handler's)."""
        stored = step.stored
        verdict = settlement.verdict
        if stored is None:
            self._info("settle.http.provisional", reason=step.reason, verdict=verdict.value)
            self.outcome = self.outcome or "provisional"
            return None
        if verdict is Verdict.QUARANTINED and settlement.kind is QuarantineKind.UNKNOWN_OPERATION:
            # The operation has no record any more (Redis lost it while the handler ran: a
            # restart without persistence, a FLUSHALL, a failover; or it was deleted). No
            # other attempt owns it, and nothing remembers that the handler ran: a 409 that
            # invites a retry would run it again. The client gets the handler's own response
            # (not stored, as when the store fails: a retry with the same key runs the
            # handler again, as after any loss), and the loss is logged.
            self.log.error("settle.http.record_lost", status=stored.status)
            self.outcome = "store_failed"
            return None
        if verdict is Verdict.QUARANTINED:
            kind = settlement.kind.value if settlement.kind else None
            self.log.warning("settle.http.superseded", kind=kind, status=stored.status)
            return self.superseded(settlement.record)
        self._info(
            "settle.http.completed",
            status=stored.status,
            size=stored.size,
            stored=stored.body is not None,
            verdict=verdict.value,
        )
        self.outcome = "executed"
        return None

    def superseded(self, record: OperationRecord | None) -> Response:
        """This attempt lost its reservation: the authoritative response, or a 409."""
        if record is not None and record.state is State.COMPLETED:
            response = self.replay(record)
            self.outcome = "superseded"
            return response
        self.outcome = "superseded"
        detail = (
            "this attempt lost its reservation to a newer attempt and its response was not "
            f"kept; retry with the same {self.policy.header} to get the authoritative outcome"
        )
        return Problem(ProblemKind.SUPERSEDED, detail, self.policy.retry_after).response(
            self.policy.problem_type_base
        )

    def abandoned(self, reason: str, error: BaseException | None = None) -> Response | None:
        """The attempt stops before its last byte (``timeout``, ``client_disconnect``,
        ``lease_lost``): the problem to answer at once, if any. ``error``: the handler's own
        error that ended it, which its client never sees (a 504 or a 409 replaces it): its
        type is logged as ``error`` (never its message, which may quote a payload), so that a
        bug past the deadline or after a lost lease is not lost among the timeouts."""
        if error is None:
            self.log.warning("settle.http.abandoned", reason=reason)
        else:
            self.log.warning("settle.http.abandoned", reason=reason, error=type(error).__name__)
        abandoned = {"timeout": "timeout", "lease_lost": "superseded"}
        self.outcome = abandoned.get(reason, "disconnected")
        if reason != "timeout":
            return None
        detail = (
            f"the request did not finish within {self.policy.timeout} s; it may or may not "
            f"have taken effect. Retry with the same {self.policy.header}."
        )
        return Problem(ProblemKind.TIMEOUT, detail, self.policy.retry_after).response(
            self.policy.problem_type_base
        )

    def still_owns(self, run: Run, renewal: Renewal) -> bool:
        """Whether ``run`` still owns its operation, as a renewal says (the heartbeat's, or
        the one asked before a response over the limit is sent on). It does when the lease
        was renewed, and also when the lease only lapsed with the record still at this
        attempt's generation (:meth:`Renewal.lapsed <settle.models.Renewal.lapsed>`: no newer
        attempt took the key, logged): ``complete`` accepts this generation's settlement of
        such a record (SPEC 2), so the handler runs on and the operation ends completed with
        its response, where a handler stopped half-way would be run again by the retry, and
        a client answered 409 instead would lose the response (every retry gets 410). It
        does too when the record is gone (``unknown_operation``: Redis lost it while the
        handler ran): no other attempt owns the key, and a 409 would send the client back to
        run the handler again (``settled`` then logs ``settle.http.record_lost``).
        Otherwise the lease is lost, and logged."""
        if renewal.renewed or renewal.reason == QuarantineKind.UNKNOWN_OPERATION.value:
            return True
        if renewal.lapsed(run.reservation.generation):
            self._warn("settle.http.lease_lapsed", reason=renewal.reason)
            return True
        self.lease_lost(renewal.reason)
        return False

    def record_gone(self, renewal: Renewal) -> bool:
        """Whether a periodic renewal that did not renew found the record gone
        (``unknown_operation``: Redis lost it while the handler ran; logged as
        ``settle.http.renew_failed`` with that reason). No other attempt owns the key, and
        nothing remembers that the handler ran: stopping it (ASGI), or marking its attempt
        lost so that ``attempt.check()`` raises (WSGI), would answer the client an error
        that sends it back to run the handler again. The handler runs on, unmarked; its
        response is sent unstored at settlement (``settle.http.record_lost``)."""
        if renewal.renewed or renewal.reason != QuarantineKind.UNKNOWN_OPERATION.value:
            return False
        self._warn("settle.http.renew_failed", reason=renewal.reason)
        return True

    def runs_on(self, renewal: Renewal) -> bool:
        """The sync heartbeat's question for a renewal that did not renew and found no
        mere lapse: whether the attempt runs on unmarked (the record is gone:
        :meth:`record_gone`). Otherwise the lease is lost, logged as
        ``settle.http.lease_lost`` as under ASGI (the heartbeat then marks the attempt
        lost), unless the handler has ended (a renewal beside its settlement reads the
        settled record). Asked from a renewer thread: a line that cannot be written changes
        nothing."""
        if self.record_gone(renewal):
            return True
        if not self._ended:
            self.lease_lost(renewal.reason)
        return False

    def lease_lost(self, reason: str | None) -> None:
        self._warn("settle.http.lease_lost", reason=reason)

    def renew_failed(self, exc: Exception) -> None:
        self._warn("settle.http.renew_failed", error=type(exc).__name__)

    def _warn(self, event: str, **fields: Any) -> None:
        """Log a renewal's warning. Asked from a heartbeat (the sync guards' renewer thread,
        the ASGI runner's task): a line that cannot be written (an application's processor
        that raises, a closed stream) is dropped, as the decorator's heartbeats drop theirs.
        It must neither end the heartbeat, which would let the lease lapse under the running
        handler, nor change the answer (a lost lease not marked lost would run on)."""
        with contextlib.suppress(Exception):
            self.log.warning(event, **fields)

    def escaping(self, exc: SettleError) -> None:
        """Ready ``exc`` to leave the middleware, which lets it through (the server answers
        its own 500): log ``settle.http.failed``, set the outcome ``error``, and name the
        operation in its message by its ``operation_digest`` instead of its id, which holds
        the client's ``Idempotency-Key`` (an HTTP server instrumentation records an escaping
        exception's message on its span, an error handler logs it). The id itself stays in
        ``exc.operation_id`` for code that handles the error."""
        self.log.error("settle.http.failed", error=type(exc).__name__)
        self.outcome = "error"
        self.handler_raised(exc)

    def handler_raised(self, exc: BaseException) -> None:
        """Ready the handler's own exception to leave the middleware: where its message
        quotes the operation id (``attempt.check()``'s ``StaleAttempt`` and ``TimeoutError``
        do, and so may what the handler built from them), name the operation by its
        ``operation_digest`` instead, as :meth:`escaping` does for settle's errors. The
        exceptions it was raised from (``__cause__``, ``__context__``) and the members of an
        exception group are rewritten too, and an ``OSError``'s ``strerror`` and file names,
        and notes (``add_note``). A message an exception keeps elsewhere (its own
        ``__str__``, an exception group's own message) is left as it is."""
        op = self._operation
        if not op:
            return
        named = f"operation_digest={operation_digest(op)}"
        quoted = repr(op)

        def clean(value: object) -> object:
            if isinstance(value, str) and op in value:
                return value.replace(quoted, named).replace(op, named)
            return value

        for current in _chained(exc):
            # An exception class may refuse a new value (a read-only property): what it
            # keeps is then left as it is, and the walk goes on (settling comes after it).
            with contextlib.suppress(AttributeError, TypeError):
                if any(isinstance(arg, str) and op in arg for arg in current.args):
                    current.args = tuple(clean(arg) for arg in current.args)
            notes = getattr(current, "__notes__", None)
            if isinstance(notes, list):
                notes[:] = [clean(note) for note in notes]
            if isinstance(current, OSError):
                for name in ("strerror", "filename", "filename2"):
                    value = getattr(current, name, None)
                    if isinstance(value, str) and op in value:
                        with contextlib.suppress(AttributeError, TypeError):
                            setattr(current, name, clean(value))

    # -- helpers -------------------------------------------------------------------------

    def _not_stored(self, reservation: Reservation, status: int, size: int) -> Settle:
        self.log.warning(
            "settle.http.response_not_stored",
            status=status,
            size=size,
            limit=self.policy.max_response_bytes,
        )
        return Settle(reservation, StoredResponse.not_stored(status, size))

    def _reject(self, kind: ProblemKind, detail: str, level: str = "info") -> Answer:
        getattr(self.log, level)("settle.http.rejected", problem=kind.value)
        return self._answer(kind, detail)

    def _answer(self, kind: ProblemKind, detail: str, *, retry: bool = False) -> Answer:
        self.outcome = _OUTCOME.get(kind, "rejected")
        policy = self.policy
        # RFC 9110 15.5.2: a 401 carries a challenge; the application names it (policy).
        challenge = policy.www_authenticate if kind.status == 401 else None
        problem = Problem(kind, detail, policy.retry_after if retry else None, challenge)
        return Answer(problem.response(policy.problem_type_base))


def _chained(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it was raised from or with (``__cause__``,
    ``__context__``, an exception group's members), each once."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        todo.extend((current.__cause__, current.__context__))


def stored_response(record: OperationRecord) -> StoredResponse:
    """The response stored in a completed record (CorruptRecord if it holds something else)."""
    try:
        return record.value(StoredResponse)
    except (ValueError, ValidationError) as exc:
        # This error leaves the middleware, and a server span or error log records its
        # message and chained causes: the message names the digest, never the id (which
        # holds the client's key; the error's operation_id attribute keeps it), and the
        # validation error, which quotes the stored value, is not chained.
        digest = operation_digest(record.operation_id)
        raise CorruptRecord(
            f"operation (operation_digest={digest}) is {record.state.value} but does not hold "
            f"a stored HTTP response ({type(exc).__name__}); another writer uses this "
            "operation id",
            operation_id=record.operation_id,
        ) from None
