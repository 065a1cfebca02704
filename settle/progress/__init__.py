"""Delivery progress and settlement (SPEC §10).

The causal order is: apply covered effects -> durably record exact application progress ->
settle provider delivery state. Progress is not one offset (see :class:`Progress`), the
identities are distinct types, and every settlement is authorized by durable progress.
"""

from settle.progress._async import AsyncProgressStore, AsyncStreamConsumer, PollReport
from settle.progress._sync import ProgressStore, StreamConsumer
from settle.progress.errors import (
    DeferDelivery,
    ProgressError,
    ProviderReset,
    SettlementNotAuthorized,
)
from settle.progress.identity import (
    DeliveryId,
    EmissionId,
    ProviderScope,
)
from settle.progress.models import (
    Applied,
    ApplyStatus,
    EffectContext,
    IntentKind,
    Progress,
    SettlementReceipt,
)
from settle.progress.planning import (
    SettlementPlan,
    plan_settlements,
)

__all__ = [
    "Applied",
    "ApplyStatus",
    "AsyncProgressStore",
    "AsyncStreamConsumer",
    "DeferDelivery",
    "DeliveryId",
    "EffectContext",
    "EmissionId",
    "IntentKind",
    "PollReport",
    "Progress",
    "ProgressError",
    "ProgressStore",
    "ProviderReset",
    "ProviderScope",
    "SettlementNotAuthorized",
    "SettlementPlan",
    "SettlementReceipt",
    "StreamConsumer",
    "plan_settlements",
]
