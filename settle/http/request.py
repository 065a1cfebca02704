"""A guarded request as every protocol sees it, its body limit and its fingerprint.

The fingerprint covers the method, the path, the query (parameters in a stable order), the
content type and the canonical body: RFC 8785 (JCS) canonical JSON for JSON bodies, so key
order and whitespace do not matter; the parts of a multipart body its boundary frames, without
the boundary (a client makes a new one each time it builds the body); and the raw bytes
otherwise. It is the SHA-256 of the JCS form of that description (:func:`settle.fingerprint`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from settle._slots import slot_init
from settle.errors import FingerprintError, InvalidInput, SettleError
from settle.fingerprint import canonical_json, fingerprint
from settle.http.multipart import multipart_digest

__all__ = [
    "BodyBuffer",
    "ClientDisconnected",
    "ParsedForm",
    "RequestHead",
    "RequestMalformed",
    "RequestTooLarge",
    "fingerprint_request",
]

#: Bump when the description below changes: old records then no longer match (422). (A new
#: body kind, such as ``multipart``, changes only the requests of that kind: not bumped.)
REQUEST_FINGERPRINT_FORMAT = 1


class RequestTooLarge(InvalidInput):
    """The request body is over ``max_request_bytes`` (answered with 413)."""


class RequestMalformed(InvalidInput):
    """The request's body cannot be delimited (a WSGI ``CONTENT_LENGTH`` that is not a
    number): answered with 400, nothing read, reserved or run."""


class ClientDisconnected(SettleError):
    """The client went away (or stopped sending) before its whole body arrived: nothing was
    reserved or run. The client may send the request again with the same key. The
    middlewares answer it themselves (``Guard.disconnected``); it never leaves them."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.__doc__ or "")


# slot_init: each field set through its slot's descriptor, not ``object.__setattr__`` (the
# head is built on every request; docs/benchmarks.md, the twenty-third round).
@slot_init
@dataclass(frozen=True, slots=True)
class RequestHead:
    """What the rules need of a request before its body, whatever the protocol."""

    method: str
    path: str
    """The whole path, mount prefix included (ASGI's ``path``, WSGI's ``SCRIPT_NAME`` +
    ``PATH_INFO``), decoded as UTF-8: what the fingerprint covers, so that applications
    mounted under two prefixes never share a stored response."""
    query: bytes
    """The raw query string, without the ``?``."""
    content_type: bytes
    """Every ``Content-Type`` value, joined with commas (empty without one)."""
    key_values: tuple[bytes, ...]
    """Every value of the idempotency key header, in the order received."""
    content_length: bytes | None = None
    route: str | None = None
    """The path inside the application (without the mount prefix: ASGI's ``root_path``,
    WSGI's ``SCRIPT_NAME``), as its routing reads it; None (or ``path`` itself) when there
    is no mount prefix. ``paths`` patterns match either."""


class BodyBuffer:
    """Collects a request body, refusing it past ``limit`` bytes (declared or received)."""

    def __init__(self, limit: int, declared: bytes | None) -> None:
        self.limit = limit
        digits = declared.strip() if declared else b""
        if digits.isdigit() and len(digits) > 20:  # past any body (int() refuses 4300 digits)
            raise self._too_large()
        self._declared = int(digits) if digits.isdigit() else None
        if self._declared is not None and self._declared > limit:
            raise self._too_large()
        self._chunks: list[bytes] = []
        self._size = 0

    def add(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size > self.limit:
            raise self._too_large()
        self._chunks.append(chunk)

    def body(self) -> bytes:
        return b"".join(self._chunks)

    def complete(self) -> bytes:
        """The body, read to its end: :class:`ClientDisconnected` if it is shorter than the
        length its request declared (a WSGI server hands over what arrived before the
        client stopped sending or left, as if it were the whole body)."""
        if self._declared is not None and self._size < self._declared:
            raise ClientDisconnected(
                f"the client sent {self._size} of its {self._declared} body bytes and went "
                "away: nothing was run. It may retry with the same key."
            )
        return self.body()

    def _too_large(self) -> RequestTooLarge:
        return RequestTooLarge(f"the request body is over the {self.limit}-byte limit")


class ParsedForm(bytes):
    """What stands for a multipart body that a framework parsed before settle could read it
    (Django, once something read ``request.POST``): its fields and files, each
    length-prefixed. It is compared as it is, as a form, without the boundary of the
    request's content type: the boundary framed bytes that are gone, and a client makes a
    new one each time it builds the body."""


def fingerprint_request(head: RequestHead, body: bytes) -> str:
    """The fingerprint of a request: same value for the same request, in any process."""
    parts = (head.method, head.path, head.query, head.content_type)
    # Request lines of a usual size are cached; a long one is not kept in memory.
    rest = _head_json(*parts) if sum(map(len, parts)) > _CACHED_HEAD_CHARS else _cached(*parts)
    media_type = rest[0]
    if body and media_type.startswith("multipart/"):
        if isinstance(body, ParsedForm):
            form: dict[str, str] | None = {
                "kind": "form",
                "sha256": hashlib.sha256(body).hexdigest(),
            }
        else:
            form = _multipart_body(head.content_type, body)
        if form is not None:
            # Its boundary is framing, made anew by the client for every body it builds (a
            # retry builds it again): the parts stand for the body, and the boundary
            # parameter is left out of the content type.
            description = _description(head)
            media, params = description["content_type"]
            description["content_type"] = [media, [p for p in params if p[0] != "boundary"]]
            return fingerprint({**description, "body": form})
    body_part = _body(media_type, body)
    if rest[1] is None:  # a lone surrogate in the path: the reference encoder says so
        return fingerprint({**_description(head), "body": body_part})
    # The description's keys sorted: "body" first, then the head's part (cached per head).
    kind = body_part["kind"]
    if kind == "empty":
        canonical = '{"body":{"kind":"empty"},' + rest[1]
    else:
        canonical = f'{{"body":{{"kind":"{kind}","sha256":"{body_part["sha256"]}"}},{rest[1]}'
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _description(head: RequestHead) -> dict[str, Any]:
    """Every part of the fingerprint's description but the body."""
    media_type, params = _content_type(head.content_type)
    if _is_json(media_type):
        # RFC 8259 defines no charset for JSON (it is UTF-8): the parameter means nothing.
        params = [p for p in params if p[0] != "charset"]
    return {
        "format": REQUEST_FINGERPRINT_FORMAT,
        "method": head.method.upper(),
        "path": head.path,
        "query": _query(head.query),
        "content_type": [media_type, params],
    }


def _head_json(method: str, path: str, query: bytes, content_type: bytes) -> tuple[str, str | None]:
    """(media type, the RFC 8785 form of the head's description after its opening brace),
    or None for the second when it holds a lone surrogate. Strings, lists and the integer 1
    under ASCII keys: json.dumps with sorted keys writes the RFC 8785 form itself
    (settle.fingerprint's fast path)."""
    description = _description(RequestHead(method, path, query, content_type, ()))
    media_type: str = description["content_type"][0]
    text = _dumps(description)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return media_type, None
    return media_type, text[1:]


_CACHED_HEAD_CHARS = 512
_cached = functools.lru_cache(maxsize=512)(_head_json)


def _dumps(value: Any) -> str:
    return _PLAIN.encode(value)


#: ``json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)``, built
#: once (``json.dumps`` with options builds an encoder per call).
_PLAIN = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _query(raw: bytes) -> list[list[str]]:
    """Query parameters sorted by name; repeated names keep their relative order."""
    pairs = [part.split("=", 1) for part in raw.decode("latin-1").split("&") if part]
    return sorted(([p[0], p[1] if len(p) > 1 else ""] for p in pairs), key=lambda p: p[0])


def _content_type(raw: bytes) -> tuple[str, list[list[str]]]:
    text = raw.decode("latin-1")
    media_type, *rest = text.split(";")
    params = []
    for part in rest:
        name, _, value = part.partition("=")
        name, value = name.strip().lower(), value.strip().strip('"')
        if name:
            # Parameter values are case-insensitive (charset=UTF-8), except a boundary.
            params.append([name, value if name == "boundary" else value.lower()])
    return media_type.strip().lower(), sorted(params)


def _body(media_type: str, body: bytes) -> dict[str, str]:
    if not body:
        return {"kind": "empty"}
    if _is_json(media_type):
        canonical = _canonical_json_body(body)
        if canonical is not None:
            return {"kind": "json", "sha256": hashlib.sha256(canonical).hexdigest()}
    return {"kind": "raw", "sha256": hashlib.sha256(body).hexdigest()}


def _multipart_body(content_type: bytes, body: bytes) -> dict[str, str] | None:
    """The parts of a multipart body framed by the boundary of its content type, in order,
    each its header lines (names lowercased, values stripped) and its content, hashed with
    every item length-prefixed; None when the boundary does not frame the body (then it is
    compared byte for byte, under its boundary). The preamble, the epilogue and the padding
    after a delimiter are not content (RFC 2046 5.1.1): an application's parser drops them
    too. Only a body every parser frames alike is read so: its delimiter nowhere but at the
    delimiters read (not in the preamble, a part or the epilogue), CR LF the only line end
    of a part's head; any other is compared byte for byte, as a changed body that settle's
    reading and the application's differ on must never replay."""
    boundaries = [value for name, value in _content_type(content_type)[1] if name == "boundary"]
    if len(boundaries) != 1 or not boundaries[0]:
        return None  # none, or two: which frames the body is not for settle to guess
    digest = multipart_digest(body, boundaries[0].encode("latin-1"))
    return None if digest is None else {"kind": "multipart", "sha256": digest}


def _is_json(media_type: str) -> bool:
    return media_type == "application/json" or media_type.endswith("+json")


def _canonical_json_body(body: bytes) -> bytes | None:
    """JCS bytes of a JSON body; None when it has no single canonical meaning.

    Invalid JSON, duplicate object keys, NaN/Infinity and integers outside the I-JSON range
    fall back to the raw bytes, so two such bodies are the same request only byte for byte.
    """
    if body.count(b"{") + body.count(b"[") > _MAX_DEPTH:
        return _canonical_json_walked(body)  # may nest too deep: settle.fingerprint checks
    try:
        # json.loads(body, ...) itself, with decoders built once (it builds one per call).
        text = body.decode(json.detect_encoding(body), "surrogatepass")
        value = _PLAIN_DECODER.decode(text)
    except _NotPlain:
        return _canonical_json_walked(body)
    except (ValueError, RecursionError):
        return None
    # What canonical_json writes for a plain value (no floats, safe integers, ASCII keys),
    # without its walk: the parser's hooks saw every number and key already.
    try:
        return _PLAIN.encode(value).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: canonical_json's reference encoder says so
        return _canonical(value)


#: settle.fingerprint refuses values nested deeper than this; a body with fewer brackets
#: (counted in its bytes, strings included) cannot nest deeper.
_MAX_DEPTH = 64
_SAFE_INT = 2**53 - 1


class _NotPlain(Exception):  # a signal between the hooks and their caller
    """A float, an integer outside +-(2**53 - 1) or a non-ASCII object key: the body is
    parsed again and written by :func:`settle.fingerprint.canonical_json`."""


def _plain_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = _no_duplicates(pairs)
    for key in out:
        if not key.isascii():
            raise _NotPlain
    return out


def _plain_float(_: str) -> float:
    raise _NotPlain


def _plain_int(text: str) -> int:
    value = int(text)
    if len(text) > 15 and not -_SAFE_INT <= value <= _SAFE_INT:
        raise _NotPlain
    return value


def _canonical(value: Any) -> bytes | None:
    try:
        return canonical_json(value)
    except (RecursionError, FingerprintError):
        return None


def _canonical_json_walked(body: bytes) -> bytes | None:
    try:
        value = _DECODER.decode(body.decode(json.detect_encoding(body), "surrogatepass"))
    except (ValueError, RecursionError):
        return None
    return _canonical(value)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate object key")
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


#: The parser of a body that :data:`_PLAIN` can write: its hooks raise :class:`_NotPlain`
#: on anything else (the stdlib's own ``json.loads`` shares one decoder between threads
#: too: its hooks here keep no state).
_PLAIN_DECODER = json.JSONDecoder(
    object_pairs_hook=_plain_object,
    parse_constant=_no_constant,
    parse_float=_plain_float,
    parse_int=_plain_int,
)
#: ``json.loads(..., object_pairs_hook=_no_duplicates, parse_constant=_no_constant)``.
_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
