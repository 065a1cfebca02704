"""Handling one delivery as a sans-I/O procedure (SPEC 10): the causal order apply covered
effects -> durably record exact application progress -> settle provider delivery state.

Each procedure is a generator that yields instructions (run this script on the progress
server: the runtime's ``RunScript``; run this one on the stream's server; run the effect;
tell the observer) and receives their results; an effect's exception is thrown back in.
The sync and async shells (``_async.py``, ``_sync.py``) carry instructions out with one
small loop, ``drive``, as the cursor's consumer does with ``settle.cursor._step``. Every
decision lives here and in ``_core``: which delivery is dead-lettered, deferred, released
or acknowledged, and what authorizes each settlement.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from settle._input import refuse_unawaited
from settle._log import emission_digest
from settle._runtime import Call, RunScript
from settle.progress._core import Disposition, ProgressCore, ProgressReply, StreamEntry
from settle.progress.errors import DeferDelivery, ProviderReset, SettlementNotAuthorized
from settle.progress.identity import (
    AttemptId,
    DeliveryId,
    EmissionId,
    ProviderScope,
    SettlementAuthority,
)
from settle.progress.models import (
    Applied,
    ApplyStatus,
    EffectContext,
    IntentKind,
    Progress,
    SettlementReceipt,
)
from settle.progress.planning import authorize_individual, authorize_settlement

__all__ = [
    "RELEASE_IDLE_MS",
    "Instruction",
    "Notify",
    "RunEffect",
    "RunScript",
    "RunStreamScript",
    "Settling",
    "apply",
    "dead_letter",
    "defer",
    "deliver",
    "progress",
    "settle",
    "vanished",
]

#: A released delivery looks idle "forever", so any worker may reclaim it at once.
RELEASE_IDLE_MS = 10 * 365 * 86_400 * 1000


@dataclass(frozen=True, slots=True)
class RunStreamScript:
    """Run ``call`` on the stream's server; send back its raw reply."""

    call: Call


@dataclass(frozen=True, slots=True)
class RunEffect:
    """Run the user's effect; throw its exception back in if it raises."""

    context: EffectContext


class EffectFailed(Exception):
    """The user's effect raised ``error`` (only inside :func:`deliver`)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(f"the effect failed: {type(error).__name__}")
        self.error = error


@dataclass(frozen=True, slots=True)
class Notify:
    """Tell the observer that ``step`` happened for ``delivery`` (metrics, crash-cut tests)."""

    step: str
    delivery: DeliveryId


@dataclass(frozen=True, slots=True)
class Settling:
    """A settlement of a delivery as ``kind`` begins; the procedure returns its receipt.
    The shell opens the settlement's span (messaging conventions) and closes it with the
    receipt or the error. Nothing is decided on it."""

    scope: ProviderScope
    kind: IntentKind


Instruction = RunScript | RunStreamScript | RunEffect | Notify | Settling
Steps = Generator[Instruction, Any, Any]


def progress(
    core: ProgressCore, call: Call, *, claim: bool
) -> Generator[Instruction, Any, ProgressReply]:
    """Run one planned progress call. With ``claim`` (the store's own calls: it has no
    stream server to ask) the call creates the scope's state when there is none. Without it
    (a stream consumer), a reply ``unclaimed`` (no state: a new scope, or progress the
    server lost) is checked against the stream's server first: a scope whose incarnation
    had deliveries acknowledged raises :class:`ProgressLost` and nothing is written
    (unless the call, sent again, finds the state another worker created meanwhile);
    otherwise the call is sent again, claiming the new scope. A read (the authorization
    of a hand-called settlement) answers ``unclaimed`` too when it finds no state, and
    meets the same rule; it creates nothing, and a new scope's empty progress is its
    answer."""
    if claim:
        call = core.claiming(call)
    reply = core.decode(call, (yield RunScript(call)))
    if reply.code != "unclaimed":
        return reply
    scope = core.scope_of(call)
    check = core.plan_evidence(scope)
    if core.evidence(scope, check, (yield RunStreamScript(check))):
        # Acknowledged: the scope had state. Another worker of the group may have created
        # it (and acknowledged a delivery) after this call found none: asked again, only a
        # scope still without state is progress the server lost.
        reply = core.decode(call, (yield RunScript(call)))
        if reply.code != "unclaimed":
            return reply
        core.progress_lost(scope)
    if call.script == "read":
        return reply
    core.scope_claimed(scope)
    call = core.claiming(call)
    return core.decode(call, (yield RunScript(call)))


def apply(
    core: ProgressCore,
    scope: ProviderScope,
    delivery: DeliveryId,
    emission: EmissionId,
    attempt: AttemptId,
    fields: dict[str, bytes],
    *,
    claim: bool,
    mark_effect_failures: bool = False,
) -> Generator[Instruction, Any, Applied]:
    """Consult progress; run the effect unless the delivery or its emission is already
    applied; then record progress durably (and open its settle intent). Only the returned
    progress authorizes settling the delivery. With ``mark_effect_failures`` an exception
    of the effect itself comes out as :class:`EffectFailed`, so that the caller never takes
    settle's own errors (a corrupt reply, a bad input) for a failed effect. ``claim``: see
    :func:`progress`."""
    begun = yield from progress(
        core, core.plan_begin(scope, delivery, emission, attempt), claim=claim
    )
    log = core.log.bind(delivery=delivery.value, emission_digest=emission_digest(emission.value))
    if begun.code == "covered":
        log.info("settle.progress.covered", by=begun.detail)
        return Applied(
            ApplyStatus.COVERED,
            delivery,
            emission,
            attempt,
            begun.progress,
            dead_lettered=begun.detail == "dead_lettered",
        )
    if begun.code == "fresh":
        try:
            done = yield RunEffect(
                EffectContext(core.consumer, emission, delivery, attempt, fields)
            )
        except (DeferDelivery, ProviderReset):
            raise
        except Exception as exc:
            if mark_effect_failures:
                raise EffectFailed(exc) from exc
            raise
        # Not the effect's failure (it never ran): the worker stops, the delivery stays
        # pending, unrecorded, for a worker whose effect runs.
        refuse_unawaited(done, "effect", "AsyncStreamConsumer / AsyncProgressStore", core.consumer)
        yield Notify("effect_applied", delivery)
    recorded = yield from progress(
        core, core.plan_record(scope, delivery, emission, attempt), claim=claim
    )
    yield Notify("progress_recorded", delivery)
    status = ApplyStatus.APPLIED if recorded.detail == "applied" else ApplyStatus.DUPLICATE
    if recorded.code == "covered":
        # Progress covered the delivery when it was recorded: this attempt's own first try
        # did (a repeat after a lost reply), or another worker recorded it meanwhile (this
        # worker's claim lapsed). Whatever the cause, the status says what this call did:
        # its effect ran (APPLIED), or its emission was applied under another delivery
        # (DUPLICATE). COVERED, "no effect ran", only when neither holds, or when another
        # worker dead-lettered the delivery meanwhile.
        if begun.code == "applied":
            status = ApplyStatus.DUPLICATE
        elif begun.code == "fresh" and recorded.detail != "dead_lettered":
            status = ApplyStatus.APPLIED
        else:
            status = ApplyStatus.COVERED
    log.info(f"settle.progress.{status.value}", attempt=attempt.value)
    # Dead-lettered while the effect ran (another worker's limit): said as begin says it,
    # so a caller settles it as a dead letter, not as an applied delivery.
    dead = recorded.code == "covered" and recorded.detail == "dead_lettered"
    return Applied(status, delivery, emission, attempt, recorded.progress, dead_lettered=dead)


def dead_letter(
    core: ProgressCore,
    scope: ProviderScope,
    delivery: DeliveryId,
    emission: EmissionId | None,
    reason: str,
    delivery_count: int,
    *,
    claim: bool,
) -> Generator[Instruction, Any, ProgressReply]:
    """Quarantine a delivery durably (evidence + dead_letter intent) before the provider
    is told. ``claim``: see :func:`progress`."""
    call = core.plan_dead_letter(scope, delivery, emission, reason, delivery_count)
    reply = yield from progress(core, call, claim=claim)
    core.log.warning(
        "settle.progress.dead_lettered",
        delivery=delivery.value,
        emission_digest=emission_digest(emission.value if emission else None),
        reason=reason,
        delivery_count=delivery_count,
        outcome=reply.code,
    )
    yield Notify("dead_letter_recorded", delivery)
    return reply


def defer(
    core: ProgressCore,
    scope: ProviderScope,
    delivery: DeliveryId,
    emission: EmissionId,
    reason: str,
    *,
    claim: bool,
) -> Generator[Instruction, Any, ProgressReply]:
    """Set a delivery aside durably (unapplied) before the provider stops redelivering it.
    ``claim``: see :func:`progress`."""
    call = core.plan_defer(scope, delivery, emission, reason)
    reply = yield from progress(core, call, claim=claim)
    core.log.info(
        "settle.progress.deferred",
        delivery=delivery.value,
        emission_digest=emission_digest(emission.value),
        reason=reason,
        outcome=reply.code,
    )
    yield Notify("defer_recorded", delivery)
    return reply


def recorded_reason(progress: Progress, delivery: DeliveryId, reason: str) -> str:
    """The reason of ``delivery``'s dead-letter intent in ``progress`` (what ``recover()``
    writes in the stream-side entry), else ``reason``: a delivery dead-lettered before (by
    hand, by another worker) keeps the reason it was dead-lettered for."""
    return next(
        (
            i.reason
            for i in progress.intents
            if i.delivery == delivery and i.kind is IntentKind.DEAD_LETTER
        ),
        reason,
    )


def authorized(core: ProgressCore, read: Progress, delivery: DeliveryId, kind: IntentKind) -> None:
    """:func:`~settle.progress.planning.authorize_settlement`, its refusal logged
    (``settle.progress.settle_unauthorized``): the provider is not told ``kind`` for a
    delivery durable progress does not hold so (SPEC 10)."""
    try:
        authorize_settlement(read, delivery, kind)
    except SettlementNotAuthorized:
        core.log.warning(
            "settle.progress.settle_unauthorized", delivery=str(delivery), kind=kind.value
        )
        raise


def settle(
    core: ProgressCore,
    scope: ProviderScope,
    authority: SettlementAuthority,
    kind: IntentKind,
    emission: EmissionId | None = None,
    reason: str = "",
    *,
    fenced_count: bool = True,
    authorize: bool = False,
) -> Generator[Instruction, Any, SettlementReceipt]:
    """One fenced settlement on the stream's server, then its receipt in progress (a
    conclusive answer closes the settle intent). ``authorize``: for a caller that holds no
    progress reply of its own (the public ``settle``, ``recover``): durable progress is read
    first and must authorize ``kind`` for the delivery
    (:func:`~settle.progress.planning.authorize_settlement`); otherwise
    :class:`SettlementNotAuthorized` is raised and nothing is written or settled. An
    argument of the wrong type (a kind given as the string ``"ack"``, an emission as a
    str, a ``fenced_count`` that is not a bool, a reason that is not a str of at most
    ``MAX_REASON`` characters) is :class:`InvalidDelivery`, before anything is read or
    sent: the settlement is planned first."""
    call = core.plan_stream_settle(
        scope,
        authority,
        kind,
        fenced_count=fenced_count,
        emission=emission,
        reason=reason,
        release_idle_ms=RELEASE_IDLE_MS,
    )
    if authorize and kind is not IntentKind.RELEASE:  # a release needs no progress
        read = yield from progress(core, core.plan_read(scope), claim=False)
        authorized(core, read.progress, authority.delivery, kind)
    yield Settling(scope, kind)
    verdict = core.decode_stream_settle(call, (yield RunStreamScript(call)))
    yield Notify("provider_answered", authority.delivery)
    worker = authority.worker
    recorded = yield from progress(
        core, core.plan_receipt(scope, authority.delivery, kind, verdict, worker), claim=False
    )
    receipt = core.receipt(authority.delivery, kind, verdict, worker, recorded)
    core.check_group(verdict, scope)
    return receipt


def deliver(
    core: ProgressCore,
    scope: ProviderScope,
    worker: str,
    entry: StreamEntry,
    delivery_count: int,
    *,
    emission_field: str,
    max_deliveries: int,
) -> Generator[Instruction, Any, SettlementReceipt | None]:
    """Handle one delivery the worker holds at ``delivery_count``: dead-letter a malformed
    or poisoned one, defer one the effect asks to defer, release one whose effect failed,
    and acknowledge one only with durable progress that covers it."""
    delivery = entry.delivery
    authority = SettlementAuthority(worker, delivery, delivery_count)
    disposition, emission = core.disposition(entry, delivery_count, emission_field, max_deliveries)
    if disposition is not Disposition.APPLY or emission is None:
        reason = "malformed" if disposition is Disposition.MALFORMED else "delivery_limit"
        reply = yield from dead_letter(
            core, scope, delivery, emission, reason, delivery_count, claim=False
        )
        if reply.code == "dead_lettered":
            reason = recorded_reason(reply.progress, delivery, reason)
            return (
                yield from settle(core, scope, authority, IntentKind.DEAD_LETTER, emission, reason)
            )
        # Progress already covers it (applied before it went bad): settle it as applied.
        authorize_individual(reply.progress, delivery)
        return (yield from settle(core, scope, authority, IntentKind.ACK, emission))
    try:
        applied = yield from apply(
            core,
            scope,
            delivery,
            emission,
            AttemptId.new(),
            dict(entry.fields),
            claim=False,
            mark_effect_failures=True,
        )
    except DeferDelivery as signal:
        reply = yield from defer(core, scope, delivery, emission, signal.reason, claim=False)
        if reply.code != "deferred":
            return None
        return (
            yield from settle(core, scope, authority, IntentKind.DEFER, emission, signal.reason)
        )
    except EffectFailed as failed:  # the effect itself failed: negative settlement
        core.log.warning(
            "settle.progress.effect_failed",
            delivery=delivery.value,
            emission_digest=emission_digest(emission.value),
            error_type=type(failed.error).__name__,
            delivery_count=delivery_count,
        )
        return (
            yield from settle(core, scope, authority, IntentKind.RELEASE, emission, "effect_failed")
        )
    if applied.dead_lettered:
        reason = recorded_reason(applied.progress, delivery, "dead_letter")
        return (yield from settle(core, scope, authority, IntentKind.DEAD_LETTER, emission, reason))
    authorize_individual(applied.progress, delivery)
    return (yield from settle(core, scope, authority, IntentKind.ACK, emission))


def vanished(
    core: ProgressCore,
    scope: ProviderScope,
    worker: str,
    delivery: DeliveryId,
    delivery_count: int,
) -> Generator[Instruction, Any, SettlementReceipt]:
    """A pending delivery whose stream entry was deleted (XDEL, MAXLEN trimming): its fields
    are gone, so it can never be applied. Applied and recorded before: settle it from
    progress. Otherwise: dead-letter it durably with reason ``deleted`` (resolved for the
    floor, evidence kept), then tell the provider (Redis 6.2 still holds it pending; Redis 7
    dropped it, which answers ``not_pending`` and closes the intent)."""
    core.log.warning(
        "settle.progress.deleted_while_pending",
        stream=scope.stream,
        delivery=delivery.value,
        delivery_count=delivery_count,
    )
    authority = SettlementAuthority(worker, delivery, delivery_count)
    reply = yield from dead_letter(
        core, scope, delivery, None, "deleted", delivery_count, claim=False
    )
    if reply.code == "dead_lettered":
        reason = recorded_reason(reply.progress, delivery, "deleted")
        return (
            yield from settle(
                core, scope, authority, IntentKind.DEAD_LETTER, None, reason, fenced_count=False
            )
        )
    authorize_individual(reply.progress, delivery)
    return (yield from settle(core, scope, authority, IntentKind.ACK, fenced_count=False))
