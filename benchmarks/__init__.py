"""Benchmarks: speed against the raw floor and the peer, and fault scenarios side by side.

Run ``python -m benchmarks.speed`` and ``python -m benchmarks.anomalies``; see
docs/benchmarks.md."""
