"""Request fingerprints: SHA-256 of the RFC 8785 (JCS) canonical JSON of a request.

The same request gives the same fingerprint in every process, Python version and dict
order. Values with no canonical JSON form raise :class:`FingerprintError` instead of
being coerced, so two different requests can never share a fingerprint by accident.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from typing import Any

import rfc8785
from pydantic import BaseModel

from settle.errors import FingerprintError

__all__ = ["FINGERPRINT_VERSION", "canonical_json", "fingerprint"]

#: Stored with every record. Bump it when the canonical form changes; a record stored
#: under another version never matches (it is reported as a fingerprint mismatch).
FINGERPRINT_VERSION = 1

_MAX_DEPTH = 64


def _to_json_value(value: Any, depth: int = 0) -> Any:
    if depth > _MAX_DEPTH:
        raise FingerprintError(f"request nests deeper than {_MAX_DEPTH} levels")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, BaseModel):
        return _to_json_value(value.model_dump(mode="json"), depth + 1)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise FingerprintError(
                    f"object keys must be strings, got {type(key).__name__}; "
                    "convert the keys before fingerprinting"
                )
            out[key] = _to_json_value(item, depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [_to_json_value(item, depth + 1) for item in value]
    raise FingerprintError(
        f"{type(value).__name__} has no canonical JSON form; pass plain JSON values "
        "or a pydantic model"
    )


def canonical_json(value: Any) -> bytes:
    """Return the RFC 8785 canonical JSON bytes of ``value``.

    Pydantic models are dumped with ``mode="json"`` first; bytes become base64 strings.
    Raises :class:`FingerprintError` for NaN, infinities, sets and unknown objects.
    """
    try:
        return rfc8785.dumps(_to_json_value(value))
    except rfc8785.CanonicalizationError as exc:
        raise FingerprintError(f"request has no canonical JSON form: {exc}") from exc


def fingerprint(value: Any) -> str:
    """Return the SHA-256 hex digest of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_json(value)).hexdigest()
