"""Decorator options that can only fail are refused when the function is decorated, and
a ``terminal`` given as any iterable is kept whole.

A key template naming no parameter (``{y}``), a positional field (``{0}``), an empty
template, or a principal str no record can hold (empty, a line break, over 1024 characters)
was accepted and then failed every call. ``terminal`` given as a generator was
consumed by its own check and kept empty: the function's terminal error was then taken for
an uncertain outcome, retried, and left the operation provisional instead of failed.
"""

from __future__ import annotations

import dataclasses

import pytest
import tenacity

from settle import Settler
from settle.attempt import Attempt
from settle.errors import InvalidInput, OperationFailed
from settle.models import State


@pytest.mark.parametrize("principal", ["", "tenant\na", "x" * 1025])
def test_a_principal_no_call_can_use_is_refused_when_decorating(
    settler: Settler, principal: str
) -> None:
    with pytest.raises(InvalidInput, match="principal"):

        @settler.operation(key="charge:{order_id}", principal=principal)
        def charge(order_id: str) -> str:
            return order_id


@pytest.mark.parametrize("key", ["charge:{order}", "charge:{0}", "charge:{}", ""])
def test_a_key_template_that_fails_every_call_is_refused_when_decorating(
    settler: Settler, key: str
) -> None:
    with pytest.raises(InvalidInput, match="key template"):

        @settler.operation(key=key, principal="tenant:a")
        def charge(order_id: str) -> str:
            return order_id


class Declined(Exception):
    pass


@dataclasses.dataclass
class Order:
    order_id: str


def test_terminal_given_as_a_generator_stores_the_failure(settler: Settler) -> None:
    calls = []

    @settler.operation(
        key="charge:{order_id}",
        principal="tenant:a",
        terminal=(t for t in [Declined]),
        retry=tenacity.Retrying(stop=tenacity.stop_after_attempt(3), reraise=True),
    )
    def charge(order_id: str) -> str:
        calls.append(order_id)
        raise Declined("card declined")

    with pytest.raises(OperationFailed):
        charge("o-1")
    assert calls == ["o-1"]
    record = settler.get("charge:o-1")
    assert record is not None
    assert record.state is State.FAILED


def test_terminal_that_is_not_iterable_is_invalid_input(settler: Settler) -> None:
    with pytest.raises(InvalidInput, match="terminal"):

        @settler.operation(key="charge:{order_id}", principal="tenant:a", terminal=None)  # type: ignore[arg-type]
        def charge(order_id: str) -> str:
            return order_id


def test_a_key_template_indexing_star_args_still_works(settler: Settler) -> None:
    """``*args`` is bound by its name: ``{args[0]}`` / ``{items[0].order_id}`` formatted the
    key before the decoration-time template check, which must not refuse them."""

    @settler.operation(key="charge:{args[0]}", principal="tenant:a")
    def charge(*args: str) -> str:
        return "ch_" + args[0]

    @settler.operation(key="refund:{orders[0].order_id}", principal="tenant:a")
    def refund(*orders: Order) -> str:
        return "rf_" + orders[0].order_id

    assert charge("o-1") == "ch_o-1"
    assert refund(Order("o-2")) == "rf_o-2"
    for operation_id in ("charge:o-1", "refund:o-2"):
        record = settler.get(operation_id)
        assert record is not None
        assert record.state is State.COMPLETED


def test_a_key_template_over_star_star_kwargs_names_them_by_kwargs(settler: Settler) -> None:
    """A name passed through ``**kwargs`` is bound inside ``kwargs``: ``{order_id}`` failed
    every call (KeyError) and is refused when decorating; ``{kwargs[order_id]}`` works."""
    with pytest.raises(InvalidInput, match="key template"):

        @settler.operation(key="charge:{order_id}", principal="tenant:a")
        def charge(**kwargs: str) -> str:
            return kwargs["order_id"]

    @settler.operation(key="charge:{kwargs[order_id]}", principal="tenant:a")
    def charge_by_kwargs(**kwargs: str) -> str:
        return "ch_" + kwargs["order_id"]

    assert charge_by_kwargs(order_id="o-3") == "ch_o-3"
    record = settler.get("charge:o-3")
    assert record is not None
    assert record.state is State.COMPLETED


def test_a_key_template_naming_the_attempt_parameter_is_refused(settler: Settler) -> None:
    """The ``Attempt`` parameter is no argument of the call: a template naming it would give
    every call the placeholder's one id (``job:0``), so it is refused when the function is
    decorated (it was accepted there and refused at every call), as every template that
    fails every call is; nothing runs."""
    runs: list[int] = []

    def job(n: int, attempt: Attempt = Attempt.INJECTED) -> int:
        runs.append(n)
        return n

    for key in ("job:{attempt.number}", "job:{attempt}", "job:{n}:{attempt.number}"):
        with pytest.raises(InvalidInput, match="names the Attempt parameter"):
            settler.operation(key=key, principal="tenant:a")(job)
    assert runs == []
