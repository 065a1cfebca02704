"""The asyncio shell. Hand-written; ``settle/_sync`` is generated from it by
``scripts/unasync.py`` (a test fails when the two drift apart)."""
