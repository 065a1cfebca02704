"""What an ASGI request reports when its lease is lost while another cancellation runs (the
handler's own ``asyncio.timeout``), so that the middleware's stop is put off and the handler
ends on its own: superseded, on ``settle.http.requests`` as in the log, as under WSGI
(tests/telemetry/test_wsgi_lost_lease.py). A real Redis; the middleware called directly."""

from __future__ import annotations

import pytest

from settle import AsyncSettler
from tests.http.test_http_abandoned import ENDINGS, lose_the_lease_in_a_timeout_of_its_own
from tests.telemetry.conftest import Telemetry

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("then", ENDINGS)
async def test_a_lease_lost_while_the_stop_was_put_off_is_reported_superseded(
    async_settler: AsyncSettler, namespace: str, otel: Telemetry, then: str
) -> None:
    first, _, _ = await lose_the_lease_in_a_timeout_of_its_own(async_settler, then)
    assert first.status == 409
    # Two requests of this namespace: the stale attempt, superseded, and the retry that took
    # the key over (executed).
    assert otel.count("settle.http.requests", **{"settle.namespace": namespace}) == 2
    assert (
        otel.count(
            "settle.http.requests",
            **{"settle.namespace": namespace, "settle.http.outcome": "superseded"},
        )
        == 1
    )
