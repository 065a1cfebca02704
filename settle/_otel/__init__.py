"""The parts of settle's telemetry that OpenTelemetry's API objects are handed to, each in
a module named for what it holds: :mod:`.spans` (the span objects a hook hands out),
:mod:`.redis_spans` (a Redis call's client span: its server attributes and the name of its
failure) and :mod:`.metrics` (the instruments and their bucket boundaries).

None of them imports ``opentelemetry``: ``settle/_telemetry.py`` is the one module that
does, and builds them (the hooks, :class:`settle._telemetry.Otel`).
"""
