"""Options of the HTTP guards (ASGI, WSGI, Django, Flask: one IdempotencyPolicy) of the
wrong type are a ConfigurationError when the guard is made.

A str where a number belongs, None where names belong, or a header of another type let a
TypeError / AttributeError out; a NaN (or fractional) size or Retry-After was accepted and
then compared False with every size: a NaN ``max_request_bytes`` read bodies of any size
(no 413), a NaN ``max_response_bytes`` stored no response, a NaN ``retry_after`` was sent
as ``Retry-After: nan``. A Content-Length too long for int() to parse was a 500, and a
settler of the wrong flavour (sync for ASGI, async for WSGI) failed only on each request.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import redis

from settle import AsyncSettler, Settler
from settle.asgi import IdempotencyMiddleware
from settle.asgi._types import Message, Receive, Scope, Send
from settle.errors import ConfigurationError
from settle.http import IdempotencyPolicy
from settle.wsgi import IdempotencyMiddleware as WSGIIdempotencyMiddleware


@pytest.mark.parametrize(
    "options",
    [
        {"max_request_bytes": math.nan},
        {"max_response_bytes": math.nan},
        {"retry_after": math.nan},
        {"retry_after": 1.5},
        {"max_request_bytes": "1048576"},
        {"max_key_length": "200"},
        {"max_key_length": True},
        {"lease": "30"},
        {"header": 5},
        {"operation_prefix": None},
        {"problem_type_base": None},
        {"methods": None},
        {"methods": [1]},
        {"replay_headers": None},
        {"replay_headers": [1]},
        {"require_key": None},
    ],
    ids=lambda options: "-".join(f"{k}={v!r}" for k, v in options.items()),
)
def test_an_option_of_the_wrong_type_is_a_configuration_error(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        IdempotencyPolicy.configure(principal=lambda request: "tenant:a", **options)


@pytest.mark.parametrize(
    "header", ["Bad Header", "Idempotency-Key\r\nX-Other", "Key:", "Key(1)", "Schlüssel", ""]
)
def test_a_header_name_no_request_can_carry_is_a_configuration_error(header: str) -> None:
    """A space, a CR/LF or a separator was taken as the key's header name, and every
    guarded request was then refused with the 400 of a missing key."""
    with pytest.raises(ConfigurationError, match="header must be an HTTP header name"):
        IdempotencyPolicy.configure(principal=lambda request: "tenant:a", header=header)


@pytest.mark.parametrize("header", ["X-Idempotency-Key", "idempotency_key", "Key.v2", "K~1"])
def test_every_token_is_a_header_name(header: str) -> None:
    policy = IdempotencyPolicy.configure(principal=lambda request: "tenant:a", header=header)
    assert policy.header_bytes == header.lower().encode()


@pytest.mark.asyncio
async def test_a_content_length_too_long_to_parse_is_a_413(async_settler: AsyncSettler) -> None:
    """A Content-Length of thousands of digits let int()'s ValueError out of the middleware
    (a 500 from the server) instead of the 413 any over-long body gets."""
    ran: list[Scope] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        ran.append(scope)

    guard = IdempotencyMiddleware(app, settler=async_settler, principal=lambda scope: "tenant:a")
    headers = [(b"idempotency-key", b"k-1"), (b"content-length", b"9" * 5000)]
    assert await _statuses(guard, headers) == [413]
    assert ran == []


async def _statuses(guard: IdempotencyMiddleware, headers: list[tuple[bytes, bytes]]) -> list[int]:
    """The statuses ``guard`` answers a POST /payments of ``{}`` with ``headers``."""
    scope: Scope = {
        "type": "http",
        "method": "POST",
        "path": "/payments",
        "raw_path": b"/payments",
        "query_string": b"",
        "headers": headers,
        "http_version": "1.1",
        "root_path": "",
    }
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await guard(scope, receive, send)
    return [m["status"] for m in sent if m["type"] == "http.response.start"]


@pytest.mark.asyncio
@pytest.mark.parametrize("key", [b"k-1\n", b"k-1\r\n", b'"k-1"\n'])
async def test_a_key_ending_in_a_line_break_is_a_400_and_runs_nothing(
    async_settler: AsyncSettler, key: bytes
) -> None:
    """A bare key with a trailing newline (``k-1\\n``, which an ASGI server that does not
    check header values passes on) was taken for the key ``'k-1\\n'``, whose control
    character the core then refused with an InvalidInput that escaped the middleware: a
    500 from the server, for the client's own mistake. A key is visible ASCII: 400, and
    the handler does not run."""
    ran: list[Scope] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        ran.append(scope)

    guard = IdempotencyMiddleware(app, settler=async_settler, principal=lambda scope: "tenant:a")
    headers = [(b"idempotency-key", key), (b"content-length", b"2")]
    assert await _statuses(guard, headers) == [400]
    assert ran == []


@pytest.mark.asyncio
async def test_the_asgi_guard_refuses_a_sync_settler(
    settler: Settler, redis_client: redis.Redis, namespace: str
) -> None:
    """It was accepted; every guarded request then wrote a pending record (reserve ran)
    and failed with TypeError awaiting the reply: a 500, every time."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("not reached")

    with pytest.raises(ConfigurationError, match="AsyncSettler"):
        IdempotencyMiddleware(app, settler=settler, principal=lambda scope: "tenant:a")  # type: ignore[arg-type]
    assert list(redis_client.scan_iter(match=f"settle:{{{namespace}*")) == []


def test_the_wsgi_guard_refuses_an_async_settler(async_settler: AsyncSettler) -> None:
    """It was accepted; every guarded request then failed with AttributeError on the
    unawaited coroutine of reserve()."""

    def app(environ: Any, start_response: Any) -> list[bytes]:
        raise AssertionError("not reached")

    with pytest.raises(ConfigurationError, match=r"settle\.Settler"):
        WSGIIdempotencyMiddleware(app, settler=async_settler, principal=lambda environ: "a")  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_a_whole_float_size_and_retry_after_still_work(async_settler: AsyncSettler) -> None:
    """``max_request_bytes=1e3`` (or ``1e6``) and ``retry_after=2.0`` were accepted and
    enforced before the option types were checked: a whole float is a whole number, kept as
    its int (NaN, inf and 1.5 stay refused)."""
    ran: list[bytes] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        ran.append((await receive())["body"])
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    guard = IdempotencyMiddleware(
        app,
        settler=async_settler,
        principal=lambda scope: "tenant:a",
        max_request_bytes=1e3,
        max_response_bytes=65536.0,
        retry_after=2.0,
    )
    assert guard.policy.max_request_bytes == 1000
    assert guard.policy.retry_after == 2

    async def post(key: bytes, body: bytes) -> int:
        scope: Scope = {
            "type": "http",
            "method": "POST",
            "path": "/payments",
            "raw_path": b"/payments",
            "query_string": b"",
            "headers": [(b"idempotency-key", key), (b"content-length", str(len(body)).encode())],
            "http_version": "1.1",
            "root_path": "",
        }
        sent: list[Message] = []

        async def receive() -> Message:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: Message) -> None:
            sent.append(message)

        await guard(scope, receive, send)
        return next(m["status"] for m in sent if m["type"] == "http.response.start")

    assert await post(b"k-small", b"{}") == 201
    assert await post(b"k-large", b"x" * 1001) == 413
    assert ran == [b"{}"]


@pytest.mark.asyncio
async def test_an_unknown_option_is_a_configuration_error_in_both_guards(
    async_settler: AsyncSettler, settler: Settler
) -> None:
    """docs/http-endpoints.md (Options): "An unknown option is refused at start-up ...
    (``ConfigurationError``)", and the WSGI guard takes "the same options". The WSGI guard
    said so; the ASGI one let Python's TypeError out (``unexpected keyword argument``), so a
    misspelt option (``max_request_byte``) was no settle error and named no list."""

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("not reached")

    def wsgi(environ: Any, start_response: Any) -> list[bytes]:
        raise AssertionError("not reached")

    def who(request: object) -> str:
        return "tenant:a"

    misspelt: dict[str, Any] = {"max_request_byte": 1024}
    with pytest.raises(ConfigurationError, match="unknown option max_request_byte") as asgi_err:
        IdempotencyMiddleware(asgi, settler=async_settler, principal=who, **misspelt)
    with pytest.raises(ConfigurationError, match="unknown option max_request_byte") as wsgi_err:
        WSGIIdempotencyMiddleware(wsgi, settler=settler, principal=who, **misspelt)
    assert str(asgi_err.value) == str(wsgi_err.value)
