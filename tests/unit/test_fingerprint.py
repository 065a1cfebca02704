"""Fingerprints: canonical, stable, and strict about what has no canonical form."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import math
import os
import subprocess
import sys
from collections.abc import Callable
from decimal import Decimal

import pytest
import rfc8785
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from settle import FingerprintError, fingerprint
from settle.fingerprint import call_fingerprint, canonical_json


class Charge(BaseModel):
    amount: int
    currency: str
    metadata: dict[str, str] = {}


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


def test_known_vector() -> None:
    # RFC 8785: keys sorted by UTF-16 code units, no whitespace, shortest number form.
    assert canonical_json({"b": [1.0, "x"], "a": None}) == b'{"a":null,"b":[1,"x"]}'
    assert fingerprint({"b": 1, "a": 2}) == hashlib.sha256(b'{"a":2,"b":1}').hexdigest()


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_dict_order_does_not_matter(value: dict[str, object]) -> None:
    reordered = dict(reversed(list(value.items())))
    assert fingerprint(value) == fingerprint(reordered)


def test_different_requests_differ() -> None:
    assert fingerprint({"amount": 100}) != fingerprint({"amount": 101})
    assert fingerprint({"amount": 100}) != fingerprint({"amount": "100"})
    assert fingerprint([1, 2]) != fingerprint([2, 1])


def test_pydantic_models_fingerprint_as_their_json_dump() -> None:
    charge = Charge(amount=100, currency="EUR", metadata={"z": "1", "a": "2"})
    assert fingerprint(charge) == fingerprint(
        {"amount": 100, "currency": "EUR", "metadata": {"a": "2", "z": "1"}}
    )


def test_bytes_are_base64_and_tuples_are_lists() -> None:
    assert canonical_json(b"\x00\xff") == b'"AP8="'
    assert fingerprint((1, 2)) == fingerprint([1, 2])


@pytest.mark.parametrize(
    "value",
    [
        math.nan,
        math.inf,
        -math.inf,
        {1, 2},
        frozenset(),
        object(),
        Decimal("1.5"),
        {1: "int key"},
        2**60,
        {"nested": [{"x": math.nan}]},
    ],
)
def test_values_without_canonical_json_raise(value: object) -> None:
    with pytest.raises(FingerprintError):
        fingerprint(value)


def test_stable_across_processes_and_hash_seeds() -> None:
    code = (
        "from settle import fingerprint;"
        "print(fingerprint({'z': [1, {'b': 2.5, 'a': 'é'}], 'a': {'y': None, 'x': True}}))"
    )
    outputs = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(out.stdout.strip())
    assert outputs == {fingerprint({"a": {"x": True, "y": None}, "z": [1, {"a": "é", "b": 2.5}]})}


plain_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.text(st.characters(blacklist_categories=("Cs",))),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.text(st.characters(max_codepoint=127), max_size=6), children, max_size=4
        )
    ),
    max_leaves=25,
)


@given(plain_values)
def test_the_fast_path_writes_exactly_what_the_reference_encoder_writes(value: object) -> None:
    assert canonical_json(value) == rfc8785.dumps(value)


@given(json_values)
def test_every_json_value_matches_the_reference_encoder(value: object) -> None:
    assert canonical_json(value) == rfc8785.dumps(value)


def test_non_ascii_keys_and_floats_take_the_reference_path() -> None:
    # U+E000 sorts after U+1F600 by code point but before it by UTF-16 code unit (JCS).
    value = {"\U0001f600": 1, "\ue000": 2, "x": 1.5, "big": 2**53 - 1}
    assert canonical_json(value) == (
        '{"big":9007199254740991,"x":1.5,"\U0001f600":1,"\ue000":2}'.encode()
    )


@dataclasses.dataclass
class Order:
    order_id: str
    amount: int
    when: datetime.date
    tags: tuple[str, ...] = ()


def _nested(depth: int) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


def _outcome(make: Callable[[], str]) -> tuple[str, str]:
    """What a fingerprint gives: its digest, or the error it raises and its message."""
    try:
        return ("digest", make())
    except FingerprintError as exc:
        return ("error", str(exc))


odd_values = st.one_of(
    st.floats(),  # NaN and infinities too
    st.integers(),  # past 2**53
    st.binary(max_size=8),
    st.text(max_size=4),  # lone surrogates too
    st.builds(Charge, amount=st.integers(0, 10**6), currency=st.text(max_size=3)),
    st.builds(
        Order,
        order_id=st.text(max_size=4),
        amount=st.integers(),
        when=st.dates(),
        tags=st.lists(st.text(max_size=2), max_size=2).map(tuple),
    ),
    st.frozensets(st.integers(), max_size=2),
    st.sampled_from([_nested(62), _nested(63), _nested(64), Decimal("1.5"), {1: "int key"}]),
)
requests = st.recursive(
    json_values | odd_values,
    lambda children: (
        st.lists(children, max_size=3).map(lambda items: items if len(items) != 2 else tuple(items))
        | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=12,
)


@given(name=st.text(min_size=1, max_size=12), request=requests)
def test_a_calls_fingerprint_is_the_fingerprint_of_its_function_and_request(
    name: str, request: object
) -> None:
    """The decorator fingerprints ``{"function": name, "request": request}`` with the name's
    part written once: the same digest, or the same error, for every request."""
    framed = call_fingerprint(name)
    assert _outcome(lambda: framed(request)) == _outcome(
        lambda: fingerprint({"function": name, "request": request})
    )


def test_the_depth_limit_counts_from_the_whole_object() -> None:
    # {"function", "request"} is one level: a request nested 63 deep is the limit.
    assert call_fingerprint("f")(_nested(63)) == fingerprint(
        {"function": "f", "request": _nested(63)}
    )
    with pytest.raises(FingerprintError, match="deeper than 64"):
        call_fingerprint("f")(_nested(64))


def test_a_name_with_no_canonical_form_refuses_each_call_as_before() -> None:
    """A name that has no canonical JSON (a lone surrogate: hypothesis's text never draws
    one) is refused on each call, with fingerprint()'s own error, not when the function is
    decorated: a function decorated before keeps decorating."""
    framed = call_fingerprint("f\ud800")
    for request in ({"a": 1}, None, [1.5]):
        with pytest.raises(FingerprintError) as error:
            framed(request)
        with pytest.raises(FingerprintError) as whole:
            fingerprint({"function": "f\ud800", "request": request})
        assert str(error.value) == str(whole.value)
