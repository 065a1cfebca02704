"""The bytes a guarded response is stored as: the codec's form of its ``StoredResponse`` (what
every replay, by this or an older client, reads), on Redis and in the in-memory model."""

from __future__ import annotations

from typing import Any

import httpx

from settle import Settler
from settle._core.codec import encode_result
from settle.http.keys import operation_id
from settle.http.stored import StoredResponse
from settle.wsgi import IdempotencyMiddleware
from tests.http.apps import serve_wsgi

HEADERS = {"Idempotency-Key": "k-1", "X-Principal": "tenant:acme"}


def _principal(environ: dict[str, Any]) -> str | None:
    return environ.get("HTTP_X_PRINCIPAL")


def _app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("201 Created", [("Content-Type", "application/json"), ("X-Other", "1")])
    return [b'{"id": "pay_1"}']


def test_a_response_is_stored_as_the_codec_encodes_its_stored_response(
    any_settler: Settler,
) -> None:
    guarded = IdempotencyMiddleware(_app, settler=any_settler, principal=_principal)
    with serve_wsgi(guarded) as base, httpx.Client(base_url=base) as client:
        first = client.post("/pay", content=b"{}", headers=HEADERS)
        again = client.post("/pay", content=b"{}", headers=HEADERS)
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.headers["idempotent-replayed"] == "true"
    record = any_settler.get(operation_id("http", "k-1", "tenant:acme", "principal"))
    assert record is not None
    assert record.result is not None
    response = StoredResponse.model_validate_json(record.result)
    assert response.body == b'{"id": "pay_1"}'
    assert record.result == encode_result(response, 1 << 20, record.operation_id)
