"""A multipart upload retried by a client that builds its body again, under real servers
(uvicorn for ASGI, the stdlib's WSGI server) on a real Redis.

Every HTTP client library makes a new random boundary each time it builds a multipart body
(httpx, requests and urllib3, browsers, Stripe's SDKs), and a client retries a request by
making the same call again: the same form, under another boundary. The boundary is framing
(RFC 2046 5.1.1, RFC 7578 4.1): no application sees it. settle compared multipart bodies
byte for byte, the boundary parameter of the content type included, so every such retry was
a "different request": 422 ``idempotency-key-reused``, and the client could never learn
the outcome of its upload (SPEC 7: the same request under the same key gets the stored
response). A changed form (a field, a file's name, type or bytes, the parts' order) is
still another request.
"""

from __future__ import annotations

import contextlib
import io
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from werkzeug.formparser import parse_form_data

from settle import AsyncSettler, Settler
from settle.asgi import IdempotencyMiddleware
from settle.http.request import RequestHead, fingerprint_request
from settle.wsgi import IdempotencyMiddleware as WSGIMiddleware
from tests.http.apps import principal_from_environ, principal_from_header, serve, serve_wsgi

TENANT = {"X-Principal": "tenant:acme"}


def _asgi_app(calls: list[str]) -> Starlette:
    async def upload(request: Request) -> Response:
        body = await request.body()
        calls.append(request.headers["content-type"])
        return JSONResponse({"id": f"file_{uuid.uuid4().hex}", "size": len(body)}, 201)

    return Starlette(routes=[Route("/files", upload, methods=["POST"])])


def _wsgi_app(calls: list[str]) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        calls.append(environ["CONTENT_TYPE"])
        data = {"id": f"file_{uuid.uuid4().hex}", "size": len(body)}
        start_response("201 Created", [("Content-Type", "application/json")])
        return [json.dumps(data).encode()]

    return app


@contextlib.contextmanager
def _server(protocol: str, redis_url: str, namespace: str, calls: list[str]) -> Iterator[str]:
    if protocol == "asgi":
        settler = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
        app = _asgi_app(calls)
        middleware = Middleware(
            IdempotencyMiddleware, settler=settler, principal=principal_from_header
        )
        app.user_middleware.insert(0, middleware)
        with serve(app, settler) as base:
            yield base
        return
    with Settler.from_url(redis_url, namespace=namespace, shards=4) as sync:
        guarded = WSGIMiddleware(_wsgi_app(calls), settler=sync, principal=principal_from_environ)
        with serve_wsgi(guarded) as base:
            yield base


def _upload(
    client: httpx.Client,
    key: str,
    *,
    purpose: str = "dispute_evidence",
    name: str = "receipt.pdf",
    media: str = "application/pdf",
    content: bytes = b"%PDF-1.7 receipt 42",
    file_first: bool = False,
) -> httpx.Response:
    """One call of the client's upload: httpx builds the body anew, with a new boundary."""
    files = {"document": (name, content, media)}
    headers = {**TENANT, "Idempotency-Key": key}
    if file_first:  # the file part before the field part
        request = client.build_request("POST", "/files", files=files, headers=headers)
        body = request.read()
        boundary = request.headers["content-type"].split("boundary=")[1].encode()
        parts = body.split(b"--" + boundary)
        field = b'\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n' + purpose.encode()
        reordered = b"--" + boundary + parts[1] + b"--" + boundary + field + b"\r\n"
        reordered += b"--" + boundary + b"--\r\n"
        return client.post(
            "/files",
            content=reordered,
            headers={**headers, "Content-Type": request.headers["content-type"]},
        )
    return client.post("/files", data={"purpose": purpose}, files=files, headers=headers)


@pytest.mark.parametrize("protocol", ["asgi", "wsgi"])
def test_a_multipart_upload_built_again_for_its_retry_is_the_same_request(
    protocol: str, redis_url: str, namespace: str
) -> None:
    calls: list[str] = []
    with (
        _server(protocol, redis_url, namespace, calls) as base,
        httpx.Client(base_url=base, timeout=30) as client,
    ):
        first = _upload(client, "upload-1")
        again = _upload(client, "upload-1")
        boundaries = {r.request.headers["content-type"] for r in (first, again)}
        assert len(boundaries) == 2, "httpx made a new boundary for the retry"
        assert first.status_code == 201, first.text
        assert again.status_code == 201, again.text
        assert again.headers.get("idempotent-replayed") == "true"
        assert again.content == first.content
        assert len(calls) == 1, "the upload ran once"

        # Anything the application reads of the form makes another request.
        changes: list[dict[str, Any]] = [
            {"purpose": "identity_document"},
            {"name": "receipt-2.pdf"},
            {"media": "image/png"},
            {"content": b"%PDF-1.7 receipt 43"},
            {"file_first": True},
        ]
        for change in changes:
            response = _upload(client, "upload-1", **change)
            assert response.status_code == 422, (change, response.status_code, response.text)
            assert response.json()["type"] == "urn:settle:problem:idempotency-key-reused"
    assert len(calls) == 1


@pytest.mark.parametrize("protocol", ["asgi", "wsgi"])
def test_bodies_that_only_look_like_multipart_stay_apart(
    protocol: str, redis_url: str, namespace: str
) -> None:
    """A body its boundary does not frame (no closing delimiter, bare LF line ends) is
    compared byte for byte under its boundary, as before: two such bodies under two
    boundaries are two requests, whatever the application makes of them."""
    calls: list[str] = []
    body = b'--B\r\nContent-Disposition: form-data; name="a"\r\n\r\n1\r\n'  # never closed
    lf = b'--B\nContent-Disposition: form-data; name="a"\n\n1\n--B--\n'  # LF line ends
    with (
        _server(protocol, redis_url, namespace, calls) as base,
        httpx.Client(base_url=base, timeout=30) as client,
    ):
        for n, content in enumerate((body, lf)):
            headers = {**TENANT, "Idempotency-Key": f"odd-{n}"}
            first = client.post(
                "/files",
                content=content,
                headers={**headers, "Content-Type": "multipart/form-data; boundary=B"},
            )
            other = client.post(
                "/files",
                content=content,
                headers={**headers, "Content-Type": "multipart/form-data; boundary=C"},
            )
            assert first.headers.get("idempotent-replayed") is None
            assert other.status_code == 422, other.text


def _form(boundary: str, parts: list[bytes], *, preamble: bytes = b"", tail: bytes = b"") -> bytes:
    delimiter = b"--" + boundary.encode()
    body = preamble + b"".join(delimiter + b"\r\n" + part + b"\r\n" for part in parts)
    return body + delimiter + b"--" + tail


def _fp(boundary: str, body: bytes) -> str:
    content_type = f"multipart/form-data; boundary={boundary}".encode()
    return fingerprint_request(RequestHead("POST", "/files", b"", content_type, ()), body)


def test_what_frames_the_parts_is_not_compared_and_what_they_hold_is() -> None:
    """The fingerprint of the parts (RFC 2046 5.1.1): the boundary, a preamble, an epilogue
    and padding after a delimiter are framing; a header line's name case is not meaning."""
    part = b'Content-Disposition: form-data; name="a"\r\n\r\n1'
    same = _fp("B", _form("B", [part]))
    assert _fp("C", _form("C", [part], preamble=b"ignored\r\n", tail=b"\r\nignored")) == same
    padded = _form("D", [part]).replace(b"--D\r\n", b"--D \t\r\n", 1)
    assert _fp("D", padded) == same
    assert (
        _fp("E", _form("E", [part.replace(b"Content-Disposition", b"content-disposition")])) == same
    )
    assert _fp("F", _form("F", [part.replace(b"1", b"2")])) != same
    assert _fp("G", _form("G", [part.replace(b'"a"', b'"b"')])) != same
    assert _fp("H", _form("H", [part, part])) != same


def test_a_form_of_more_parts_than_any_client_sends_is_compared_byte_for_byte() -> None:
    """Walking a crafted body of a hundred thousand empty parts cost half a second; past
    1000 parts (Django's own limit on a form's fields) the body is compared as it is."""
    many = [b'Content-Disposition: form-data; name="a"\r\n\r\n1'] * 1000
    assert _fp("B", _form("B", many)) == _fp("C", _form("C", many))
    more = [*many, many[0]]
    assert _fp("B", _form("B", more)) != _fp("C", _form("C", more))


#: Two forms that differ in what the application reads (the amount) but not in the parts
#: framed by the first delimiter line break and the close delimiter: Werkzeug (Flask) and
#: Django find a delimiter without its line break (after a preamble's text) and Django reads
#: parts past the close delimiter; both parse a bare LF as a line end in a part's head.
_HIDDEN = {
    "in-preamble": lambda amount: (
        b'junk--B\r\nContent-Disposition: form-data; name="amount"\r\n\r\n%b\r\n'
        b'--B\r\nContent-Disposition: form-data; name="x"\r\n\r\n1\r\n--B--\r\n' % amount
    ),
    "in-epilogue": lambda amount: (
        b'--B\r\nContent-Disposition: form-data; name="x"\r\n\r\n1\r\n--B--\r\n'
        b'--B\r\nContent-Disposition: form-data; name="amount"\r\n\r\n%b\r\n--B--\r\n' % amount
    ),
    "lf-in-a-head": lambda amount: (
        b'--B\r\nContent-Disposition: form-data; name="note"\n\nX\r\n'
        b"%b\r\n\r\nrest\r\n--B--\r\n" % (b"AMOUNT:1" if amount == b"100" else b"amount: 1")
    ),
}


@pytest.mark.parametrize("where", sorted(_HIDDEN))
@pytest.mark.parametrize("protocol", ["asgi", "wsgi"])
def test_a_form_changed_outside_the_parts_settle_reads_is_another_request(
    protocol: str, where: str, redis_url: str, namespace: str
) -> None:
    """The parts settle compares must be all the application can read: a body that holds
    its delimiter anywhere but at the delimiters settle read (a preamble, an epilogue, a
    part's content), or a bare CR or LF in a part's head, is compared byte for byte.
    Otherwise a changed amount under the same key got the first payment's stored response
    (a replay), not 422."""
    first, changed = _HIDDEN[where](b"100"), _HIDDEN[where](b"999")
    assert _werkzeug_form(first) != _werkzeug_form(changed) or where == "in-epilogue"
    calls: list[str] = []
    headers = {**TENANT, "Idempotency-Key": f"hidden-{where}"}
    headers["Content-Type"] = "multipart/form-data; boundary=B"
    with (
        _server(protocol, redis_url, namespace, calls) as base,
        httpx.Client(base_url=base, timeout=30) as client,
    ):
        answered = client.post("/files", content=first, headers=headers)
        again = client.post("/files", content=changed, headers=headers)
    assert answered.status_code == 201, answered.text
    assert again.status_code == 422, (again.status_code, again.headers, again.text)
    assert again.json()["type"] == "urn:settle:problem:idempotency-key-reused"
    assert len(calls) == 1


def _werkzeug_form(body: bytes) -> dict[str, list[str]]:
    """The form Flask reads of ``body`` (boundary ``B``)."""
    environ = {
        "REQUEST_METHOD": "POST",
        "CONTENT_TYPE": "multipart/form-data; boundary=B",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body),
    }
    return dict(parse_form_data(environ)[1].lists())


def test_a_delimiter_outside_the_framing_or_a_bare_line_end_in_a_head_is_not_framing() -> None:
    """Unit view of the test above: each such body is compared byte for byte (its
    fingerprint then changes with the boundary), and one delimiter in a part's content or
    a bare CR in a head is enough."""
    part = b'Content-Disposition: form-data; name="a"\r\n\r\n1'
    assert _fp("B", _form("B", [part])) == _fp("C", _form("C", [part]))
    # The same content under C, where "--B" is no delimiter: Django splits it under B.
    inside = [part + b" --B inside"]
    assert _fp("B", _form("B", inside)) != _fp("C", _form("C", inside))
    odd = {
        "cr-in-head": [part.replace(b"\r\n\r\n", b"\rX: y\r\n\r\n")],
        "lf-in-head": [part.replace(b"\r\n\r\n", b"\nX: y\r\n\r\n")],
        # A folded line goes on the value before it (Werkzeug): its name case is meaning.
        "folded-line": [part.replace(b"\r\n\r\n", b"\r\n X: y\r\n\r\n")],
        "tab-folded-line": [part.replace(b"\r\n\r\n", b"\r\n\tX: y\r\n\r\n")],
        "no-name": [part.replace(b"\r\n\r\n", b"\r\n: y\r\n\r\n")],
        "space-in-name": [part.replace(b"\r\n\r\n", b"\r\nX Y: y\r\n\r\n")],
    }
    for name, parts in odd.items():
        body = _form("B", parts)
        assert _fp("B", body) != _fp("C", body.replace(b"--B", b"--C")), name
    for where, make in _HIDDEN.items():
        body = make(b"100")
        assert _fp("B", body) != _fp("C", body.replace(b"--B", b"--C")), where


def test_the_parts_are_told_apart_and_only_framing_is_dropped() -> None:
    """The parts of two forms never run together (a part's head against the parts before
    and after it); the blanks around a header value are no meaning (RFC 9110 5.5); two
    ``boundary`` parameters leave the body compared byte for byte, both of them included
    (which one an application's parser takes is its own)."""
    headed = [b"X: y\r\n\r\nabc"]
    headless = [b"\r\nx", b"\r\ny", b"\r\nabc"]
    assert _fp("B", _form("B", headed)) != _fp("B", _form("B", headless))
    part = b'Content-Disposition: form-data; name="a"\r\n\r\n1'
    blanks = part.replace(b": ", b":  \t").replace(b"\r\n\r\n", b" \r\n\r\n")
    assert _fp("B", _form("B", [blanks])) == _fp("C", _form("C", [part]))

    def two(second: str) -> str:
        content_type = f"multipart/form-data; boundary=B; boundary={second}".encode()
        head = RequestHead("POST", "/files", b"", content_type, ())
        return fingerprint_request(head, _form("B", [part]))

    assert two("C") != two("D")
