"""The ``Idempotency-Key`` header and the operation id it becomes.

The IETF draft defines the header as a Structured Field string (``"8e03978e-..."``, RFC 8941
§3.3.3). Many clients send the bare value (``8e03978e-...``), so both are accepted; the
value is then the same key either way. Anything else (an empty value, a second header, a
character outside visible ASCII, a list or parameters) is malformed.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal

from settle.errors import InvalidInput

__all__ = ["KeyScope", "MalformedKey", "operation_id", "operation_id_overhead", "parse_key"]

KeyScope = Literal["principal", "global"]

#: One token of visible ASCII (0x21-0x7e) without a quote (0x22), a comma (0x2c), a semicolon
#: (0x3b) or a backslash (0x5c): one match, where a match and a scan per excluded character
#: cost three times the instructions on every request.
_BARE = re.compile(r"[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]+")
_SCOPE_DIGEST_CHARS = 32


class MalformedKey(InvalidInput):
    """The ``Idempotency-Key`` header is present but not a usable key (answered with 400)."""


def parse_key(values: list[bytes], max_length: int) -> str:
    """Return the key carried by the header ``values`` (every occurrence, in order)."""
    if len(values) != 1:
        raise MalformedKey("send exactly one Idempotency-Key header")
    try:
        text = values[0].decode("ascii").strip(" \t")
    except UnicodeDecodeError:
        raise MalformedKey("the Idempotency-Key must be visible ASCII") from None
    key = _sf_string(text) if text.startswith('"') else _bare(text)
    if "," in key:
        # A server or proxy may join two header lines with a comma (RFC 9110 5.3; a WSGI
        # server always does): a comma could be two keys taken for one.
        raise MalformedKey("the Idempotency-Key must not contain a comma")
    if not 1 <= len(key) <= max_length:
        raise MalformedKey(f"the Idempotency-Key must be 1 to {max_length} characters long")
    return key


def _bare(text: str) -> str:
    if not _BARE.fullmatch(text):
        raise MalformedKey(
            'the Idempotency-Key must be a quoted string ("...") or one token of visible '
            "ASCII without quotes, commas, semicolons or backslashes"
        )
    return text


def _sf_string(text: str) -> str:
    out: list[str] = []
    i = 1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            if i + 1 >= len(text) or text[i + 1] not in '"\\':
                raise MalformedKey('only \\" and \\\\ may be escaped in the Idempotency-Key')
            out.append(text[i + 1])
            i += 2
            continue
        if ch == '"':
            if i != len(text) - 1:
                raise MalformedKey("the Idempotency-Key must be a single string, no parameters")
            return "".join(out)
        if not " " <= ch <= "~":
            raise MalformedKey("the Idempotency-Key must be visible ASCII or spaces")
        out.append(ch)
        i += 1
    raise MalformedKey("the Idempotency-Key string is not closed with a quote")


def operation_id(prefix: str, key: str, principal: str, scope: KeyScope) -> str:
    """``<prefix>:<principal digest>:<key>`` (per principal) or ``<prefix>:global:<key>``.

    The digest keeps principals apart in the key space; the binding (the principal itself)
    is stored with the record and checked on every call as well.
    """
    if scope == "global":
        return f"{prefix}:global:{key}"
    digest = hashlib.sha256(principal.encode("utf-8")).hexdigest()[:_SCOPE_DIGEST_CHARS]
    return f"{prefix}:{digest}:{key}"


def operation_id_overhead(prefix: str) -> int:
    """How many characters of the 256-character operation id the key cannot use."""
    return len(prefix) + 2 + _SCOPE_DIGEST_CHARS
