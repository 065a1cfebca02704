"""Every name settle reports is listed in docs/observability.md: the span names, span
attributes, instruments and their attributes a real run emits, and every plain Redis
command the runner makes a client span of.

The runner's ``EXISTS`` (the namespace's first use) and ``TIME`` (the console's clock)
spans were emitted and listed nowhere: a dashboard or alert built from the doc did not
know of them."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import tenacity

from settle import Attempt, OperationFailed, Settler
from tests.telemetry.conftest import Telemetry

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "observability.md"

#: A plain command the runner sends: ``.command("EXISTS", ...)``, ``._command("TIME", ...)``
#: (also with the name on the next line).
_COMMAND = re.compile(r"\._?command\(\s*\"([A-Z]+)\"")


def _listed(name: str) -> bool:
    doc = DOC.read_text(encoding="utf-8")
    return f"`{name}`" in doc


def test_every_plain_command_span_is_listed() -> None:
    commands = set()
    for path in (ROOT / "settle").rglob("*.py"):
        commands.update(_COMMAND.findall(path.read_text(encoding="utf-8")))
    assert {"EXISTS", "XREADGROUP"} <= commands, commands  # the scan still finds them
    assert sorted(c for c in commands if not _listed(c)) == []


def _script_span(name: str) -> str:
    """``EVALSHA reserve`` / ``FCALL reserve`` as the doc lists it: ``EVALSHA <script>``."""
    operation, _, script = name.partition(" ")
    return f"{operation} <script>" if operation in ("EVALSHA", "FCALL") and script else name


def test_every_name_a_real_run_emits_is_listed(
    settler: Settler, namespace: str, otel: Telemetry
) -> None:
    once = tenacity.Retrying(stop=tenacity.stop_after_attempt(2), wait=tenacity.wait_none())

    @settler.operation(key="charge:{order}", principal="tenant:a", retry=once, terminal=KeyError)
    def charge(order: str, attempt: Attempt = Attempt.INJECTED) -> int:
        if order == "declined":
            raise KeyError(order)
        if attempt.number == 1:
            raise ConnectionError("reset")
        return attempt.generation

    assert charge("o-1") == charge("o-1")
    with pytest.raises(OperationFailed):
        charge("declined")
    first = settler.reserve("op-1", {"n": 1}, principal="tenant:a", lease=0.05)
    time.sleep(0.1)
    settler.renew(first.reservation)
    settler.reserve("op-1", {"n": 1}, principal="tenant:a")
    settler.complete(first.reservation, 1)  # quarantined: stale_generation
    settler.quarantine.list()
    settler.get_many(["op-1"])
    settler.attempts("op-1")

    emitted: set[str] = set()
    for span in otel.spans():
        emitted.add(_script_span(span.name))
        emitted.update(span.attributes or {})
    data = otel.reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            if scope.scope.name != "settle":
                continue
            for metric in scope.metrics:
                emitted.add(metric.name)
                for point in metric.data.data_points:
                    emitted.update(point.attributes or {})
    assert {"EXISTS", "settle.operation", "settle.attempt", "settle.takeovers"} <= emitted
    assert sorted(name for name in emitted if not _listed(name)) == []
