"""A bad resolution note is bad input whether or not its entry exists (SPEC §3, §11).

The note was checked only after the entry was read: for an id with no entry (a typo, an
entry already trimmed) an empty or multi-line note got ``QuarantineNotFound`` (the CLI's
exit 1, "not found") instead of ``InvalidInput`` (exit 2), after a round trip to Redis.
"""

from __future__ import annotations

from typing import Any

import pytest

from settle.errors import InvalidInput
from tests.integration.test_quarantine import _ghost

BAD_NOTES = ["", "line one\nline two", "\x1b[2J", "x" * 4097, None, b"bytes"]


@pytest.mark.asyncio
@pytest.mark.parametrize("note", BAD_NOTES)
async def test_a_bad_note_is_refused_before_the_entry_is_looked_up(api: Any, note: Any) -> None:
    settled = await api.complete(_ghost("op-note"), {"n": 1})
    shard = settled.quarantine_id.split("/")[0]
    for ref in (f"{shard}/1-0", "1-0", settled.quarantine_id):
        with pytest.raises(InvalidInput, match="note must"):
            await api.quarantine.resolve(ref, note=note)
    assert (await api.quarantine.get(settled.quarantine_id)).resolution is None
