"""The decorator's own binding of a call's arguments binds what inspect binds.

``Signature.identify`` binds each call's arguments without inspect when the function takes
no ``*args`` / ``**kwargs`` (``_Binder``); a call it does not bind plainly is bound by
inspect, which raises what a call raises. Both must give the same arguments, in the same
order, with the same defaults, and refuse the same calls: the operation id and the request
fingerprint are made of them."""

from __future__ import annotations

import inspect
from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from settle.attempt import Attempt
from settle.decorator._signature import _Binder

P = inspect.Parameter
NAMES = ["a", "b", "c", "d", "e"]
VALUES = st.sampled_from([0, 1, "x", None, Attempt.INJECTED])
KINDS = st.sampled_from([P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY])


@st.composite
def signatures(draw: st.DrawFn) -> inspect.Signature:
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=5))
    kinds = sorted(draw(st.lists(KINDS, min_size=len(names), max_size=len(names))))
    params = [
        P(name, kind, default=draw(st.one_of(st.just(P.empty), VALUES)))
        for name, kind in zip(names, kinds, strict=True)
    ]
    try:  # a positional parameter with no default after one with a default is no signature
        return inspect.Signature(params)
    except ValueError:
        assume(False)
        raise


def _inspects(
    signature: inspect.Signature, attempt: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any] | None:
    """What ``Signature._bind`` binds with inspect (None where it refuses the call)."""
    try:
        bound = signature.bind_partial(*args, **kwargs)
    except TypeError:
        return None
    if attempt is not None and bound.arguments.get(attempt, Attempt.INJECTED) is not (
        Attempt.INJECTED
    ):
        return None
    for param in signature.parameters.values():
        if param.default is P.empty and param.name != attempt and param.name not in bound.arguments:
            return None
    bound.apply_defaults()
    return dict(bound.arguments)


@given(
    signature=signatures(),
    attempt=st.one_of(st.none(), st.sampled_from(NAMES)),
    args=st.lists(VALUES, max_size=6).map(tuple),
    kwargs=st.dictionaries(st.sampled_from([*NAMES, "zz"]), VALUES, max_size=6),
)
def test_the_binder_binds_what_inspect_binds(
    signature: inspect.Signature,
    attempt: str | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    attempt = attempt if attempt in signature.parameters else None
    binder = _Binder.of(signature, attempt)
    assert binder is not None
    bound = binder(args, kwargs)
    expected = _inspects(signature, attempt, args, kwargs)
    assert bound == expected
    if bound is not None and expected is not None:
        assert list(bound) == list(expected)  # the same order too


def test_a_function_with_star_args_or_star_kwargs_is_bound_by_inspect() -> None:
    def star(a: int, *rest: int) -> None: ...
    def double_star(a: int, **rest: int) -> None: ...

    assert _Binder.of(inspect.signature(star), None) is None
    assert _Binder.of(inspect.signature(double_star), None) is None
