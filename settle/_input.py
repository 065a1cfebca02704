"""What every part refuses in a user's input: control characters in names (:func:`has_control`),
and, in pydantic models a user builds (settings, a provider's contract), bad values raised
as settle's typed error, not pydantic's. Also the one way a name is written into a key made
of parts (:func:`key_part`).

A model that derives from :class:`InputModel` raises :class:`~settle.errors.InvalidInput`
(a ``SettleError`` and a ``ValueError``, as pydantic's ``ValidationError`` is) naming each
bad field, from its constructor and from ``model_validate`` / ``model_validate_json``; the
``ValidationError`` is its ``__cause__``.
"""

from __future__ import annotations

import inspect
import types
import typing
import unicodedata
from collections.abc import Mapping
from typing import Any, NoReturn, Self

from pydantic import BaseModel, ValidationError, ValidationInfo, field_validator

from settle.errors import InvalidInput

__all__ = [
    "InputModel",
    "awaited",
    "has_control",
    "is_decimal",
    "is_utf8",
    "key_part",
    "refuse_unawaited",
]

#: Refused in every name and text settle stores and shows (operation ids, principals,
#: reasons, notes; cursor streams and event ids; progress ids and consumer names): control
#: characters (C0, C1, DEL), format characters (bidi overrides, zero-width joiners),
#: surrogates, and the line and paragraph separators U+2028 / U+2029 (the other Unicode
#: line breaks, CR, LF, VT, FF and NEL, are control characters already).
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def is_utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8: no lone surrogate, which is how Python keeps bytes
    that were not UTF-8 text (argv, the environment: ``surrogateescape``)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_decimal(text: str) -> bool:
    """Whether ``text`` is one or more ASCII digits: what ``int()`` reads as the number the
    text shows. ``str.isdigit()`` alone is true of superscripts (``int()`` refuses them) and
    of every script's digits (``int()`` reads them: a number the text does not show)."""
    return text.isascii() and text.isdigit()


def has_control(text: str) -> bool:
    """Whether ``text`` holds a character that :data:`_REFUSED_CATEGORIES` refuses."""
    if text.isascii():  # the common case, in C: printable ASCII has no control character
        return not text.isprintable()
    return any(unicodedata.category(ch) in _REFUSED_CATEGORIES for ch in text)


def refuse_unawaited(result: object, what: str, shell: str, operation_id: str) -> None:
    """Raise :class:`InvalidInput` when the user's callback (a cursor's ``handle_event``, a
    delivery's effect) returned an awaitable: an ``async def`` given to a sync consumer (or
    an async one that returned a coroutine it did not await). Its work never ran, and
    recording it as done would skip it for good; the coroutine is closed, and nothing is
    recorded for it."""
    if not inspect.isawaitable(result):
        return
    if inspect.iscoroutine(result):
        result.close()
    raise InvalidInput(
        f"{what} returned an awaitable, which was never awaited: it did not run, and "
        f"nothing was recorded for it. An async {what} needs {shell}",
        operation_id=operation_id,
    )


async def awaited(result: Any) -> Any:
    """What the user's callback gave an async consumer (a cursor's ``handle_event``, a
    delivery's effect), awaited when it is awaitable. A plain function's work is done when
    it returns: its value stands as it is, where awaiting it would raise ``TypeError``
    after the work, and a delivery's effect would be taken as failed, released and run
    again on every redelivery."""
    if inspect.isawaitable(result):
        return await result
    return result


def key_part(name: str) -> str:
    """``name`` as a part of an idempotency key whose parts a ``:`` separates (a cursor's
    ``EventContext.key``, delivery progress's ``EffectContext.idempotency_key``): a ``%``
    is written ``%25`` and a ``:`` ``%3A``, so the part holds no ``:`` and two names never
    give the same key (``billing:eu`` + ``order-1`` and ``billing`` + ``eu:order-1`` did).
    A name with neither is unchanged, and so are the keys made of it."""
    return name.replace("%", "%25").replace(":", "%3A")


def _invalid(model: type[BaseModel], exc: ValidationError) -> InvalidInput:
    """pydantic's verdict as settle's typed error: one clause per bad field."""
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors()
    )
    return InvalidInput(f"invalid {model.__name__}: {problems}")


def _raised_by_init(exc: ValidationError) -> InvalidInput | None:
    """The :class:`InvalidInput` our ``__init__`` raised, when ``exc`` only wraps it.

    pydantic builds a model whose class defines ``__init__`` through that ``__init__``, from
    ``model_validate`` too: the ``InvalidInput`` it raised (a ``ValueError``) came back as a
    ``ValidationError`` of the whole model, and was wrapped again (``invalid X: settings:
    Value error, invalid X: field: ...``, the field-by-field ``ValidationError`` lost)."""
    errors = exc.errors()
    if len(errors) == 1 and not errors[0]["loc"]:
        inner = errors[0].get("ctx", {}).get("error")
        if isinstance(inner, InvalidInput):
            return inner
    return None


def _reraise(model: type[BaseModel], exc: ValidationError) -> NoReturn:
    inner = _raised_by_init(exc)
    if inner is not None:
        raise inner from inner.__cause__
    raise _invalid(model, exc) from exc


def _shown(value: object) -> str:
    """``value`` in an error: its type, and a short repr (a setting may hold a secret, but
    one given to a bool field is a mistake, and its first characters help find it)."""
    text = repr(value)
    return f"{type(value).__name__} {text[:20] + '...' if len(text) > 20 else text}"


def _takes_bool(annotation: Any) -> bool:
    """Whether a field of this annotation holds a bool (``bool``, ``bool | None``)."""
    if annotation is bool:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_takes_bool(arg) for arg in typing.get_args(annotation))
    return False


#: What a bool setting takes as text (``model_validate_strings``, case aside): pydantic's
#: lax mode also reads ``"yes"``, ``"on"``, ``"1"`` and ``"y"``, so a typo or a value
#: meant for another setting became a promise.
_BOOL_TEXT = {"true": True, "false": False}


class InputModel(BaseModel):
    """A model built from user input: a bad value is :class:`~settle.errors.InvalidInput`.

    pydantic's lax mode reads ``"16"`` as 16 (settings from the environment are text), but
    also ``True`` as 1: a bool is refused where the field is no bool (``shards=True`` was one
    shard, ``lease=True`` a one-second lease). The other way round too: a bool field takes
    ``True`` or ``False`` only (JSON ``true`` / ``false``; the text ``"true"`` / ``"false"``
    from ``model_validate_strings``), where lax mode read ``"yes"``, ``1`` or ``1.0`` as True:
    a bool of a setting or a provider contract is a promise (``rotation_allowed``,
    ``allow_eviction``), never guessed from another type."""

    @field_validator("*", mode="before")
    @classmethod
    def _bool_only_for_a_bool(cls, value: Any, info: ValidationInfo) -> Any:
        name = info.field_name
        if not name or value is None:  # None: pydantic's own check, whether None is allowed
            return value
        takes_bool = _takes_bool(cls.model_fields[name].annotation)
        if isinstance(value, bool):
            if not takes_bool:
                raise ValueError(f"must not be a bool (got {value})")
            return value
        if takes_bool:
            raise ValueError(f"must be True or False, got {_shown(value)}")
        return value

    @classmethod
    def _bool_text(cls, name: object, value: object) -> object:
        """``value`` of field ``name`` as text: ``"true"`` / ``"false"`` (case aside) as the
        bool for a bool field, any other value as it is (a bool field refuses it)."""
        field = cls.model_fields.get(name) if isinstance(name, str) else None
        if field is not None and isinstance(value, str) and _takes_bool(field.annotation):
            return _BOOL_TEXT.get(value.lower(), value)
        return value

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _invalid(type(self), exc) from exc

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as exc:
            _reraise(cls, exc)

    @classmethod
    def model_validate_json(cls, json_data: Any, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate_json(json_data, *args, **kwargs)
        except ValidationError as exc:
            _reraise(cls, exc)

    @classmethod
    def model_validate_strings(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        if isinstance(obj, Mapping):  # a bool field's text, read here and nowhere else
            obj = {k: cls._bool_text(k, v) for k, v in obj.items()}
        try:
            return super().model_validate_strings(obj, *args, **kwargs)
        except ValidationError as exc:
            _reraise(cls, exc)
