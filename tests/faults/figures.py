"""Measurements the fault and cluster tests take on the way (never asserted: no wall-clock
assertions), printed in a "settle figures" section at the end of the run;
docs/operations.md quotes them."""

from __future__ import annotations

from typing import Any

FIGURES: dict[str, str] = {}
_printed = False


def summary(terminalreporter: Any) -> None:
    global _printed  # noqa: PLW0603 - one section per run, however many conftests call this
    if FIGURES and not _printed:
        _printed = True
        terminalreporter.section("settle figures")
        for name, value in sorted(FIGURES.items()):
            terminalreporter.write_line(f"{name}: {value}")
