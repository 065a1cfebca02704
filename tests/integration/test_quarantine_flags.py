"""The quarantine's yes/no options take True or False only (SPEC §3, §11).

``trim(include_unresolved="false", older_than=...)`` deleted unresolved evidence: the
string was read by its truth value, and a setting read from a config file, an environment
variable or a form is a string. Each flag now refuses anything but a bool with
``InvalidInput`` before a call is made, on Redis (both shells) and the reference model.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from settle.errors import InvalidInput
from tests.integration.test_quarantine import _ghost

NOT_BOOLS = ["false", "no", "0", 0, 1, None, [], 0.0]


async def _scan(api: Any, **options: Any) -> list[Any]:
    walk = api.quarantine.scan(**options)
    if hasattr(walk, "__aiter__"):
        return [entry async for entry in walk]
    return list(await walk)


@pytest.mark.asyncio
@pytest.mark.parametrize("flag", NOT_BOOLS)
async def test_trim_refuses_a_flag_that_is_not_a_bool_and_keeps_the_evidence(
    api: Any, flag: Any
) -> None:
    settled = await api.complete(_ghost("op-trim"), {"n": 1})
    await asyncio.sleep(0.01)  # the entry is older than the horizon below
    with pytest.raises(InvalidInput, match="include_unresolved must be True or False"):
        await api.quarantine.trim(older_than=0.001, include_unresolved=flag)
    assert [e.ref for e in await api.quarantine.list()] == [settled.quarantine_id]


@pytest.mark.asyncio
@pytest.mark.parametrize("flag", NOT_BOOLS)
async def test_listings_refuse_flags_that_are_not_bools(api: Any, flag: Any) -> None:
    await api.complete(_ghost("op-list"), {"n": 1})
    for name in ("unresolved", "newest_first"):
        with pytest.raises(InvalidInput, match=f"{name} must be True or False"):
            await api.quarantine.list(**{name: flag})
        with pytest.raises(InvalidInput, match=f"{name} must be True or False"):
            await api.quarantine.headers(**{name: flag})
    with pytest.raises(InvalidInput, match="unresolved must be True or False"):
        await _scan(api, unresolved=flag)


@pytest.mark.asyncio
async def test_the_flags_still_take_true_and_false(api: Any) -> None:
    first = await api.complete(_ghost("op-a"), {"n": 1})
    second = await api.complete(_ghost("op-b"), {"n": 2})
    await api.quarantine.resolve(first.quarantine_id, note="checked")
    assert [e.ref for e in await api.quarantine.list(unresolved=True)] == [second.quarantine_id]
    assert [e.ref for e in await api.quarantine.list(newest_first=False)] == [
        first.quarantine_id,
        second.quarantine_id,
    ]
    assert [e.ref for e in await _scan(api, unresolved=False)] == [
        first.quarantine_id,
        second.quarantine_id,
    ]
    await asyncio.sleep(0.01)
    kept = await api.quarantine.trim(older_than=0.001, include_unresolved=False)
    assert (kept.removed, kept.unresolved) == (1, 0)
    assert [e.ref for e in await api.quarantine.list()] == [second.quarantine_id]
