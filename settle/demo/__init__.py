"""``settle demo``'s workload, apart from the command line: a simulated payment provider
(:mod:`~settle.demo.provider`), the decorated charge (:mod:`~settle.demo.charge`), a seeded
plan of faults (:mod:`~settle.demo.plan`), the runner with its worker processes
(:mod:`~settle.demo.runner`, :mod:`~settle.demo.worker`) and the report
(:mod:`~settle.demo.report`)."""

from settle.demo.plan import Fault
from settle.demo.processes import DemoError
from settle.demo.report import DemoReport
from settle.demo.runner import DemoOptions, run_demo

__all__ = ["DemoError", "DemoOptions", "DemoReport", "Fault", "run_demo"]
