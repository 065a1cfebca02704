"""Every reservation, transition and rejection is logged with a stable event name and named
fields, and no payload, result or principal ever reaches the logs."""

from __future__ import annotations

from structlog.testing import capture_logs

from settle import BindingMismatch, FingerprintMismatch, Settler

SECRET_CARD = "4242424242424242"
PRINCIPAL = "tenant:acme/user:42"


def test_events_have_stable_names_fields_and_no_payloads(settler: Settler) -> None:
    request = {"card": SECRET_CARD, "amount": 100}
    with capture_logs() as logs:
        r = settler.reserve("op-1", request, principal=PRINCIPAL, lease=30)
        settler.reserve("op-1", request, principal=PRINCIPAL)  # in progress
        settler.renew(r.reservation, lease=30)
        settler.complete(r.reservation, {"receipt": SECRET_CARD})
        settler.complete(r.reservation, {"receipt": SECRET_CARD})  # absorbed
        settler.complete(r.reservation, {"receipt": "other " + SECRET_CARD})  # conflict
        settler.reserve("op-1", request, principal=PRINCIPAL)  # replay
        for bad in ({"card": SECRET_CARD, "amount": 1}, None):
            try:
                if bad is None:
                    settler.reserve("op-1", request, principal="tenant:other")
                else:
                    settler.reserve("op-1", bad, principal=PRINCIPAL)
            except (FingerprintMismatch, BindingMismatch):
                pass
    events = [e["event"] for e in logs]
    assert events == [
        "settle.reserve.reserved",
        "settle.reserve.in_progress",
        "settle.renew.renewed",
        "settle.settlement.accepted",
        "settle.settlement.absorbed",
        "settle.settlement.quarantined",
        "settle.reserve.replayed",
        "settle.reserve.rejected",
        "settle.reserve.rejected",
    ]
    for entry in logs:
        assert entry["operation_id"] == "op-1"
        assert entry["namespace"] == settler.config.namespace
        text = repr(entry)
        assert SECRET_CARD not in text
        assert PRINCIPAL not in text
    quarantined = next(e for e in logs if e["event"] == "settle.settlement.quarantined")
    assert quarantined["kind"] == "conflicting_settlement"
    assert quarantined["quarantine_id"]
    assert quarantined["generation"] == r.reservation.generation
    rejected = [e["reason"] for e in logs if e["event"] == "settle.reserve.rejected"]
    assert rejected == ["fingerprint_mismatch", "binding_mismatch"]
