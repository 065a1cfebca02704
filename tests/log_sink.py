"""A log pipeline that fails: an application's structlog processor that raises."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import structlog
from structlog.testing import LogCapture, capture_logs

__all__ = ["logs_behind_a_failing_sink"]


@contextlib.contextmanager
def logs_behind_a_failing_sink(refused: tuple[str, ...]) -> Iterator[list[dict[str, Any]]]:
    """``capture_logs()``; with ``refused`` behind a processor that raises on every line
    whose event starts with one of them (an application's log pipeline that fails), after
    recording it: a heartbeat logs one for each renewal that fails or lapses, and must beat
    on. The entries hold every line, the refused ones too."""
    if not refused:
        with capture_logs() as logs:
            yield logs
        return
    capture = LogCapture()

    def refuse(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        if str(event["event"]).startswith(refused):
            capture.entries.append({**event, "log_level": method})
            raise RuntimeError("the log sink is down")
        return event

    processors = structlog.get_config()["processors"]
    before = list(processors)
    processors[:] = [refuse, capture]  # in place, as capture_logs: cached loggers see it
    structlog.configure(processors=processors)
    try:
        yield capture.entries
    finally:
        processors[:] = before
        structlog.configure(processors=processors)
