"""settle's telemetry is ``settle/_telemetry.py`` (the hooks, the one module that imports
OpenTelemetry) and the parts it builds in ``settle/_otel``: the doc names every instrument
and attribute any of them reports (``test_docs`` reads ``settle/_telemetry.py`` alone)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "observability.md"
MODULES = [ROOT / "settle" / "_telemetry.py", *sorted((ROOT / "settle" / "_otel").glob("*.py"))]


def test_the_doc_names_every_instrument_and_attribute_of_every_telemetry_module() -> None:
    doc = DOC.read_text(encoding="utf-8")
    pattern = r'"((?:settle|db|server|network|messaging|error|code)\.[a-z_.]+)"'
    for module in MODULES:
        named = set(re.findall(pattern, module.read_text(encoding="utf-8")))
        missing = sorted(name for name in named if f"`{name}`" not in doc)
        assert missing == [], module.name
    spans = (ROOT / "settle" / "_otel" / "spans.py").read_text(encoding="utf-8")
    assert '"settle.attempt.number"' in spans  # the parts are read, not an empty glob
