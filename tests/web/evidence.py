"""Quarantine evidence written for real: a real Settler on the test redis-server driven into
stale, misbound, conflicting and unknown-operation settlements, some of them carrying HTML
and script in every stored text field the console shows."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from settle import Reserved, Settler
from settle._core.keys import Keys
from settle.errors import InvalidInput
from settle.models import QuarantineEntry, Reservation
from tests.cli.helpers import stale_settlement

__all__ = [
    "HOSTILE",
    "conflicting",
    "ghost_of",
    "hostile_entry",
    "legacy_note",
    "misbound",
    "stale_settlement",
    "unknown",
]

#: What an attacker would like a browser to run; the console must show it as text.
SCRIPT = "<script>window.__settle_xss = 1</script>"
IMG = '<img src=x onerror="window.__settle_xss = 2">'
HOSTILE = SCRIPT + IMG


def conflicting(settler: Settler, operation_id: str, result: object = None) -> str:
    """A second, different success for an operation already completed."""
    r = settler.reserve(operation_id, {"amount": 990}, principal="tenant:acme", lease=5)
    assert isinstance(r, Reserved)
    settler.complete(r.reservation, {"charge_id": "ch_1"})
    late = settler.complete(r.reservation, result if result is not None else {"charge_id": "ch_2"})
    assert late.quarantine_id is not None
    return late.quarantine_id


def ghost_of(name: str) -> Reservation:
    """A reservation of operation ``ghost-<name>``, which has no record: settling it makes
    an unknown_operation quarantine entry."""
    return Reservation(
        operation_id=f"ghost-{name}",
        fingerprint="a" * 64,
        fingerprint_version=1,
        binding="tenant:acme",
        generation=7,
        attempt_id=f"w-{name}",
    )


def misbound(settler: Settler, operation_id: str, binding: str, result: object) -> str:
    """A response that presents another principal than the operation is bound to."""
    r = settler.reserve(operation_id, {"amount": 10}, principal="tenant:acme", lease=5)
    assert isinstance(r, Reserved)
    forged = r.reservation.model_copy(update={"binding": binding})
    late = settler.complete(forged, result)
    assert late.quarantine_id is not None
    return late.quarantine_id


def unknown(settler: Settler, operation_id: str) -> str:
    """A response for an operation that has no record at all."""
    r = settler.reserve(f"{operation_id}-seed", {"amount": 1}, principal="tenant:acme", lease=5)
    assert isinstance(r, Reserved)
    stray = r.reservation.model_copy(update={"operation_id": operation_id})
    late = settler.complete(stray, {"charge_id": "ch_stray"})
    assert late.quarantine_id is not None
    return late.quarantine_id


def hostile_entry(settler: Settler) -> str:
    """A misbound response whose operation id, principal and payload all hold HTML."""
    return misbound(
        settler,
        f"order-{IMG}",
        f"tenant:{SCRIPT}",
        {"note": HOSTILE, "raw": "bell\x07 escape\x1b[31m"},
    )


def legacy_note(settler: Settler, ref: str, note: str) -> None:
    """Resolve entry ``ref`` with a note as an earlier version could store it: control
    characters included, which ``quarantine.resolve`` now refuses (InvalidInput)."""
    with pytest.raises(InvalidInput):
        settler.quarantine.resolve(ref, note=note)
    shard, entry_id = ref.split("/")
    resolutions = Keys(settler.config.namespace, settler.config.shards).resolutions(int(shard))
    seconds, micros = settler.client.time()
    resolution = {"note": note, "at": int(seconds) * 1000 + int(micros) // 1000}
    assert settler.client.hsetnx(resolutions, entry_id, json.dumps(resolution))


def listing_order(entry: QuarantineEntry) -> tuple[int, int, datetime, int]:
    """Where an entry sits in a listing across shards (docs/concepts.md, "The quarantine"):
    its stream id's millisecond and sequence, then its server time, then its shard."""
    ms, seq = entry.id.split("-")
    return int(ms), int(seq), entry.at, entry.shard
