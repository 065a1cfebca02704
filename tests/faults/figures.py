"""Measurements the fault and cluster tests take on the way (never asserted: no wall-clock
assertions), printed in a "settle figures" section at the end of the run;
docs/operations.md quotes them. Under pytest-xdist each worker hands its figures to the
controller when it ends (tests/conftest.py), which prints them."""

from __future__ import annotations

from typing import Any

FIGURES: dict[str, str] = {}

#: The key of a worker's figures in what pytest-xdist carries back to the controller.
WORKER_OUTPUT = "settle_figures"


def summary(terminalreporter: Any) -> None:
    if FIGURES:
        terminalreporter.section("settle figures")
        for name, value in sorted(FIGURES.items()):
            terminalreporter.write_line(f"{name}: {value}")
