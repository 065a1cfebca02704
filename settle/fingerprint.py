"""Request fingerprints: SHA-256 of the RFC 8785 (JCS) canonical JSON of a request.

The same request gives the same fingerprint in every process, Python version and dict
order. Values with no canonical JSON form raise :class:`FingerprintError` instead of
being coerced, so two different requests can never share a fingerprint by accident.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import typing
from collections.abc import Callable, Mapping
from typing import Any

import pydantic_core
import rfc8785
from pydantic import BaseModel

from settle.errors import FingerprintError

__all__ = ["FINGERPRINT_VERSION", "canonical_json", "fingerprint"]

#: Stored with every record. Bump it when the canonical form changes; a record stored
#: under another version never matches (it is reported as a fingerprint mismatch).
FINGERPRINT_VERSION = 1

_MAX_DEPTH = 64
#: Values :func:`_to_json_value` converts itself (sets are refused there, not converted).
_JSON_TYPES = (
    type(None),
    bool,
    str,
    int,
    float,
    BaseModel,
    bytes,
    bytearray,
    memoryview,
    Mapping,
    list,
    tuple,
    set,
    frozenset,
)
_SAFE_INT = 2**53 - 1
#: ``json.dumps(..., ensure_ascii=False, separators=(",", ":"), sort_keys=True)``, built once.
_PLAIN = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _plain_encoder() -> Callable[[Any], str]:
    """``_PLAIN.encode``, without building the C encoder again on every call (a tenth of a
    small request's fingerprint): the one ``JSONEncoder.iterencode`` builds, made once. It
    checks no cycles: a converted value is a tree the walk built, and a cycle in a request
    is refused by the walk's depth limit first. Without the C encoder (another Python),
    ``_PLAIN.encode`` itself."""
    make = getattr(json.encoder, "c_make_encoder", None)  # undocumented, not in typeshed
    if make is None:
        return _PLAIN.encode
    try:
        encoder = make(
            None, _PLAIN.default, json.encoder.encode_basestring, None, ":", ",", True, False, True
        )
    except TypeError:  # another signature
        return _PLAIN.encode
    return lambda value: "".join(encoder(value, 0))


_encode_plain = _plain_encoder()


class _Walk:
    """Whether the converted value is "plain": no floats, integers within +-(2**53 - 1),
    object keys in ASCII. For such values ``json.dumps`` with sorted keys writes exactly the
    RFC 8785 form (the same escapes, and code point order equals UTF-16 order for ASCII),
    so the C encoder can stand in for the pure-Python one. A property test holds the two
    equal on generated values."""

    __slots__ = ("plain",)

    def __init__(self) -> None:
        self.plain = True


def _to_json_value(value: Any, walk: _Walk, depth: int = 0) -> Any:
    if depth > _MAX_DEPTH:
        raise FingerprintError(f"request nests deeper than {_MAX_DEPTH} levels")
    if type(value) is dict:  # the common request: none of the types checked before Mapping
        return _object(value, walk, depth)
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        if not -_SAFE_INT <= value <= _SAFE_INT:
            walk.plain = False
        return value
    if isinstance(value, float):
        walk.plain = False
        return value
    if isinstance(value, BaseModel):
        return _to_json_value(_model_json(value), walk, depth + 1)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _to_json_value(_dataclass_json(value), walk, depth + 1)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Mapping):
        return _object(value, walk, depth)
    if isinstance(value, list | tuple):
        return [_to_json_value(item, walk, depth + 1) for item in value]
    raise FingerprintError(
        f"{type(value).__name__} has no canonical JSON form; pass plain JSON values "
        "or a pydantic model"
    )


def _object(value: Mapping[Any, Any], walk: _Walk, depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    leaves = depth < _MAX_DEPTH  # an item one level down is within the depth limit
    for key, item in value.items():
        if not isinstance(key, str):
            raise FingerprintError(
                f"object keys must be strings, got {type(key).__name__}; "
                "convert the keys before fingerprinting"
            )
        if not key.isascii():
            walk.plain = False
        # The common leaves inline (what the call below returns for them unchanged).
        kind = type(item)
        if leaves and (
            kind is str
            or item is None
            or kind is bool
            or (kind is int and -_SAFE_INT <= item <= _SAFE_INT)
        ):
            out[key] = item
        else:
            out[key] = _to_json_value(item, walk, depth + 1)
    return out


def _model_json(model: BaseModel) -> Any:
    """A pydantic model as pydantic's JSON mode dumps it, every value in it by its own
    class (``serialize_as_any``): a field declared as a base model that holds a subclass
    (``method: PaymentMethod`` holding a ``Card``) is dumped with the subclass's fields,
    else two requests that differ only there would share a fingerprint. Sets are put in
    one order (:func:`_ordered_sets`): JSON mode writes a set as a list in its iteration
    order, which differs between processes (string hashes are salted per process), so a
    retry from another worker would not match. A model pydantic cannot dump (bytes that
    are not UTF-8, an object it does not know) has no canonical form."""
    # Only a model that holds a subclass is dumped with serialize_as_any: it drops the
    # serializers a model declares in Annotated (PlainSerializer, WrapSerializer) and
    # json_encoders, so every other model would get another fingerprint than the one its
    # operations were reserved under (and one only such a serializer can write is refused).
    as_any = _holds_subclass(model, 0)
    try:
        python = model.model_dump(mode="python", serialize_as_any=as_any)
        dumped = model.model_dump(mode="json", serialize_as_any=as_any)
    except (ValueError, TypeError) as exc:
        # PydanticSerializationError, UnicodeDecodeError; TypeError: a set of models, whose
        # Python-mode dump would be a set of dicts.
        raise FingerprintError(f"{type(model).__name__} has no canonical JSON form: {exc}") from exc
    return _ordered_sets(python, dumped, 0, type(model).__name__)


def _holds_subclass(model: BaseModel, depth: int) -> bool:
    """Whether a field of ``model`` (or of a model in it) holds a model of a class its
    annotation does not name (a subclass of the declared one), which pydantic's JSON mode
    would dump by the declared class. A field typed ``Any`` (no model named) is dumped by
    the value's own class anyway."""
    if depth > _MAX_DEPTH:
        return False
    for name, declared in _declared_models(type(model)):
        if _held_subclass(getattr(model, name, None), declared, depth + 1):
            return True
    return False


#: Per model class: each dumped field and the model classes its annotation names.
_DECLARED: dict[type[BaseModel], tuple[tuple[str, frozenset[type]], ...]] = {}


def _declared_models(cls: type[BaseModel]) -> tuple[tuple[str, frozenset[type]], ...]:
    found = _DECLARED.get(cls)
    if found is None:
        found = tuple(
            (name, frozenset(_named_models(info.annotation, set())))
            for name, info in cls.model_fields.items()
            if info.exclude is not True
        )
        if len(_DECLARED) >= 4096:  # classes made at runtime (generic parametrizations)
            _DECLARED.clear()
        _DECLARED[cls] = found
    return found


def _held_subclass(value: Any, declared: frozenset[type], depth: int) -> bool:
    if depth > _MAX_DEPTH or value is None or isinstance(value, str | int | float):
        return False
    if isinstance(value, BaseModel):
        if declared and type(value) not in declared:
            return True
        return _holds_subclass(value, depth)
    if isinstance(value, Mapping):
        return any(_held_subclass(item, declared, depth + 1) for item in value.values())
    if isinstance(value, list | tuple):
        return any(_held_subclass(item, declared, depth + 1) for item in value)
    return False


def _named_models(annotation: Any, out: set[type]) -> set[type]:
    """The model classes ``annotation`` names, at any depth (in Optional, unions, lists,
    dicts, Annotated, a generic model's parameters)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        out.add(annotation)
    for arg in typing.get_args(annotation):
        if not isinstance(arg, str | int | float | bool | bytes) and arg is not None:
            _named_models(arg, out)
    return out


def _ordered_sets(python: Any, dumped: Any, depth: int, name: str) -> Any:
    """``dumped`` (a model's JSON-mode dump) with each list that pydantic made of a set or a
    frozenset (found at the same place in its Python-mode dump) in one order: JSON mode
    writes a set in its iteration order, which follows the per-process string hash, so the
    same request would get another fingerprint in another worker. Strings are sorted as
    strings and numbers as numbers (the order of a set of small ints, and of a serializer
    that returns ``sorted(...)``), anything else by its canonical JSON. A set a serializer
    turned into something other than a list is left as it made it. A set holding a set (a
    frozenset of frozensets) is refused: its items' own order cannot be found (the two dumps
    iterate different copies), and sorting them as lists would confuse them with tuples."""
    if depth > _MAX_DEPTH:
        return dumped
    if isinstance(python, set | frozenset):
        if isinstance(dumped, list) and len(dumped) == len(python):
            if any(type(item) is not str and _holds_set(item, depth + 1) for item in python):
                raise FingerprintError(
                    f"{name} holds a set of sets, which has no canonical JSON form; "
                    "use a set of sorted tuples"
                )
            return sorted(dumped, key=_set_order(dumped))
        return dumped
    if isinstance(python, dict) and isinstance(dumped, dict):
        out = dict(dumped)
        for key, item in python.items():
            if isinstance(key, str) and key in out:
                out[key] = _ordered_sets(item, out[key], depth + 1, name)
            elif type(key) is int and str(key) in out:
                out[str(key)] = _ordered_sets(item, out[str(key)], depth + 1, name)
            elif not isinstance(key, str):
                return _ordered_by_position(python, dumped, depth, name)
        return out
    if isinstance(python, list | tuple) and isinstance(dumped, list) and len(python) == len(dumped):
        return [_ordered_sets(a, b, depth + 1, name) for a, b in zip(python, dumped, strict=True)]
    return dumped


def _ordered_by_position(
    python: dict[Any, Any], dumped: dict[str, Any], depth: int, name: str
) -> Any:
    """A dict whose keys JSON mode rewrites (an Enum, a UUID, a bool, a datetime): both
    dumps iterate the same dict, so its items pair up in order. When JSON mode merged two
    keys into one (``1`` and ``"1"``), a set under them cannot be placed: refused."""
    if len(python) == len(dumped):
        out = dict(dumped)
        for (_, item), key in zip(python.items(), dumped, strict=True):
            out[key] = _ordered_sets(item, out[key], depth + 1, name)
        return out
    if _holds_set(python, depth):
        raise FingerprintError(
            f"{name} holds a set under a dict key its JSON form merges with another key, "
            "which has no canonical JSON form; use distinct string keys"
        )
    return dumped


def _holds_set(value: Any, depth: int) -> bool:
    """Whether a Python-mode dump holds a set or a frozenset (at any depth the fingerprint
    accepts; deeper is refused by the walk that follows)."""
    if isinstance(value, set | frozenset):
        return True
    if depth > _MAX_DEPTH:
        return False
    if isinstance(value, dict):
        return any(_holds_set(item, depth + 1) for item in value.values())
    if isinstance(value, list | tuple):
        return any(_holds_set(item, depth + 1) for item in value)
    return False


def _set_order(items: list[Any]) -> Any:
    if all(type(item) is str for item in items):
        return None
    if all(type(item) in (int, float) for item in items):
        return None
    return _canonical_key


def _canonical_key(item: Any) -> bytes:
    try:
        return rfc8785.dumps(item)
    except (ValueError, TypeError):  # NaN and the like: refused by the walk after
        return repr(item).encode("utf-8", "backslashreplace")


def _dataclass_json(value: Any) -> dict[str, Any]:
    """A dataclass instance as an object of its fields, each converted as in a request; a
    value that is no JSON type (a datetime, a UUID, an enum...), in a field or in a list,
    tuple or dict in it, is dumped as pydantic dumps it in JSON mode, as a pydantic model's
    field of that type is. Sets stay refused: their order differs between processes."""
    name = type(value).__name__
    return {
        f.name: _field_json(getattr(value, f.name), f"{name}.{f.name}", 0)
        for f in dataclasses.fields(value)
    }


def _field_json(item: Any, where: str, depth: int) -> Any:
    """``item`` with each value in it that is no JSON type (nor a dataclass, nor a model,
    converted by the walk) dumped by pydantic in JSON mode."""
    if isinstance(item, _JSON_TYPES) or dataclasses.is_dataclass(item):
        if depth > _MAX_DEPTH:  # the walk refuses it
            return item
        if isinstance(item, Mapping):
            return {key: _field_json(v, where, depth + 1) for key, v in item.items()}
        if isinstance(item, list | tuple):
            return [_field_json(v, where, depth + 1) for v in item]
        return item
    try:
        return pydantic_core.to_jsonable_python(item, bytes_mode="base64")
    except pydantic_core.PydanticSerializationError as exc:
        raise FingerprintError(f"{where} has no canonical JSON form: {exc}") from exc


def canonical_json(value: Any) -> bytes:
    """Return the RFC 8785 canonical JSON bytes of ``value``.

    Pydantic models are dumped with ``mode="json"`` first, and dataclass instances the
    same way (pydantic's JSON mode, field by field); bytes become base64 strings.
    Raises :class:`FingerprintError` for NaN, infinities, sets and unknown objects.
    """
    return _canonical(value, 0)


def _canonical(value: Any, depth: int) -> bytes:
    """:func:`canonical_json` of ``value`` found at ``depth`` in the value fingerprinted (the
    depth limit counts from there)."""
    walk = _Walk()
    converted = _to_json_value(value, walk, depth)
    if walk.plain:
        text = _encode_plain(converted)
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: let the reference encoder say so
            pass
    try:
        return rfc8785.dumps(converted)
    # ValueError: an integer past Python's int-to-str digit limit (4300 by default).
    except (rfc8785.CanonicalizationError, ValueError) as exc:
        raise FingerprintError(f"request has no canonical JSON form: {exc}") from exc


def fingerprint(value: Any) -> str:
    """Return the SHA-256 hex digest of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_json(value)).hexdigest()


def call_fingerprint(function: str) -> Callable[[Any], str]:
    """``lambda request: fingerprint({"function": function, "request": request})``, the
    fingerprint of a decorated function's call, with what never changes written once. The
    canonical JSON of that object is ``{"function":<function>,"request":<request>}`` (its two
    keys in order, each value in its own canonical form), so only the request is walked and
    encoded on each call, from the depth it has in the object: the same bytes, the same
    errors (a test holds the two equal)."""
    try:
        head = b'{"function":' + canonical_json(function) + b',"request":'
    except FingerprintError:  # every call raises it, as the whole object's fingerprint would
        return lambda request: fingerprint({"function": function, "request": request})

    def of(request: Any) -> str:
        return hashlib.sha256(head + _canonical(request, 1) + b"}").hexdigest()

    return of
