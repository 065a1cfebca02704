"""SPEC 12: log lines carry operation ids, principals and the other inputs of idempotency
keys only as keyed digests. Every call of a logger in settle's source is read: none passes an
operation id, a principal, a key, a binding, a progress emission id or a cursor event id as a
field (the digests are ``operation_digest``, ``binding_digest``, ``emission_digest`` and
``event_digest``), and no field that names a digest holds anything else."""

from __future__ import annotations

import ast
from pathlib import Path

SETTLE = Path(__file__).resolve().parents[2] / "settle"
LOG_METHODS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "msg", "bind"}
FORBIDDEN = {
    "operation_id",
    "principal",
    "binding",
    "key",
    "idempotency_key",
    "request",
    "emission",
    "emission_id",
    "event",
    "event_id",
    "missing_event",
    "payload",
    "cursor",
}
DIGESTS = ("binding_digest(", "operation_digest(", "emission_digest(", "event_digest(")


def test_no_logger_call_passes_an_operation_id_or_a_principal() -> None:
    found = []
    for path in sorted(SETTLE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in LOG_METHODS:
                continue
            for keyword in node.keywords:
                value = ast.unparse(keyword.value)
                named = keyword.arg in FORBIDDEN or (
                    keyword.arg is not None
                    and keyword.arg.endswith(("emission_digest", "event_digest"))
                )
                if named and not value.startswith(DIGESTS):
                    found.append(f"{path.relative_to(SETTLE)}:{node.lineno} {keyword.arg}")
    assert found == []
