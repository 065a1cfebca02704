"""The request fingerprint skips settle.fingerprint's walk of the value (the JSON parser's
hooks see every number and key) and caches the head's part: it must stay the SHA-256 of the
RFC 8785 form of the same description, for every request. A stored record keeps its
fingerprint for the whole retention; a changed value would answer its retry 422."""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from settle.errors import FingerprintError
from settle.fingerprint import canonical_json, fingerprint
from settle.http.request import (
    _MAX_DEPTH,
    RequestHead,
    _content_type,
    _is_json,
    _no_constant,
    _no_duplicates,
    _query,
    fingerprint_request,
)


def reference(head: RequestHead, body: bytes) -> str:
    """The description of docs/http-endpoints.md, through settle.fingerprint as it is (the
    head's parts parsed as the middleware parses them)."""
    media_type, params = _content_type(head.content_type)
    if _is_json(media_type):
        params = [p for p in params if p[0] != "charset"]
    described: dict[str, str]
    if not body:
        described = {"kind": "empty"}
    else:
        canonical = None
        if _is_json(media_type):
            try:
                value = json.loads(
                    body, object_pairs_hook=_no_duplicates, parse_constant=_no_constant
                )
                canonical = canonical_json(value)
            except (ValueError, RecursionError, FingerprintError):
                canonical = None
        if canonical is not None:
            described = {"kind": "json", "sha256": hashlib.sha256(canonical).hexdigest()}
        else:
            described = {"kind": "raw", "sha256": hashlib.sha256(body).hexdigest()}
    return fingerprint(
        {
            "format": 1,
            "method": head.method.upper(),
            "path": head.path,
            "query": _query(head.query),
            "content_type": [media_type, params],
            "body": described,
        }
    )


_KEYS = st.text(max_size=6) | st.sampled_from(["a", "é", "\u2028", "k\ud800", "1", "A"])
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.sampled_from([2**53 - 1, 2**53, -(2**53), 10**15, -(10**15), 0])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec=None, exclude_categories=()), max_size=8)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=12,
)


def outcome(fn: Any, head: RequestHead, body: bytes) -> str:
    """The fingerprint, or the error it raises (a lone surrogate in the path)."""
    try:
        return str(fn(head, body))
    except FingerprintError as exc:
        return f"raised {type(exc).__name__}"


def _head(path: str = "/payments", query: bytes = b"", content_type: bytes = b"") -> RequestHead:
    return RequestHead("POST", path, query, content_type, (b"k",))


@settings(max_examples=300, deadline=None)
@given(
    value=_VALUES,
    ascii_only=st.booleans(),
    content_type=st.sampled_from(
        [b"application/json", b"application/problem+json; charset=UTF-8", b"text/plain", b""]
    ),
    path=st.sampled_from(["/payments", "/p\u00e9/1", "/x\ud800"]),
    query=st.sampled_from([b"", b"b=2&a=1&a=0", b"x&y=\xe9"]),
)
def test_a_json_body_fingerprints_as_settle_fingerprint_does(
    value: Any, ascii_only: bool, content_type: bytes, path: str, query: bytes
) -> None:
    body = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    head = _head(path, query, content_type)
    assert outcome(fingerprint_request, head, body) == outcome(reference, head, body)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b'{"a": 1, "a": 2}',
        b'{"a": NaN}',
        b"[1.0, 2]",
        b"1e400",
        b'{"\\u00e9": 1}',
        b'["\\ud800"]',
        b"9007199254740993",
        b"-9007199254740991",
        b"[" * 64 + b"1" + b"]" * 64,
        b"[" * 65 + b"1" + b"]" * 65,
        b"[" * 65 + b"]" * 65,
        b'["[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", 1.5]',
        b"[" * 5000 + b"]" * 5000,
        b'{"b": [1, {"c": null}], "a": "\\u2028"}',
        b"\xff\xfe",
        # The parser's hooks stop at the first float, big integer or non-ASCII key and the
        # body is parsed again: what comes after must still decide it.
        b'{"a": 1.5, "a": 2}',
        b"[1.5, NaN]",
        b'{"\xc3\xa9": 1, "\xc3\xa9": 2}',
        b'[123456789012345678, {"a": 1, "a": 1}]',
        b'[1.5, "\\ud800"]',
        b"[1.5, 2",
        # json.loads' own encodings: a UTF-8 BOM, UTF-16 and UTF-32.
        b'\xef\xbb\xbf{"a": 1}',
        '{"b": [1, 2], "a": "\u00e9"}'.encode("utf-16"),
        '{"a": 1}'.encode("utf-32-le"),
        # The integer bounds of the hooks' stop: 2**53 and -(2**53) have no I-JSON form.
        b"9007199254740991",
        b"9007199254740992",
        b"-9007199254740992",
        b"[-0, 1E2, 1e2, -0.0, 1e-400]",
        # Non-ASCII keys stop the hooks: RFC 8785 sorts keys by UTF-16 code units, in which
        # U+10000 (a surrogate pair) comes before U+FFFF; code point order is the reverse.
        '{"\uffff": 1, "\U00010000": 2}'.encode(),
        # A body parsed again after a stop is decoded as json.loads decodes it.
        '{"b": 1.5, "a": "\u00e9"}'.encode("utf-16"),
        b'\xef\xbb\xbf[1.5, {"\xc3\xa9": 2}]',
    ],
)
def test_edge_bodies_fingerprint_as_settle_fingerprint_does(body: bytes) -> None:
    for content_type in (b"application/json", b"text/plain"):
        head = _head(content_type=content_type)
        assert outcome(fingerprint_request, head, body) == outcome(reference, head, body)


def test_the_head_cache_keeps_requests_apart() -> None:
    """Two heads that differ in any part never share the cached part."""
    body = b'{"amount": 1}'
    seen = {
        fingerprint_request(RequestHead(method, path, query, ctype, ()), body)
        for method in ("POST", "PATCH")
        for path in ("/a", "/b")
        for query in (b"", b"x=1")
        for ctype in (b"application/json", b"text/plain")
    }
    assert len(seen) == 16


def test_a_long_request_line_fingerprints_the_same_uncached() -> None:
    """A request line too long to be cached is fingerprinted the same way."""
    body = b'{"amount": 1}'
    for path, query in (("/" + "p" * 600, b""), ("/payments", b"q=" + b"v" * 600)):
        head = _head(path, query, b"application/json")
        assert outcome(fingerprint_request, head, body) == outcome(reference, head, body)


def test_bodies_fingerprinted_on_many_threads_at_once_never_mix() -> None:
    """The WSGI middleware fingerprints requests on many threads at once, through one
    shared JSON decoder and encoder: their hooks keep no state, so a body's fingerprint
    never depends on what another thread parses meanwhile (a float seen in one body must
    not send another to the raw-bytes fallback, nor the reverse)."""
    plain = ",".join(f'"k{i}": {i}' for i in range(300))
    # What stops the hooks first (then a long parse, during which other threads start and
    # stop their own), or last; 1.0 is "1.0" to json.dumps, 1 in RFC 8785.
    bodies = [f"{{{plain}}}".encode(), f"{{{plain}, ".encode()]
    for stop in ('"z": 1.0', '"z": {"\u00e9": 1}', '"z": 9007199254740993', '"z": NaN'):
        bodies += [f"{{{stop}, {plain}}}".encode(), f"{{{plain}, {stop}}}".encode()]
    bodies += [f'{{{plain}, "k0": 1}}'.encode(), f'{{{plain}, "z": "\\ud800"}}'.encode()]
    # Few brackets: the shared plain parser reads them (not the walk of deep bodies).
    assert all(body.count(b"{") + body.count(b"[") <= _MAX_DEPTH for body in bodies)
    head = _head(content_type=b"application/json")
    expected = [fingerprint_request(head, body) for body in bodies]
    threads = 8
    start = threading.Barrier(threads)
    mixed: list[tuple[int, str]] = []

    def fingerprint_many(offset: int) -> None:
        start.wait()
        for n in range(200):
            i = (offset + n) % len(bodies)
            got = fingerprint_request(head, bodies[i])
            if got != expected[i]:
                mixed.append((i, got))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads inside the parser's hooks
    try:
        workers = [threading.Thread(target=fingerprint_many, args=(k,)) for k in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        sys.setswitchinterval(interval)
    assert mixed == []
