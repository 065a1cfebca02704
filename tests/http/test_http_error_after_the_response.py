"""An ASGI handler that sent its whole response in time, then raised past its ``timeout``
(a Starlette ``BackgroundTask`` runs inside the app call, after the last byte): the stored
response stands (completed, no ``timeout`` mark against it, no quarantine entry, no
``settle.http.abandoned``), and the error goes on to the server, as before the timeout
learned to answer a handler that holds the loop past it. A real Redis; the middleware
called directly."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from structlog.testing import capture_logs

from settle import AsyncSettler
from settle.asgi import IdempotencyMiddleware
from tests.http.apps import post_scope
from tests.http.test_http_abandoned import _Client, _settled_by_the_retry_alone

pytestmark = pytest.mark.asyncio


class ReceiptMailFailed(Exception):
    pass


@pytest.mark.parametrize("held", [False, True], ids=["awaits", "holds-the-loop"])
async def test_an_error_after_the_last_byte_past_the_timeout_leaves_the_response_stored(
    async_settler: AsyncSettler, held: bool
) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b'{"charged": true}'})
        # The background work after the response: past the timeout, then it fails.
        if held:
            import time  # noqa: PLC0415

            time.sleep(0.3)  # noqa: ASYNC251  # a blocking call holds the loop
        else:
            await asyncio.sleep(0.3)
        raise ReceiptMailFailed("the receipt mail could not be sent")

    client = _Client()
    mw = IdempotencyMiddleware(
        app, settler=async_settler, principal=lambda s: "tenant:a", timeout=0.1
    )
    with capture_logs() as logs, pytest.raises(ReceiptMailFailed):
        await mw(post_scope(b"k-after-the-response"), client.receive, client.send)
    assert client.status == 201
    assert not [e for e in logs if e["event"] == "settle.http.abandoned"]
    await _settled_by_the_retry_alone(async_settler, "k-after-the-response")
