"""The middleware's rules with no server: keys, fingerprints, what is stored, configuration."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx
import pytest

from settle.asgi import IdempotencyMiddleware, StoredResponse, storable_status
from settle.asgi.keys import MalformedKey, operation_id, parse_key
from settle.asgi.request import request_fingerprint
from settle.errors import ConfigurationError, InvalidInput
from settle.testing import AsyncMemorySettler


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (b"8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        (b'"8e03978e-40d5"', "8e03978e-40d5"),
        (b'  "with space"  ', "with space"),
        (b'"quote \\" and \\\\ backslash"', 'quote " and \\ backslash'),
        (b"order:42/retry=1", "order:42/retry=1"),
    ],
)
def test_keys_that_parse(raw: bytes, key: str) -> None:
    assert parse_key([raw], 200) == key


@pytest.mark.parametrize(
    "values",
    [
        [],
        [b""],
        [b'""'],
        [b"a b"],
        [b"a,b"],
        [b'"a"b"'],
        [b'"a\\b"'],
        [b"\xff"],
        [b"a", b"a"],
        [b"a\n"],
        [b"a\r"],
        [b"\na"],
    ],
)
def test_keys_that_do_not(values: list[bytes]) -> None:
    with pytest.raises(MalformedKey) as info:
        parse_key(values, 200)
    assert isinstance(info.value, InvalidInput)


def test_key_length_limit() -> None:
    assert parse_key([b"k" * 10], 10) == "k" * 10
    with pytest.raises(MalformedKey, match="1 to 10"):
        parse_key([b"k" * 11], 10)


def test_operation_ids_are_scoped_by_principal() -> None:
    a = operation_id("http", "k", "tenant:a", "principal")
    b = operation_id("http", "k", "tenant:b", "principal")
    assert a != b
    assert a.startswith("http:")
    assert a.endswith(":k")
    assert "tenant" not in a
    assert operation_id("http", "k", "tenant:a", "global") == operation_id(
        "http", "k", "tenant:b", "global"
    )
    assert len(operation_id("http", "k" * 200, "p", "principal")) <= 256


def scope(
    body_type: str | None = "application/json",
    method: str = "POST",
    path: str = "/payments",
    query: bytes = b"",
) -> dict[str, Any]:
    headers = [(b"content-type", body_type.encode())] if body_type else []
    return {"method": method, "path": path, "query_string": query, "headers": headers}


def fp(body: bytes, **kwargs: Any) -> str:
    return request_fingerprint(scope(**kwargs), body)


def test_json_fingerprint_ignores_key_order_and_whitespace() -> None:
    base = fp(b'{"a": 1, "b": {"c": [1, 2], "d": "x"}}')
    assert fp(b'{"b":{"d":"x","c":[1,2]},"a":1}') == base
    assert fp(b'\n{ "a" : 1 ,\t"b" : { "d" : "x", "c" : [ 1, 2 ] } }\n') == base
    assert fp(b'{"a": 1, "b": {"c": [2, 1], "d": "x"}}') != base  # array order matters
    assert fp(b'{"a": 2, "b": {"c": [1, 2], "d": "x"}}') != base
    assert fp(b'{"a": 1, "b": {"c": [1, 2], "d": "x"}}', body_type="text/plain") != base
    # RFC 8785 numbers: 1.0 and 1 are one number; "1" is a string.
    assert fp(b'{"n": 1.0}') == fp(b'{"n": 1}') != fp(b'{"n": "1"}')
    # +json media types are JSON too; charset means nothing for JSON.
    assert fp(b'{"a": 1}', body_type="application/merge-patch+json") == fp(
        b'{ "a":1 }', body_type="application/merge-patch+json"
    )
    assert fp(b'{"a": 1}', body_type="application/json; charset=UTF-8") == fp(b'{"a":1}')


def test_json_without_one_meaning_is_compared_byte_for_byte() -> None:
    # Duplicate keys, NaN and huge integers have no canonical form: raw bytes decide.
    for body in (b'{"a": 1, "a": 2}', b'{"a": NaN}', b'{"a": 123456789012345678901234567890}'):
        assert fp(body) == fp(body)
        assert fp(body) != fp(body.replace(b": ", b":"))
    assert fp(b'{"a": 1, "a": 2}') != fp(b'{"a": 2}')


def test_request_parts_in_the_fingerprint() -> None:
    base = fp(b"data", body_type="text/plain")
    assert fp(b"data ", body_type="text/plain") != base
    assert fp(b"data", body_type="text/plain", method="PATCH") != base
    assert fp(b"data", body_type="text/plain", method="post") == base
    assert fp(b"data", body_type="text/plain", path="/payments/") != base
    assert fp(b"data", body_type="text/plain", query=b"a=1") != base
    assert fp(b"data", body_type="TEXT/Plain") == base
    assert fp(b"data", body_type="text/plain; charset=latin-1") != base
    assert fp(b"data", body_type=None) != base
    assert fp(b"", body_type=None) != fp(b"{}", body_type="application/json")
    assert fp(b"", body_type="application/json") != fp(b"{}", body_type="application/json")


def test_query_order_of_distinct_names_does_not_matter() -> None:
    assert fp(b"", query=b"a=1&b=2") == fp(b"", query=b"b=2&a=1")
    assert fp(b"", query=b"a=1&a=2") != fp(b"", query=b"a=2&a=1")
    assert fp(b"", query=b"a=1") != fp(b"", query=b"a=1&a=1")
    assert fp(b"", query=b"a=%41") != fp(b"", query=b"a=B")


def test_which_statuses_are_finished_responses() -> None:
    finished = [s for s in range(100, 600) if storable_status(s)]
    assert finished == [
        *range(200, 300),
        *[s for s in range(300, 400) if s != 304],  # a redirect after the work is its answer
        *[s for s in range(400, 500) if s not in (408, 409, 429)],
    ]


def test_stored_response_keeps_allowed_headers_and_bytes() -> None:
    body = bytes(range(256))
    headers = [
        (b"content-type", b"application/octet-stream"),
        (b"Set-Cookie", b"session=secret"),
        (b"location", b"/x"),
        (b"x-internal", b"1"),
    ]
    stored = StoredResponse.capture(201, headers, body, {"content-type", "location"})
    decoded = StoredResponse.model_validate_json(stored.model_dump_json())
    assert decoded.body == body
    assert decoded.replay_headers() == [
        (b"content-type", b"application/octet-stream"),
        (b"location", b"/x"),
        (b"content-length", b"256"),
        (b"idempotent-replayed", b"true"),
    ]
    assert b"secret" not in stored.model_dump_json().encode()


async def _noop(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("not called")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"replay_headers": ["content-type", "Set-Cookie"]}, "set-cookie"),
        ({"replay_headers": ["content-length"]}, "content-length"),
        ({"max_key_length": 300}, "max_key_length"),
        ({"key_scope": "tenant"}, "key_scope"),
        ({"paths": ["payments"]}, "paths"),
        ({"lease": 0}, "lease"),
        ({"max_response_bytes": 1 << 20}, "max_result_bytes"),
        ({"principal": "tenant:acme"}, "principal"),
    ],
)
def test_bad_configuration_is_refused_at_start_up(options: dict[str, Any], message: str) -> None:
    settler = AsyncMemorySettler(namespace="cfg")
    options = {"principal": lambda scope: "p", **options}
    with pytest.raises(ConfigurationError, match=message):
        IdempotencyMiddleware(_noop, settler=settler, **options)


@pytest.mark.asyncio
async def test_works_on_the_in_memory_settler() -> None:
    """Users can unit-test their guarded app on ``settle.testing.AsyncMemorySettler``."""
    runs: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        runs.append(scope["settle"].generation)
        body = json.dumps({"echo": json.loads(message["body"]), "run": len(runs)}).encode()
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": body})

    settler = AsyncMemorySettler(namespace="mem")
    guarded = IdempotencyMiddleware(app, settler=settler, principal=lambda scope: "p")
    transport = httpx.ASGITransport(app=guarded)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        first = await client.post("/x", json={"v": 1}, headers={"idempotency-key": "m"})
        again = await client.post("/x", json={"v": 1}, headers={"idempotency-key": "m"})
    assert first.status_code == 201
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert len(runs) == 1


def test_settle_asgi_imports_no_web_framework() -> None:
    """The middleware is pure ASGI: importing it pulls in no framework."""
    code = (
        "import sys, settle.asgi\n"
        "frameworks = {'starlette', 'fastapi', 'litestar', 'uvicorn', 'httpx'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & frameworks))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
