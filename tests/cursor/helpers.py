"""Shared steps of the cursor tests."""

from __future__ import annotations

from settle.cursor import CursorConsumer, StepOutcome, StepResult
from tests.cursor.provider import Provider, TransportLost


class Crash(Exception):
    """A worker dying in the middle of its work (in-process cut)."""


def drain(consumer: CursorConsumer, *, max_steps: int = 200) -> list[StepResult]:
    """Step until caught up, retrying lost responses as a real worker loop would."""
    results: list[StepResult] = []
    for _ in range(max_steps):
        try:
            result = consumer.step()
        except TransportLost:
            continue
        results.append(result)
        if result.outcome is StepOutcome.HELD or result.applied + result.skipped == 0:
            return results
    raise AssertionError("did not catch up")


def truth(provider: Provider) -> list[str]:
    """The ground truth: every event of the provider's log, in position order."""
    return [e.id for e in sorted(provider.log, key=lambda e: e.position)]
