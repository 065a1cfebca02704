"""The namespace rule said in words accepts exactly what the pattern it replaced accepted.

``SettleConfig.namespace`` was ``Field(pattern=r"^[A-Za-z0-9_.\\-]{1,64}$")`` (pydantic's
regex engine, its refusal naming the regex); it is checked by a validator now whose refusal
says what a namespace may hold. A namespace is part of every key name: a value taken now
that was refused before (or the other way round) would open, or lock out, keys.
"""

from __future__ import annotations

from typing import Annotated

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import Field, TypeAdapter, ValidationError

from settle.config import NAMESPACE_RULE, SettleConfig
from settle.errors import InvalidInput

_BEFORE = TypeAdapter(Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")])
_NEAR = st.sampled_from("aZ09_.-:/ {}\n\r\t\x00\u00e9\u0660\uff10\u212a$^\\")


def _taken_before(namespace: str) -> bool:
    try:
        _BEFORE.validate_python(namespace)
    except ValidationError:
        return False
    return True


def _refusal_now(namespace: str) -> str | None:
    try:
        SettleConfig(namespace=namespace)
    except InvalidInput as exc:
        return str(exc)
    return None


@settings(max_examples=400, deadline=None)
@given(st.text(_NEAR, max_size=70) | st.text(max_size=70))
@example("a" * 64)
@example("a" * 65)
@example("")
@example("shop\n")
@example("\u0660")  # a digit outside ASCII
@example("\u212a")  # the Kelvin sign, which folds to K
def test_the_same_namespaces_are_taken_as_before(namespace: str) -> None:
    refusal = _refusal_now(namespace)
    assert (refusal is None) is _taken_before(namespace)
    assert refusal is None or f"namespace: must be {NAMESPACE_RULE}" in refusal


@pytest.mark.parametrize("namespace", ["default", "a", "A.b-c_9", "x" * 64])
def test_a_namespace_of_the_rule_is_taken(namespace: str) -> None:
    assert SettleConfig(namespace=namespace).namespace == namespace
