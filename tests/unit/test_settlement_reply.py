"""A settlement script's reply ends with the count of unresolved quarantine entries its
``quarantine_maxlen`` dropped, then a 1 when its quarantine id is an earlier entry's (the
same rejected response delivered again, SPEC 3). Both ways of reading a reply (the list a
client hands back, and any other sequence, read by the general path) say so. No Redis."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from settle._core import codec

HEAD = [b"quarantined", b"conflicting_settlement", 1_700_000_000_000, b"1-0", []]


@pytest.mark.parametrize("shape", [list, tuple], ids=["list", "tuple"])
@pytest.mark.parametrize(
    ("tail", "dropped", "repeated"),
    [([], 0, False), ([2], 2, False), ([0, 1], 0, True), ([3, 1], 3, True)],
)
def test_a_settlement_reply_says_whether_its_entry_is_a_repeat(
    shape: Callable[[list[Any]], Any], tail: list[int], dropped: int, repeated: bool
) -> None:
    reply = codec.parse_reply(shape([*HEAD, *tail]))
    assert (reply.quarantine_id, reply.dropped, reply.repeated) == ("1-0", dropped, repeated)
