"""A finished response is stored as StoredResponse's own JSON (``_stored_json``), not
through the codec's ``encode_result``: the bytes must be the same for every response, since
a stored record keeps them for the whole retention and a second worker settling the same
response must write the same bytes (a different one would be a conflicting settlement)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from settle import AsyncSettler
from settle._core.codec import encode_result
from settle.asgi.keys import operation_id
from settle.http._rules import _stored_json
from settle.http.stored import DEFAULT_REPLAY_HEADERS, StoredResponse
from tests.http.apps import key_headers

_NAMES = st.sampled_from(
    [b"content-type", b"Location", b"ETag", b"x-custom", b"Retry-After", b"vary", b"\xe9t\xe9"]
)
_ALLOWED = st.sampled_from(
    [frozenset(), frozenset(DEFAULT_REPLAY_HEADERS), frozenset({"x-custom", "\xe9t\xe9", "etag"})]
)


@settings(max_examples=400, deadline=None)
@given(
    status=st.integers(100, 599),
    headers=st.lists(st.tuples(_NAMES, st.binary(max_size=24)), max_size=6),
    body=st.binary(max_size=300),
    allowed=_ALLOWED,
    size=st.integers(0, 1 << 50),
)
def test_a_stored_response_is_the_codecs_bytes(
    status: int,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    allowed: frozenset[str],
    size: int,
) -> None:
    for stored in (
        StoredResponse.capture(status, headers, body, allowed),
        StoredResponse.not_stored(status, size),
    ):
        assert _stored_json(stored) == encode_result(stored, sys.maxsize, "op", repeated=True)


@pytest.mark.asyncio
async def test_a_guarded_response_is_stored_in_the_codecs_bytes(
    make_client: Callable[..., httpx.AsyncClient], async_settler: AsyncSettler
) -> None:
    """What the guard hands to ``complete`` for a real request (not only what
    ``_stored_json`` makes): the record's bytes are the codec's, every field by name."""
    client = make_client()
    answer = await client.post("/payments", json={"amount": 7}, headers=key_headers("kept"))
    assert answer.status_code == 201
    op = operation_id("http", "kept", "tenant:acme", "principal")
    record = await async_settler.get(op)
    assert record is not None
    assert record.result is not None
    stored = StoredResponse.model_validate_json(record.result)
    assert record.result == encode_result(stored, sys.maxsize, op, repeated=True)
    assert list(json.loads(record.result)) == ["format", "status", "headers", "body", "size"]
