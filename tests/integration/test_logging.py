"""Every reservation, transition and rejection is logged with a stable event name and named
fields, and no payload, result, principal or operation id ever reaches the logs (SPEC 12:
operation ids and principals only as keyed digests)."""

from __future__ import annotations

import httpx
from structlog.testing import capture_logs

from settle import BindingMismatch, FingerprintMismatch, Settler
from settle._log import operation_digest
from tests.http.apps import Ledger, key_headers, serve_wsgi, wsgi_app

SECRET_CARD = "4242424242424242"
PRINCIPAL = "tenant:acme/user:42"
OP = "order-4711-of-customer-99"


def test_events_have_stable_names_fields_and_no_payloads(settler: Settler) -> None:
    request = {"card": SECRET_CARD, "amount": 100}
    with capture_logs() as logs:
        r = settler.reserve(OP, request, principal=PRINCIPAL, lease=30)
        settler.reserve(OP, request, principal=PRINCIPAL)  # in progress
        settler.renew(r.reservation, lease=30)
        settler.complete(r.reservation, {"receipt": SECRET_CARD})
        settler.complete(r.reservation, {"receipt": SECRET_CARD})  # absorbed
        settler.complete(r.reservation, {"receipt": "other " + SECRET_CARD})  # conflict
        settler.reserve(OP, request, principal=PRINCIPAL)  # replay
        for bad in ({"card": SECRET_CARD, "amount": 1}, None):
            try:
                if bad is None:
                    settler.reserve(OP, request, principal="tenant:other")
                else:
                    settler.reserve(OP, bad, principal=PRINCIPAL)
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
        assert "operation_id" not in entry
        assert entry["operation_digest"] == operation_digest(OP)
        assert entry["namespace"] == settler.config.namespace
        text = repr(entry)
        assert SECRET_CARD not in text
        assert PRINCIPAL not in text
        assert OP not in text
    quarantined = next(e for e in logs if e["event"] == "settle.settlement.quarantined")
    assert quarantined["kind"] == "conflicting_settlement"
    assert quarantined["quarantine_id"]
    assert quarantined["generation"] == r.reservation.generation
    rejected = [e["reason"] for e in logs if e["event"] == "settle.reserve.rejected"]
    assert rejected == ["fingerprint_mismatch", "binding_mismatch"]


def test_the_decorator_and_the_http_guard_log_operation_ids_only_as_digests(
    settler: Settler,
) -> None:
    @settler.operation(key="charge:{order}", principal=PRINCIPAL)
    def charge(order: str) -> int:
        return 1

    key = "client-key-5555-secret"
    with capture_logs() as logs:
        charge("order-31337")
        charge("order-31337")  # replayed: logged by the decorator
        app = wsgi_app(settler, Ledger())
        with serve_wsgi(app) as base, httpx.Client(base_url=base, timeout=30) as client:
            for _ in range(2):  # executed, then replayed
                client.post("/payments", json={"amount": 1}, headers=key_headers(key))
    events = {e["event"] for e in logs}
    assert "settle.operation.replayed" in events
    assert any(e.startswith("settle.http.") for e in events), events
    for entry in logs:
        text = repr(entry)
        assert "order-31337" not in text
        assert key not in text
        assert "operation_id" not in entry
    replayed = next(e for e in logs if e["event"] == "settle.operation.replayed")
    assert replayed["operation_digest"] == operation_digest("charge:order-31337")


def test_reserved_names_a_takeover_as_the_reservation_and_its_span_do(settler: Settler) -> None:
    """``settle.reserve.reserved`` carries ``takeover`` as ``Reserved.takeover`` and the
    span's ``settle.takeover`` do: None for a new reservation, ``provisional`` /
    ``lease_expired`` for a takeover; ``resumed`` says the same attempt reserved again."""
    with capture_logs() as logs:
        first = settler.reserve("order-take-1", {"a": 1}, principal=PRINCIPAL)
        settler.mark_provisional(first.reservation, "test: failed")
        second = settler.reserve("order-take-1", {"a": 1}, principal=PRINCIPAL)
    reserved = [e for e in logs if e["event"] == "settle.reserve.reserved"]
    assert [(e["takeover"], e["resumed"]) for e in reserved] == [
        (None, False),
        ("provisional", False),
    ]
    assert [first.takeover, second.takeover] == [None, "provisional"]
