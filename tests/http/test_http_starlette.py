"""IdempotencyMiddleware on a real Starlette app and a real Redis, through httpx's ASGI
transport: every behaviour of SPEC 7 a client relies on."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from settle import AsyncSettler, Reservation, State
from settle.asgi import DEFAULT_REPLAY_HEADERS, IdempotencyMiddleware
from settle.asgi.keys import operation_id
from settle.embedded import free_port
from tests.http.apps import Ledger, MakeClient, key_headers, starlette_app

pytestmark = pytest.mark.asyncio

PROBLEM = "urn:settle:problem:"


def assert_problem(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    document: dict[str, Any] = response.json()
    assert document["type"] == PROBLEM + slug
    assert document["status"] == status
    assert document["title"]
    assert document["detail"]
    assert "idempotent-replayed" not in response.headers
    return document


def allowed(response: httpx.Response) -> list[tuple[bytes, bytes]]:
    return [
        (name.lower(), value)
        for name, value in response.headers.raw
        if name.lower().decode() in DEFAULT_REPLAY_HEADERS
    ]


def op_id(key: str, principal: str = "tenant:acme") -> str:
    return operation_id("http", key, principal, "principal")


async def wait_for(predicate: Any, within: float = 10.0) -> None:
    """Poll a condition set from another task or thread (a threading.Event, a list)."""
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


# -- replay ------------------------------------------------------------------------------


async def test_replay_is_byte_identical_and_marked(make_client: MakeClient, ledger: Ledger) -> None:
    client = make_client()
    body = {"amount": 1250, "currency": "EUR"}
    first = await client.post("/payments", json=body, headers=key_headers("pay-1"))
    assert first.status_code == 201
    assert "idempotent-replayed" not in first.headers
    assert "set-cookie" in first.headers
    assert "x-trace" in first.headers

    for _ in range(3):
        again = await client.post("/payments", json=body, headers=key_headers("pay-1"))
        assert again.status_code == first.status_code
        assert again.content == first.content
        assert allowed(again) == allowed(first)
        assert again.headers["idempotent-replayed"] == "true"
        assert again.headers["content-length"] == str(len(first.content))
        assert "set-cookie" not in again.headers
        assert "x-trace" not in again.headers
    assert ledger.count("/payments") == 1


async def test_handler_sees_its_attempt_with_a_fencing_generation(
    make_client: MakeClient, ledger: Ledger, async_settler: AsyncSettler
) -> None:
    client = make_client()
    first = await client.post("/flaky", headers=key_headers("att-1"))
    second = await client.post("/flaky", headers=key_headers("att-1"))
    assert (first.status_code, second.status_code) == (500, 201)
    low, high = ledger.generations("/flaky")
    assert high > low
    record = await async_settler.get(op_id("att-1"))
    assert record is not None
    assert record.generation == high
    assert record.state is State.COMPLETED


# -- 400 / 401 / 413 / 422 -----------------------------------------------------------------


async def test_missing_key_is_400_and_nothing_runs(make_client: MakeClient, ledger: Ledger) -> None:
    client = make_client()
    response = await client.post("/payments", json={"amount": 1}, headers=key_headers(None))
    assert_problem(response, 400, "idempotency-key-missing")
    assert ledger.count() == 0


@pytest.mark.parametrize(
    "values",
    [
        [b""],
        [b'""'],
        [b"a,b"],
        [b"with space"],
        [b'"unterminated'],
        [b'"key";param=1'],
        [b'"bad \\n escape"'],
        ["ключ".encode()],
        [b"k" * 201],
        [b"one", b"two"],
    ],
    ids=[
        "empty",
        "empty-string",
        "list",
        "space",
        "unterminated",
        "parameters",
        "bad-escape",
        "non-ascii",
        "too-long",
        "two-headers",
    ],
)
async def test_malformed_key_is_400_and_nothing_runs(
    make_client: MakeClient, ledger: Ledger, values: list[bytes]
) -> None:
    client = make_client()
    headers = [(b"x-principal", b"tenant:acme")] + [(b"idempotency-key", v) for v in values]
    response = await client.post("/payments", json={"amount": 1}, headers=headers)
    assert_problem(response, 400, "idempotency-key-malformed")
    assert ledger.count() == 0


async def test_quoted_and_bare_forms_are_the_same_key(
    make_client: MakeClient, ledger: Ledger
) -> None:
    client = make_client()
    first = await client.post("/payments", json={"amount": 3}, headers=key_headers('"k-q"'))
    again = await client.post("/payments", json={"amount": 3}, headers=key_headers("k-q"))
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    assert ledger.count() == 1


async def test_no_principal_is_401_and_nothing_runs(
    make_client: MakeClient, ledger: Ledger
) -> None:
    client = make_client()
    response = await client.post("/payments", json={"amount": 1}, headers=key_headers("k", None))
    assert_problem(response, 401, "principal-required")
    assert ledger.count() == 0


@pytest.mark.parametrize(
    ("path", "kwargs"),
    [
        ("/payments", {"json": {"amount": 2}}),
        ("/payments?expand=customer", {"json": {"amount": 1}}),
        ("/echo", {"json": {"amount": 1}}),
        ("/payments", {"content": b'{"amount": 1}', "headers": {"content-type": "text/plain"}}),
    ],
    ids=["body", "query", "path", "content-type"],
)
async def test_same_key_different_request_is_422(
    make_client: MakeClient, ledger: Ledger, path: str, kwargs: dict[str, Any]
) -> None:
    client = make_client()
    first = await client.post("/payments", json={"amount": 1}, headers=key_headers("k-422"))
    assert first.status_code == 201
    headers = {**key_headers("k-422"), **kwargs.pop("headers", {})}
    changed = await client.post(path, headers=headers, **kwargs)
    document = assert_problem(changed, 422, "idempotency-key-reused")
    assert first.json()["id"] not in json.dumps(document)
    # The original is untouched and still replays.
    again = await client.post("/payments", json={"amount": 1}, headers=key_headers("k-422"))
    assert again.content == first.content
    assert ledger.count() == 1


async def test_json_key_order_and_whitespace_are_the_same_request(
    make_client: MakeClient, ledger: Ledger
) -> None:
    client = make_client()
    headers = {**key_headers("k-jcs"), "content-type": "application/json"}
    first = await client.post(
        "/payments", content=b'{"amount": 700, "meta": {"a": 1, "b": [1, 2]}}', headers=headers
    )
    assert first.status_code == 201
    reordered = b'{\n  "meta" : {"b":[1,2],"a":1},\r\n  "amount":700\n}'
    headers["content-type"] = "application/json; charset=UTF-8"
    again = await client.post("/payments", content=reordered, headers=headers)
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    assert ledger.count() == 1


async def test_query_parameter_order_is_the_same_request(
    make_client: MakeClient, ledger: Ledger
) -> None:
    client = make_client()
    first = await client.post("/payments?a=1&b=2", json={"amount": 1}, headers=key_headers("q"))
    again = await client.post("/payments?b=2&a=1", json={"amount": 1}, headers=key_headers("q"))
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    assert ledger.count() == 1


# -- principals --------------------------------------------------------------------------


async def test_two_principals_same_key_never_see_each_others_response(
    make_client: MakeClient, ledger: Ledger
) -> None:
    client = make_client()
    body = {"amount": 100}
    acme = await client.post("/payments", json=body, headers=key_headers("shared", "tenant:acme"))
    umbrella = await client.post(
        "/payments", json=body, headers=key_headers("shared", "tenant:umbrella")
    )
    assert acme.status_code == umbrella.status_code == 201
    assert "idempotent-replayed" not in umbrella.headers
    assert acme.json()["id"] != umbrella.json()["id"]
    assert ledger.count("/payments") == 2
    for principal, original in (("tenant:acme", acme), ("tenant:umbrella", umbrella)):
        again = await client.post("/payments", json=body, headers=key_headers("shared", principal))
        assert again.content == original.content
        assert again.headers["idempotent-replayed"] == "true"
    assert ledger.count("/payments") == 2


async def test_global_keys_still_check_the_binding(make_client: MakeClient, ledger: Ledger) -> None:
    client = make_client(key_scope="global")
    body = {"amount": 100}
    acme = await client.post("/payments", json=body, headers=key_headers("g-1", "tenant:acme"))
    other = await client.post("/payments", json=body, headers=key_headers("g-1", "tenant:evil"))
    document = assert_problem(other, 422, "idempotency-key-bound")
    assert acme.json()["id"] not in json.dumps(document)
    assert acme.json()["id"] not in other.text
    assert ledger.count() == 1


# -- what is stored, what is re-run --------------------------------------------------------


async def test_a_500_is_not_stored_the_retry_runs_and_its_201_is_replayed(
    make_client: MakeClient, ledger: Ledger, async_settler: AsyncSettler
) -> None:
    client = make_client()
    failed = await client.post("/flaky", headers=key_headers("k-500"))
    assert failed.status_code == 500
    record = await async_settler.get(op_id("k-500"))
    assert record is not None
    assert record.state is State.PROVISIONAL
    assert record.reason == "status_500"

    retried = await client.post("/flaky", headers=key_headers("k-500"))
    assert retried.status_code == 201
    assert retried.json()["run"] == 2
    replayed = await client.post("/flaky", headers=key_headers("k-500"))
    assert replayed.status_code == 201
    assert replayed.content == retried.content
    assert replayed.headers["idempotent-replayed"] == "true"
    assert ledger.count("/flaky") == 2


async def test_an_exception_is_not_stored_and_the_retry_runs_again(
    make_client: MakeClient, ledger: Ledger, async_settler: AsyncSettler
) -> None:
    client = make_client(raise_app_exceptions=False)
    crashed = await client.post("/boom", headers=key_headers("k-boom"))
    assert crashed.status_code == 500
    record = await async_settler.get(op_id("k-boom"))
    assert record is not None
    assert record.state is State.PROVISIONAL
    retried = await client.post("/boom", headers=key_headers("k-boom"))
    assert retried.status_code == 201
    replayed = await client.post("/boom", headers=key_headers("k-boom"))
    assert replayed.content == retried.content
    assert ledger.count("/boom") == 2


async def test_an_exception_before_any_response_is_provisional(
    async_settler: AsyncSettler,
) -> None:
    """A bare ASGI app (no framework turning the error into a 500) that raises."""
    runs: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        runs.append(scope["settle"].generation)
        if len(runs) == 1:
            raise RuntimeError("crash")
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"created"})

    guarded = IdempotencyMiddleware(app, settler=async_settler, principal=lambda scope: "p")
    transport = httpx.ASGITransport(app=guarded)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        with pytest.raises(RuntimeError, match="crash"):
            await client.post("/x", headers={"idempotency-key": "raw"})
        record = await async_settler.get(operation_id("http", "raw", "p", "principal"))
        assert record is not None
        assert (record.state, record.reason) == (State.PROVISIONAL, "exception")
        second = await client.post("/x", headers={"idempotency-key": "raw"})
        third = await client.post("/x", headers={"idempotency-key": "raw"})
    assert (second.status_code, second.content) == (201, b"created")
    assert third.headers["idempotent-replayed"] == "true"
    assert len(runs) == 2


@pytest.mark.parametrize(
    ("code", "stored"),
    [
        *[(code, True) for code in (200, 202, 303, 307, 400, 404, 422)],
        *[(code, False) for code in (408, 409, 429, 500, 503)],
    ],
)
async def test_which_statuses_are_stored(
    make_client: MakeClient, ledger: Ledger, code: int, stored: bool
) -> None:
    client = make_client()
    first = await client.post(f"/status/{code}", headers=key_headers(f"s-{code}"))
    second = await client.post(f"/status/{code}", headers=key_headers(f"s-{code}"))
    assert first.status_code == second.status_code == code
    if stored:
        assert second.headers["idempotent-replayed"] == "true"
        assert second.content == first.content
        assert ledger.count() == 1
    else:
        assert "idempotent-replayed" not in second.headers
        assert second.content != first.content
        assert ledger.count() == 2


# -- bodies --------------------------------------------------------------------------------


async def test_non_json_body_is_fingerprinted_byte_for_byte(
    make_client: MakeClient, ledger: Ledger
) -> None:
    client = make_client()
    headers = {**key_headers("k-text"), "content-type": "text/plain"}
    first = await client.post("/echo", content=b"hello", headers=headers)
    again = await client.post("/echo", content=b"hello", headers=headers)
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["content-type"] == first.headers["content-type"]
    changed = await client.post("/echo", content=b"hello ", headers=headers)
    assert_problem(changed, 422, "idempotency-key-reused")

    binary = bytes(range(256)) * 4
    headers = {**key_headers("k-bin"), "content-type": "application/octet-stream"}
    first = await client.post("/echo", content=binary, headers=headers)
    assert first.content.startswith(binary)
    again = await client.post("/echo", content=binary, headers=headers)
    assert again.content == first.content
    # Invalid JSON declared as JSON is compared as raw bytes.
    headers = {**key_headers("k-badjson"), "content-type": "application/json"}
    first = await client.post("/echo", content=b"{not json", headers=headers)
    again = await client.post("/echo", content=b"{not json", headers=headers)
    assert again.content == first.content
    assert_problem(
        await client.post("/echo", content=b"{not  json", headers=headers),
        422,
        "idempotency-key-reused",
    )
    assert ledger.count("/echo") == 3


async def test_empty_body(make_client: MakeClient, ledger: Ledger) -> None:
    client = make_client()
    first = await client.post("/echo", headers=key_headers("k-empty"))
    assert first.status_code == 200
    again = await client.post("/echo", headers=key_headers("k-empty"))
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    changed = await client.post("/echo", content=b"x", headers=key_headers("k-empty"))
    assert_problem(changed, 422, "idempotency-key-reused")
    assert ledger.count() == 1


async def test_large_json_body_is_accepted_and_one_over_the_limit_is_413(
    make_client: MakeClient, ledger: Ledger
) -> None:
    client = make_client(max_request_bytes=2 << 20, max_response_bytes=64 << 10)
    items = [{"sku": f"sku-{i}", "qty": i, "note": "x" * 20} for i in range(15_000)]
    payload = {"amount": 1, "items": items}
    first = await client.post("/payments", json=payload, headers=key_headers("big"))
    assert first.status_code == 201
    reordered = json.dumps({"items": items, "amount": 1}, indent=1).encode()
    assert len(reordered) > 1 << 20
    again = await client.post(
        "/payments",
        content=reordered,
        headers={**key_headers("big"), "content-type": "application/json"},
    )
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"

    too_big = b"x" * ((2 << 20) + 1)
    response = await client.post("/echo", content=too_big, headers=key_headers("bigger"))
    assert_problem(response, 413, "request-too-large")
    assert ledger.count() == 1


async def test_response_over_the_limit_is_sent_then_never_rerun(
    make_client: MakeClient, ledger: Ledger, async_settler: AsyncSettler
) -> None:
    client = make_client(max_response_bytes=64 << 10)
    body = b"y" * (200 << 10)
    first = await client.post("/echo", content=body, headers=key_headers("k-huge"))
    assert first.status_code == 200
    assert first.content.startswith(body)
    retry = await client.post("/echo", content=body, headers=key_headers("k-huge"))
    assert_problem(retry, 410, "response-not-stored")
    record = await async_settler.get(op_id("k-huge"))
    assert record is not None
    assert record.state is State.COMPLETED
    assert ledger.count() == 1


@pytest.mark.parametrize(("size", "stored"), [(50_000, True), (300_000, False)])
async def test_streaming_response_is_buffered_up_to_the_limit(
    make_client: MakeClient, ledger: Ledger, size: int, stored: bool
) -> None:
    client = make_client(max_response_bytes=100_000)
    first = await client.post(f"/stream?size={size}", headers=key_headers("k-stream"))
    assert first.status_code == 200
    assert len(first.content) == size + 32
    again = await client.post(f"/stream?size={size}", headers=key_headers("k-stream"))
    if stored:
        assert again.content == first.content
        assert again.headers["idempotent-replayed"] == "true"
    else:
        assert_problem(again, 410, "response-not-stored")
    assert ledger.count() == 1


# -- concurrency, leases, timeouts ----------------------------------------------------------


async def test_same_key_while_the_first_runs_is_409_with_retry_after(
    make_client: MakeClient, ledger: Ledger
) -> None:
    client = make_client(retry_after=2)
    first = asyncio.create_task(client.post("/gated", headers=key_headers("k-409")))
    await wait_for(ledger.entered.is_set)
    busy = await client.post("/gated", headers=key_headers("k-409"))
    assert_problem(busy, 409, "request-in-progress")
    assert busy.headers["retry-after"] == "2"
    ledger.gate.set()
    done = await first
    assert done.status_code == 201
    again = await client.post("/gated", headers=key_headers("k-409"))
    assert again.content == done.content
    assert ledger.count("/gated") == 1


async def test_heartbeat_keeps_the_lease_of_a_long_handler(
    make_client: MakeClient, ledger: Ledger, async_settler: AsyncSettler
) -> None:
    client = make_client(lease=1.0)
    first = asyncio.create_task(client.post("/gated", headers=key_headers("k-long")))
    await wait_for(ledger.entered.is_set)
    record = await async_settler.get(op_id("k-long"))
    assert record is not None
    await asyncio.sleep(2.5)  # well past the 1 s lease: only renewals keep it
    busy = await client.post("/gated", headers=key_headers("k-long"))
    assert_problem(busy, 409, "request-in-progress")
    ledger.gate.set()
    assert (await first).status_code == 201
    after = await async_settler.get(op_id("k-long"))
    assert after is not None
    assert after.state is State.COMPLETED
    assert after.generation == record.generation
    assert ledger.count("/gated") == 1


async def test_timeout_cancels_the_handler_and_the_retry_runs_again(
    make_client: MakeClient, ledger: Ledger, async_settler: AsyncSettler
) -> None:
    client = make_client(timeout=0.3)
    timed_out = await client.post("/gated", headers=key_headers("k-slow"))
    assert_problem(timed_out, 504, "handler-timeout")
    assert timed_out.headers["retry-after"] == "1"
    assert len(ledger.cancelled) == 1
    record = await async_settler.get(op_id("k-slow"))
    assert record is not None
    assert (record.state, record.reason) == (State.PROVISIONAL, "timeout")
    retried = await client.post("/gated", headers=key_headers("k-slow"))
    assert retried.status_code == 201
    assert retried.json()["generation"] > ledger.cancelled[0]
    assert ledger.count("/gated") == 1


async def test_a_superseded_attempt_answers_with_the_authoritative_response(
    make_client: MakeClient, ledger: Ledger, async_settler: AsyncSettler
) -> None:
    """Attempt 1 loses its reservation while it runs (here: marked provisional, as after a
    lost lease); attempt 2 completes. Attempt 1's own response is quarantined, and its
    client gets attempt 2's stored response instead."""
    client = make_client()
    first = asyncio.create_task(client.post("/gated", headers=key_headers("k-fence")))
    await wait_for(ledger.entered.is_set)
    record = await async_settler.get(op_id("k-fence"))
    assert record is not None
    reservation = Reservation(
        operation_id=record.operation_id,
        fingerprint=record.fingerprint,
        fingerprint_version=record.fingerprint_version,
        binding=record.binding,
        generation=record.generation,
        attempt_id=record.attempt_id or "",
    )
    await async_settler.mark_provisional(reservation, "test: lease lost")
    second = await client.post("/gated", headers=key_headers("k-fence"))
    assert second.status_code == 201
    ledger.gate.set()
    late = await first
    assert late.status_code == 201
    assert late.content == second.content
    assert late.headers["idempotent-replayed"] == "true"
    quarantined = await async_settler.quarantine.list(operation_id=op_id("k-fence"))
    assert [e.kind.value for e in quarantined] == ["stale_generation"]
    assert ledger.count("/gated") == 2


async def test_a_lost_lease_stops_the_handler_with_409(
    make_client: MakeClient, ledger: Ledger, async_settler: AsyncSettler
) -> None:
    client = make_client(lease=0.6)
    first = asyncio.create_task(client.post("/gated", headers=key_headers("k-lost")))
    await wait_for(ledger.entered.is_set)
    record = await async_settler.get(op_id("k-lost"))
    assert record is not None
    reservation = Reservation(
        operation_id=record.operation_id,
        fingerprint=record.fingerprint,
        fingerprint_version=record.fingerprint_version,
        binding=record.binding,
        generation=record.generation,
        attempt_id=record.attempt_id or "",
    )
    await async_settler.mark_provisional(reservation, "test: taken away")
    response = await first
    assert_problem(response, 409, "attempt-superseded")
    assert ledger.cancelled == [record.generation]
    retried = await client.post("/gated", headers=key_headers("k-lost"))
    assert retried.status_code == 201
    assert ledger.count("/gated") == 1


# -- what is not guarded, and an unreachable store --------------------------------------------


async def test_unguarded_requests_pass_through(make_client: MakeClient, ledger: Ledger) -> None:
    client = make_client(require_key=["/payments"])
    got = await client.get("/open", headers=key_headers("k-get"))
    put = await client.put("/open", headers=key_headers("k-put"))
    keyless = await client.post("/open", headers=key_headers(None))
    assert [r.json()["guarded"] for r in (got, put, keyless)] == [False, False, False]
    with_key = await client.post("/open", headers=key_headers("k-open"))
    assert with_key.json()["guarded"] is True
    missing = await client.post("/payments", json={"amount": 1}, headers=key_headers(None))
    assert_problem(missing, 400, "idempotency-key-missing")

    narrow = make_client(paths=["/payments"])
    outside = await narrow.post("/open", headers=key_headers(None))
    assert outside.json()["guarded"] is False
    assert ledger.count("/open") == 5


async def test_unreachable_store_is_503_and_nothing_runs(ledger: Ledger) -> None:
    dead = AsyncSettler.from_url(f"redis://127.0.0.1:{free_port()}/0", namespace="dead")
    app = starlette_app(dead, ledger)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t"
    ) as client:
        response = await client.post("/payments", json={"amount": 1}, headers=key_headers("k"))
    await dead.aclose()
    assert_problem(response, 503, "idempotency-unavailable")
    assert response.headers["retry-after"] == "1"
    assert ledger.count() == 0


async def test_custom_header_async_principal_and_replayed_headers(
    make_client: MakeClient, ledger: Ledger
) -> None:
    async def principal(scope: Any) -> str | None:
        await asyncio.sleep(0)  # e.g. a token lookup
        return dict(scope["headers"]).get(b"x-principal", b"").decode() or None

    client = make_client(
        header="X-Request-Key",
        principal=principal,
        replay_headers=["content-type", "x-trace"],
    )
    headers = {"X-Request-Key": "custom-1", "X-Principal": "tenant:acme"}
    first = await client.post("/payments", json={"amount": 8}, headers=headers)
    again = await client.post("/payments", json={"amount": 8}, headers=headers)
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["x-trace"] == first.headers["x-trace"]
    assert "location" not in again.headers  # not in this allow-list
    assert "set-cookie" not in again.headers
    ignored = await client.post("/payments", json={"amount": 8}, headers=key_headers("k"))
    assert_problem(ignored, 400, "idempotency-key-missing")  # Idempotency-Key is not the header
    assert ledger.count() == 1


class _LazyPrincipal(str):
    """A principal callable's answer that is a ``str`` and awaitable: what it awaits to is
    the principal (e.g. a token resolved on first use)."""

    def __await__(self) -> Any:
        return self._resolve().__await__()

    async def _resolve(self) -> str:
        await asyncio.sleep(0)
        return "tenant:acme"


async def test_an_awaitable_str_subclass_principal_is_awaited(
    make_client: MakeClient, ledger: Ledger, async_settler: AsyncSettler
) -> None:
    """Found in review (issue 19, the twenty-third round's skip of the awaitable check for a
    plain ``str``): a ``str`` subclass with ``__await__`` is still awaited, and what it awaits
    to is the principal the key is scoped to, not the subclass's own text."""
    client = make_client(principal=lambda _scope: _LazyPrincipal("unresolved"))
    first = await client.post("/payments", json={"amount": 9}, headers=key_headers("lazy-1"))
    assert first.status_code == 201
    again = await client.post("/payments", json={"amount": 9}, headers=key_headers("lazy-1"))
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    assert (await async_settler.get(op_id("lazy-1"))) is not None
    assert (await async_settler.get(op_id("lazy-1", "unresolved"))) is None
    assert ledger.count() == 1


async def test_background_work_after_the_response_does_not_change_the_outcome(
    make_client: MakeClient, ledger: Ledger, async_settler: AsyncSettler
) -> None:
    """The outcome is settled at the handler's last byte; a background task that fails
    afterwards neither un-stores the response nor makes the retry run the handler again."""
    client = make_client(raise_app_exceptions=False)
    first = await client.post("/background", headers=key_headers("k-bg"))
    assert first.status_code == 201
    assert ledger.count("/background:task") == 1
    record = await async_settler.get(op_id("k-bg"))
    assert record is not None
    assert record.state is State.COMPLETED
    again = await client.post("/background", headers=key_headers("k-bg"))
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert ledger.count("/background") == 1


async def test_a_file_response_on_a_server_with_pathsend_is_stored_and_replayed(
    tmp_path: Path, redis_url: str, namespace: str
) -> None:
    """Found in review: with the server's http.response.pathsend extension in the scope, a
    FileResponse sent its file past the held-back start (a broken response), the attempt
    ended provisional, and a retry ran the handler again."""
    receipt = tmp_path / "receipt.txt"
    receipt.write_text("receipt 42")
    runs: list[int] = []

    async def pay(request: Request) -> Response:
        runs.append(1)
        return FileResponse(receipt)

    settler = AsyncSettler.from_url(redis_url, namespace=namespace)
    app = IdempotencyMiddleware(
        Starlette(routes=[Route("/pay", pay, methods=["POST"])]),
        settler=settler,
        principal=lambda _scope: "tenant:acme",
    )

    async def call() -> list[dict[str, Any]]:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "path": "/pay",
            "raw_path": b"/pay",
            "root_path": "",
            "scheme": "http",
            "query_string": b"",
            "headers": [(b"idempotency-key", b'"file-1"'), (b"content-length", b"0")],
            "server": ("test", 80),
            "client": ("client", 1),
            "extensions": {"http.response.pathsend": {}},
        }
        requests = [{"type": "http.request", "body": b"", "more_body": False}]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if requests:
                return requests.pop(0)
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(scope, receive, send)
        return sent

    try:
        first, again = await call(), await call()
    finally:
        await settler.aclose()
    for sent in (first, again):
        assert sent[0]["type"] == "http.response.start"
        assert "http.response.pathsend" not in [m["type"] for m in sent]
        assert b"".join(m.get("body", b"") for m in sent) == b"receipt 42"
    assert runs == [1]
