"""The sans-I/O core: validation, key layout, script call planning and reply decoding.

Nothing here talks to Redis. The sync and async shells plan a call here, run it, and hand
the reply back here to be decoded; the in-memory reference model runs the same calls.
"""
