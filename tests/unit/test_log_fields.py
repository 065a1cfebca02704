"""SPEC 12: log lines carry operation ids and principals only as keyed digests. Every call
of a logger in settle's source is read: none passes an operation id, a principal, a key or a
binding as a field (the digests are ``operation_digest`` and ``binding_digest``)."""

from __future__ import annotations

import ast
from pathlib import Path

SETTLE = Path(__file__).resolve().parents[2] / "settle"
LOG_METHODS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "msg", "bind"}
FORBIDDEN = {"operation_id", "principal", "binding", "key", "idempotency_key", "request"}


def test_no_logger_call_passes_an_operation_id_or_a_principal() -> None:
    found = []
    for path in sorted(SETTLE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in LOG_METHODS:
                continue
            for keyword in node.keywords:
                if keyword.arg in FORBIDDEN:
                    value = ast.unparse(keyword.value)
                    if not value.startswith(("binding_digest(", "operation_digest(")):
                        found.append(f"{path.relative_to(SETTLE)}:{node.lineno} {keyword.arg}")
    assert found == []
