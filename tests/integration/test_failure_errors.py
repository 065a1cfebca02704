"""A failure that cannot be stored is refused, and called a failure in the error (SPEC §11).

``fail()`` with a failure over ``max_result_bytes`` said "result is N bytes", which sent the
reader looking for a result the call never had; and a failure whose data held NaN or an
infinity (an exception's ``settle_data``, a ``StoredFailure``) was stored with null in its
place, evidence silently changed, where ``complete()`` refuses the same value."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from settle.errors import FingerprintError, ResultTooLarge
from settle.models import StoredFailure

WHO = "tenant:acme"


@pytest.mark.asyncio
@pytest.mark.parametrize("settler_options", [{"max_result_bytes": 100}])
async def test_a_failure_that_cannot_be_stored_is_named_a_failure(api: Any) -> None:
    r = (await api.reserve("op-fail", {"n": 1}, principal=WHO)).reservation
    with pytest.raises(ResultTooLarge, match=r"^failure is \d+ bytes, over the 100-byte"):
        await api.fail(r, ValueError("declined " * 20))
    nan = StoredFailure(error_type="x", message="y", data={"amount": float("nan")})
    with pytest.raises(FingerprintError, match=r"^failure holds NaN"):
        await api.fail(r, nan)

    class Declined(Exception):
        settle_data: ClassVar[dict[str, float]] = {"limit": float("inf")}

    with pytest.raises(FingerprintError, match=r"^failure holds Infinity"):
        await api.fail(r, Declined("over the limit"))
    assert (await api.get("op-fail")).state.value == "pending"  # nothing was written
    with pytest.raises(ResultTooLarge, match=r"^result is \d+ bytes"):
        await api.complete(r, "x" * 200)
