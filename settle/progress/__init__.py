"""Delivery progress and settlement (SPEC §10).

The causal order is: apply covered effects -> durably record exact application progress ->
settle provider delivery state. Progress is not one offset (see :class:`Progress`), the
identities are distinct types, and every settlement is authorized by durable progress.
"""

from settle.progress._async import AsyncProgressStore, AsyncStreamConsumer, PollReport
from settle.progress._sync import ProgressStore, StreamConsumer
from settle.progress.errors import (
    DeferDelivery,
    InvalidDelivery,
    ProgressError,
    ProviderReset,
    SettlementNotAuthorized,
    UnprovenListing,
)
from settle.progress.identity import (
    AttemptId,
    DeliveryId,
    EmissionId,
    ProviderScope,
    ReplayCursor,
    SettlementAuthority,
)
from settle.progress.models import (
    Applied,
    ApplyStatus,
    DeferredDelivery,
    EffectContext,
    IntentKind,
    Progress,
    ProviderFloor,
    SettleIntent,
    SettlementOutcome,
    SettlementReceipt,
)
from settle.progress.planning import (
    Batch,
    Cumulative,
    Individual,
    SettlementPlan,
    authorize_batch,
    authorize_cumulative,
    authorize_individual,
    plan_settlements,
)

__all__ = [
    "Applied",
    "ApplyStatus",
    "AsyncProgressStore",
    "AsyncStreamConsumer",
    "AttemptId",
    "Batch",
    "Cumulative",
    "DeferDelivery",
    "DeferredDelivery",
    "DeliveryId",
    "EffectContext",
    "EmissionId",
    "Individual",
    "IntentKind",
    "InvalidDelivery",
    "PollReport",
    "Progress",
    "ProgressError",
    "ProgressStore",
    "ProviderFloor",
    "ProviderReset",
    "ProviderScope",
    "ReplayCursor",
    "SettleIntent",
    "SettlementAuthority",
    "SettlementNotAuthorized",
    "SettlementOutcome",
    "SettlementPlan",
    "SettlementReceipt",
    "StreamConsumer",
    "UnprovenListing",
    "authorize_batch",
    "authorize_cumulative",
    "authorize_individual",
    "plan_settlements",
]
