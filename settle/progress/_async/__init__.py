"""The asyncio shells of settle.progress (hand-written; ``settle/progress/_sync`` is generated)."""
