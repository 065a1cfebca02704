"""What ``@settler.operation`` cannot settle is refused when it is decorated, with a typed
error that says what to do, and methods, static methods and class methods work.

A generator function declared ``-> Any`` was accepted: its call returned an unstarted
generator, which the settlement then consumed while storing it (the body's effects ran
there, outside the attempt), and the caller got a spent generator. An async generator
given to ``AsyncSettler.operation`` was told to use ``Settler.operation`` instead. A
``functools.partial`` or a callable object raised ``AttributeError`` and a classmethod
object ``TypeError`` from inside settle.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from settle import AsyncSettler, Settler
from settle.errors import InvalidInput


def test_a_generator_function_is_refused(settler: Settler) -> None:
    ran: list[str] = []

    def charges(order: str) -> Any:
        ran.append(order)
        yield order

    with pytest.raises(InvalidInput, match="generator function"):
        settler.operation(key="charge:{order}", principal="tenant:a")(charges)
    assert ran == []


def test_an_async_generator_function_is_refused_by_both(
    settler: Settler, async_settler: AsyncSettler
) -> None:
    async def charges(order: str) -> Any:
        yield order

    async def typed(order: str) -> AsyncIterator[str]:
        yield order

    for operation in (settler.operation, async_settler.operation):
        for fn in (charges, typed):
            with pytest.raises(InvalidInput, match="async generator function") as info:
                operation(key="charge:{order}", principal="tenant:a")(fn)
            assert "Settler.operation" not in str(info.value)


def test_a_typed_generator_is_refused_as_a_generator(settler: Settler) -> None:
    def charges(order: str) -> Iterator[str]:
        yield order

    with pytest.raises(InvalidInput, match="generator function"):
        settler.operation(key="charge:{order}", principal="tenant:a")(charges)


def _charge(account: str, order: str) -> str:
    return f"{account}:{order}"


async def _async_charge(account: str, order: str) -> str:
    return f"{account}:{order}"


def test_a_partial_is_refused_and_named(settler: Settler, async_settler: AsyncSettler) -> None:
    # Bound by position, the account would be in no request: a partial for another
    # account would replay this one's result under the same key.
    with pytest.raises(InvalidInput, match=r"functools\.partial\(_charge, \.\.\.\)"):
        settler.operation(key="charge:{order}", principal="tenant:a")(
            functools.partial(_charge, "acct-1")
        )
    with pytest.raises(InvalidInput, match=r"functools\.partial\(_async_charge, \.\.\.\)"):
        async_settler.operation(key="charge:{order}", principal="tenant:a")(
            functools.partial(_async_charge, "acct-1")
        )


def test_a_callable_object_is_refused(settler: Settler) -> None:
    class Charger:
        def __call__(self, order: str) -> str:
            return order

    with pytest.raises(InvalidInput, match="Charger objects"):
        settler.operation(key="charge:{order}", principal="tenant:a")(Charger())


def test_an_object_that_cannot_be_called_is_refused(settler: Settler) -> None:
    """Refused by what it is, not by its name: an object with a ``__qualname__`` that
    cannot be called is no function either."""
    named = SimpleNamespace(__qualname__="charge")
    with pytest.raises(InvalidInput, match="not SimpleNamespace objects"):
        settler.operation(key="charge:{order}", principal="tenant:a")(named)


def test_a_classmethod_object_is_refused_with_the_order_to_use(settler: Settler) -> None:
    with pytest.raises(InvalidInput, match="put @classmethod above"):

        class Payments:
            @settler.operation(key="charge:{order}", principal="tenant:a")  # type: ignore[arg-type]
            @classmethod
            def charge(cls, order: str) -> str:
                return order


def test_methods_static_and_class_methods_settle_once(settler: Settler) -> None:
    runs: list[str] = []

    class Payments:
        rate = 2

        @settler.operation(key="m:{order}", principal="tenant:a")
        def method(self, order: str) -> int:
            runs.append("method")
            return self.rate

        @staticmethod
        @settler.operation(key="s:{order}", principal="tenant:a")
        def static(order: str) -> int:
            runs.append("static")
            return 3

        @classmethod
        @settler.operation(key="c:{order}", principal="tenant:a")
        def klass(cls, order: str) -> int:
            runs.append("klass")
            return cls.rate * 2

    payments = Payments()
    for _ in range(2):
        assert payments.method("o-1") == 2
        assert Payments.static("o-1") == payments.static("o-1") == 3
        assert Payments.klass("o-1") == payments.klass("o-1") == 4
    assert runs == ["method", "static", "klass"]
