"""How a fault scenario names what a caller saw: a charge (with who ran it), or an error's
type (for ``StaleAttempt``, also what the authoritative record holds)."""

from __future__ import annotations

import json
from collections.abc import Callable

from settle import StaleAttempt, State

__all__ = ["describe", "outcome"]


def describe(result: object) -> str:
    if isinstance(result, dict) and "charge_id" in result:
        return f"{result['charge_id']} (run by {result['by']})"
    return f"returned {type(result).__name__}"


def outcome(call: Callable[[], object]) -> str:
    try:
        return describe(call())
    except StaleAttempt as exc:
        record = exc.record
        if record is not None and record.state is State.COMPLETED and record.result is not None:
            return f"StaleAttempt, record holds {describe(json.loads(record.result))}"
        return "StaleAttempt"
    except Exception as exc:
        return type(exc).__name__
