"""The one way a Redis reply's value is read as text, for every layer (the sans-I/O cores,
the runtime, the parts, the console and the CLI): bytes decoded as UTF-8, anything else (an
``int``, a ``str`` a decoding client already made) as ``str``."""

from __future__ import annotations


def as_text(value: object, errors: str = "strict") -> str:
    """``value`` as text: bytes decoded as UTF-8 (``errors`` as :meth:`bytes.decode` takes
    it: ``"strict"`` where bytes that are not UTF-8 mean a corrupt value, ``"replace"``
    where they are only shown), anything else as ``str``."""
    return value.decode("utf-8", errors) if isinstance(value, bytes) else str(value)
