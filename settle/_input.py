"""Pydantic models a user builds (settings, a provider's contract) refuse bad values with
settle's typed error, not pydantic's.

A model that derives from :class:`InputModel` raises :class:`~settle.errors.InvalidInput`
(a ``SettleError`` and a ``ValueError``, as pydantic's ``ValidationError`` is) naming each
bad field, from its constructor and from ``model_validate`` / ``model_validate_json``; the
``ValidationError`` is its ``__cause__``.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ValidationError

from settle.errors import InvalidInput

__all__ = ["InputModel"]


def _invalid(model: type[BaseModel], exc: ValidationError) -> InvalidInput:
    """pydantic's verdict as settle's typed error: one clause per bad field."""
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors()
    )
    return InvalidInput(f"invalid {model.__name__}: {problems}")


class InputModel(BaseModel):
    """A model built from user input: a bad value is :class:`~settle.errors.InvalidInput`."""

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
            raise _invalid(cls, exc) from exc

    @classmethod
    def model_validate_json(cls, json_data: Any, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate_json(json_data, *args, **kwargs)
        except ValidationError as exc:
            raise _invalid(cls, exc) from exc
