"""Two different functions under one identity never answer each other's calls (issue 16):
a lambda without ``name=`` and a second definition under a decorated function's
``module.qualname`` are refused when decorated, an explicit ``name=`` shares on purpose, and
the same code decorated again is allowed. A key field written as a memory address (a new
operation at every retry) is refused before anything is written; an ``async def on_replay``
(never awaited) is refused when decorated. On Redis and the in-memory model, sync and async.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import importlib.util
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from settle import AsyncSettler, Settler
from settle.decorator import _identity
from settle.errors import InvalidInput
from settle.models import OperationRecord
from settle.testing import AsyncMemorySettler, MemorySettler

P = "tenant:acme"


@pytest_asyncio.fixture(params=["redis", "memory"])
async def async_any(
    request: pytest.FixtureRequest, redis_url: str, namespace: str
) -> AsyncIterator[AsyncSettler]:
    if request.param == "redis":
        s = AsyncSettler.from_url(redis_url, namespace=namespace, shards=4)
    else:
        s = AsyncMemorySettler(namespace=f"memory-{uuid.uuid4().hex[:8]}")
    yield s
    await s.aclose()


# -- lambdas -------------------------------------------------------------------------------


def test_a_lambda_without_a_name_is_refused_when_decorated(any_settler: Settler) -> None:
    decorate = any_settler.operation(key="order:{n}", principal=P, result_type=str)
    with pytest.raises(InvalidInput, match=r"lambda.*name="):
        decorate(lambda n: f"refunded {n}")


def test_lambdas_given_their_own_names_never_answer_each_other(any_settler: Settler) -> None:
    refund = any_settler.operation(key="order:{n}", principal=P, result_type=str, name="refund")(
        lambda n: f"refunded {n}"
    )
    charge = any_settler.operation(key="charge:{n}", principal=P, result_type=str, name="charge")(
        lambda n: f"charged {n}"
    )
    assert refund(1) == "refunded 1"
    assert charge(1) == "charged 1"


# -- two definitions under one identity ----------------------------------------------------


def _two_definitions(settler: Settler, key: str, **options: Any) -> Callable[[str], Any]:
    """A factory whose two branches each define ``run``: one qualname, two definitions."""

    def make(kind: str) -> Any:
        if kind == "capture":

            @settler.operation(key=key, principal=P, **options)
            def run(x: int) -> str:
                return f"captured {x}"

        else:

            @settler.operation(key=key, principal=P, **options)
            def run(x: int) -> str:
                return f"voided {x}"

        return run

    return make


def test_a_second_definition_under_one_identity_is_refused_naming_both_sites(
    any_settler: Settler,
) -> None:
    make = _two_definitions(any_settler, "pay:{x}")
    capture = make("capture")
    with pytest.raises(InvalidInput, match=r"name=") as refused:
        make("void")
    assert refused.value.args[0].count(__file__) == 2  # both definitions' file:line
    assert capture(1) == "captured 1"  # the first is untouched
    assert capture(1) == "captured 1"


def test_a_definition_on_another_store_of_the_namespace_is_not_refused(
    redis_url: str,
) -> None:
    """Two stores never share a record, whatever their namespace: the second definition on
    another in-memory keyspace, or on Redis after the model (the README's two ``charge``
    examples in one session), is its own operation; on the first's keyspace it is refused."""
    namespace = f"place-{uuid.uuid4().hex[:8]}"
    first = MemorySettler(namespace=namespace)
    other = MemorySettler(namespace=namespace)
    shared = MemorySettler(namespace=namespace, keyspace=first._runner.keyspace)  # type: ignore[attr-defined]
    on_redis = Settler.from_url(redis_url, namespace=namespace, shards=4)
    try:
        capture = _two_definitions(first, "pay:{x}")("capture")
        for settler in (other, on_redis):
            assert _two_definitions(settler, "pay:{x}")("void")(1) == "voided 1"
        with pytest.raises(InvalidInput, match=r"name="):
            _two_definitions(shared, "pay:{x}")("void")  # the first's records
        assert capture(1) == "captured 1"
    finally:
        on_redis.close()


def test_a_redefined_class_is_refused_and_an_explicit_name_shares_or_separates(
    any_settler: Settler,
) -> None:
    ran: list[str] = []

    class Charges:
        @any_settler.operation(key="m:{x}", principal=P)
        def go(self, x: int) -> str:
            ran.append("charges")
            return "charges"

    first = Charges

    with pytest.raises(InvalidInput, match=r"Charges\.go"):

        class Charges:  # type: ignore[no-redef]  # a test, a plugin, a notebook cell
            @any_settler.operation(key="m:{x}", principal=P)
            def go(self, x: int) -> str:
                ran.append("refunds")
                return "refunds"

    class Refunds:  # its own name: its own operations
        @any_settler.operation(key="m:{x}", principal=P, name="refunds.go")
        def go(self, x: int) -> str:
            ran.append("refunds")
            return "refunds"

    assert first().go(1) == "charges"
    assert Refunds().go(2) == "refunds"
    assert ran == ["charges", "refunds"]


def test_the_same_code_decorated_again_is_allowed(any_settler: Settler) -> None:
    def make(kind: str) -> Any:
        @any_settler.operation(key=kind + ":{x}", principal=P)
        def run(x: int) -> str:
            return f"{kind} {x}"

        return run

    assert make("a")(1) == "a 1"
    assert make("b")(1) == "b 1"  # a factory called twice (per request, per test)
    shared = _two_definitions(any_settler, "same:{x}", name="payments.same")
    shared("capture")
    shared("void")  # an explicit name=: shared on purpose, never refused


def test_another_namespace_has_identities_of_its_own(any_settler: Settler) -> None:
    other = MemorySettler(namespace=f"other-{uuid.uuid4().hex[:8]}")
    make = _two_definitions(any_settler, "pay:{x}")
    make_other = _two_definitions(other, "pay:{x}")
    make("capture")
    assert make_other("void")(1) == "voided 1"


def _underscores(settler: Settler, key: Any, which: int) -> Any:
    """Three definitions of ``_`` (one qualname, three sites), decorated with ``key``."""
    if which == 0:

        @settler.operation(key=key, principal=P)
        def _(x: int) -> str:
            return f"0 {x}"

    elif which == 1:

        @settler.operation(key=key, principal=P)
        def _(x: int) -> str:
            return f"1 {x}"

    else:

        @settler.operation(key=key, principal=P)
        def _(x: int) -> str:
            return f"2 {x}"

    return _


def test_definitions_whose_keys_can_never_meet_may_share_an_identity(
    any_settler: Settler,
) -> None:
    """Functions all named ``_`` (singledispatch's ``register``, a registry) share
    ``module._``. Key templates whose fixed text before the first field differs (neither
    a prefix of the other) never make one id, so nothing of one is replayed to the other:
    such a program worked before and must still import. Keys that can meet are refused."""
    card = _underscores(any_settler, "card:{x}", 0)
    bank = _underscores(any_settler, "bank:{x}", 1)
    assert _underscores(any_settler, "wallet:{x}", 2)(1) == "2 1"
    assert card(1) == "0 1"
    assert bank(1) == "1 1"
    for meets in ("card:1{x}", "ca{x}", "{x}", lambda x: f"wallet:{x}", "bank:{x}"):
        with pytest.raises(InvalidInput, match=r"name="):
            _underscores(any_settler, meets, 2)  # "bank:{x}": that code again, bank's ids


def test_a_key_callable_can_make_any_id_and_escaped_braces_are_fixed_text(
    any_settler: Settler,
) -> None:
    assert _underscores(any_settler, "x{{1{x}", 0)(1) == "0 1"  # every id starts "x{1"
    assert _underscores(any_settler, "x{{2{x}", 1)(1) == "1 1"  # "x{2": never one of those
    callable_first = MemorySettler(namespace=f"callable-{uuid.uuid4().hex[:8]}")
    assert _underscores(callable_first, lambda x: f"y{x}", 0)(2) == "0 2"
    with pytest.raises(InvalidInput, match=r"name="):
        _underscores(callable_first, "z:{x}", 1)  # the callable's ids can be anything


def _logged(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A decorator below ``@settler.operation`` that keeps the name (functools.wraps)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


def test_definitions_under_a_wrapping_decorator_are_told_apart_by_the_wrapped_def(
    any_settler: Settler,
) -> None:
    """Every function a functools.wraps decorator wraps runs the one wrapper's code: the
    definition that counts is the wrapped one."""

    def make(kind: str) -> Any:
        if kind == "capture":

            @any_settler.operation(key="wrapped:{x}", principal=P)
            @_logged
            def run(x: int) -> str:
                return f"captured {x}"

        else:

            @any_settler.operation(key="wrapped:{x}", principal=P)
            @_logged
            def run(x: int) -> str:
                return f"voided {x}"

        return run

    capture = make("capture")
    assert make("capture")(1) == "captured 1"  # the same code again: allowed
    with pytest.raises(InvalidInput, match=r"name="):
        make("void")
    assert capture(1) == "captured 1"


def test_past_the_bound_the_oldest_identity_is_forgotten_never_the_newest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_identity, "_SITES_KEPT", 3)
    monkeypatch.setattr(_identity, "_sites", {})  # what the other tests decorated
    makers = [
        _two_definitions(MemorySettler(namespace=f"bound-{i}-{uuid.uuid4().hex[:8]}"), "b:{x}")
        for i in range(5)
    ]
    for make in makers:
        make("capture")
    assert len(_identity._sites) <= 3
    assert makers[0]("void")(1) == "voided 1"  # forgotten: unnoticed, never refused
    with pytest.raises(InvalidInput, match=r"name="):
        makers[-1]("void")


_PLUGIN = """\
import builtins
settler = builtins.SETTLE_TEST_SETTLER


@settler.operation(key="plugin:{x}", principal="tenant:acme")
def charge(x: int) -> str:
    return "{kind} " + str(x)
"""


def test_one_module_name_loaded_from_two_files_is_refused_at_the_same_line(
    any_settler: Settler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plugin module loaded from two directories under one name: its functions have one
    identity and one line, but two files."""
    monkeypatch.setattr(builtins, "SETTLE_TEST_SETTLER", any_settler, raising=False)
    module = f"plugin_{uuid.uuid4().hex[:8]}"

    def load(kind: str) -> Any:
        path = tmp_path / kind / f"{module}.py"
        path.parent.mkdir()
        path.write_text(_PLUGIN.replace("{kind}", kind))
        spec = importlib.util.spec_from_file_location(module, path)
        assert spec is not None
        assert spec.loader is not None
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        return loaded

    assert load("capture").charge(1) == "capture 1"
    with pytest.raises(InvalidInput, match=r"name="):
        load("void")


def test_what_one_identity_remembers_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A factory decorated per request with the same key adds nothing; one decorated with
    a key per kind adds up to a bound (the rest go unnoticed)."""
    monkeypatch.setattr(_identity, "_DEFINITIONS_KEPT", 2)
    monkeypatch.setattr(_identity, "_sites", {})
    settler = MemorySettler(namespace=f"kept-{uuid.uuid4().hex[:8]}")

    def make(kind: str) -> Any:
        @settler.operation(key=kind + ":{x}", principal=P)
        def run(x: int) -> str:
            return f"{kind} {x}"

        return run

    for _ in range(3):
        make("a")
    assert [len(d) for d in _identity._sites.values()] == [1]
    for kind in ("b", "c", "d"):
        make(kind)
    assert [len(d) for d in _identity._sites.values()] == [2]


def _two_runs() -> list[Callable[[int], str]]:
    """Two definitions of ``run``, undecorated: one qualname, two definition sites."""
    runs: list[Callable[[int], str]] = []
    for kind in ("a", "b"):
        if kind == "a":

            def run(x: int) -> str:
                return "a"

        else:

            def run(x: int) -> str:
                return "b"

        runs.append(run)
    return runs


def _race(decorate: Callable[[Callable[[int], str]], Any]) -> list[str]:
    """Two threads decorating the two definitions of ``run`` at once: what each got."""
    start = threading.Barrier(2)
    outcomes: list[str] = []

    def decorate_in_thread(fn: Callable[[int], str]) -> None:
        start.wait()
        try:
            decorate(fn)
        except InvalidInput:
            outcomes.append("refused")
        else:
            outcomes.append("decorated")

    threads = [threading.Thread(target=decorate_in_thread, args=(f,)) for f in _two_runs()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(outcomes)


def test_two_threads_decorating_two_definitions_at_once_one_is_refused() -> None:
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch often: a check-then-set would be seen
    try:
        for _ in range(200):
            settler = MemorySettler(namespace=f"race-{uuid.uuid4().hex[:8]}")
            decorate = settler.operation(key="r:{x}", principal=P)
            assert _race(decorate) == ["decorated", "refused"]
    finally:
        sys.setswitchinterval(interval)


@pytest.mark.asyncio
async def test_async_a_second_definition_is_refused(async_any: AsyncSettler) -> None:
    def make(kind: str) -> Any:
        if kind == "capture":

            @async_any.operation(key="pay:{x}", principal=P)
            async def run(x: int) -> str:
                return f"captured {x}"

        else:

            @async_any.operation(key="pay:{x}", principal=P)
            async def run(x: int) -> str:
                return f"voided {x}"

        return run

    capture = make("capture")
    again = make("capture")  # the same code again: allowed
    with pytest.raises(InvalidInput, match=r"name="):
        make("void")
    assert await capture(1) == "captured 1"
    assert await again(1) == "captured 1"


# -- a key field written as a memory address -------------------------------------------------


class Order:
    """No __str__ or __format__ of its own: its text is its address."""

    def __init__(self, oid: int) -> None:
        self.oid = oid


def _address() -> int:
    return 0


class Named(Order):
    def __str__(self) -> str:
        return f"order-{self.oid}"


def _charge(settler: Settler, ran: list[int]) -> Callable[[Order], int]:
    @settler.operation(key="charge:{order}", principal=P, fingerprint=lambda order: order.oid)
    def charge(order: Order) -> int:
        ran.append(order.oid)
        return order.oid

    return charge


def test_a_key_field_written_as_an_address_is_refused_before_anything_runs(
    any_settler: Settler,
) -> None:
    ran: list[int] = []
    charge = _charge(any_settler, ran)

    @any_settler.operation(key="charge:{order!r}", principal=P, fingerprint=lambda order: 0)
    def charge_repr(order: Order) -> int:
        ran.append(order.oid)
        return order.oid

    @any_settler.operation(key="hook:{hook}", principal=P, fingerprint=lambda hook: 0)
    def call(hook: Callable[[], int]) -> int:
        ran.append(0)
        return 0

    calls: list[Callable[[], int]] = [
        lambda: charge(Order(1)),
        lambda: charge_repr(Order(1)),
        lambda: call(_address),
    ]
    for bad in calls:
        with pytest.raises(InvalidInput, match=r"__str__ or __format__"):
            bad()
    with pytest.raises(InvalidInput, match=r"\{order\}"):
        charge(Order(1))
    with pytest.raises(InvalidInput, match=r"\{hook\}"):
        call(lambda: 0)
    assert ran == []


def test_a_key_field_with_its_own_text_or_an_attribute_keeps_working(
    any_settler: Settler,
) -> None:
    ran: list[int] = []
    charge = _charge(any_settler, ran)

    @any_settler.operation(key="c:{order.oid}", principal=P, fingerprint=lambda order: order.oid)
    def by_id(order: Order) -> int:
        ran.append(order.oid)
        return order.oid

    @any_settler.operation(key="s:{text}", principal=P)
    def text(text: str) -> str:
        return text

    assert charge(Named(1)) == 1
    assert charge(Named(1)) == 1  # a retry with an equal order built again: replayed
    assert by_id(Order(2)) == 2
    assert by_id(Order(2)) == 2
    assert ran == [1, 2]
    odd = "<x at 0x1f>"  # a str is the caller's own text
    assert text(odd) == odd


@dataclasses.dataclass
class Box:
    order: Order


def test_a_key_field_holding_values_written_as_addresses_is_refused(
    any_settler: Settler,
) -> None:
    """A list, a tuple or a dataclass of such objects is written with their addresses
    inside it: each retry would be a new operation too."""
    ran: list[int] = []

    @any_settler.operation(key="batch:{orders}", principal=P, fingerprint=lambda orders: 0)
    def batch(orders: Any) -> int:
        ran.append(0)
        return 0

    held = ([Order(1), Order(2)], (Order(1),), Box(Order(1)), {"o": Order(1)}, [Named(1)])
    for orders in held:  # a list writes its items' repr: Named's is its address
        with pytest.raises(InvalidInput, match=r"\{orders\}.*__str__ or __format__"):
            batch(orders)
    assert batch([1, 2]) == 0  # values with text of their own keep working
    assert ran == [0]


@dataclasses.dataclass
class Card:
    number: str
    holder: Order


def test_the_refusal_never_holds_the_value_s_text(any_settler: Settler) -> None:
    """A dataclass's text holds its other fields (a card number): the error names the
    field and its type, never the text."""

    @any_settler.operation(key="card:{card}", principal=P, fingerprint=lambda card: 0)
    def pay(card: Card) -> int:
        return 0

    with pytest.raises(InvalidInput, match=r"\{card\}.*Card") as refused:
        pay(Card("4111111111111111", Order(1)))
    assert "4111" not in str(refused.value)


def test_a_bound_method_or_a_repr_conversion_is_written_as_an_address(
    any_settler: Settler,
) -> None:
    """A bound method's text ends in two ``>``; ``!r`` of a class with a __str__ of its own
    (but not a __repr__) is still its address."""
    ran: list[int] = []

    @any_settler.operation(key="hook:{hook}", principal=P, fingerprint=lambda hook: 0)
    def call(hook: Callable[[], object]) -> int:
        ran.append(0)
        return 0

    @any_settler.operation(key="charge:{order!r}", principal=P, fingerprint=lambda order: 0)
    def charge_repr(order: Order) -> int:
        ran.append(order.oid)
        return order.oid

    with pytest.raises(InvalidInput, match=r"\{hook\}"):
        call(Named(1).__str__)
    with pytest.raises(InvalidInput, match=r"\{order\}"):
        charge_repr(Named(1))
    assert ran == []


@pytest.mark.asyncio
async def test_async_a_key_field_written_as_an_address_is_refused(
    async_any: AsyncSettler,
) -> None:
    ran: list[int] = []

    @async_any.operation(key="charge:{order}", principal=P, fingerprint=lambda order: order.oid)
    async def charge(order: Order) -> int:
        ran.append(order.oid)
        return order.oid

    with pytest.raises(InvalidInput, match=r"\{order\}.*__str__ or __format__"):
        await charge(Order(1))
    assert ran == []
    assert await charge(Named(3)) == 3
    assert await charge(Named(3)) == 3
    assert ran == [3]


# -- on_replay must be a plain callable ----------------------------------------------------


async def _async_hook(record: OperationRecord) -> None:
    raise AssertionError("never awaited")


class _AsyncCallable:
    async def __call__(self, record: OperationRecord) -> None:
        raise AssertionError("never awaited")


def test_an_async_on_replay_is_refused_when_decorated(any_settler: Settler) -> None:
    for hook in (_async_hook, _AsyncCallable()):
        with pytest.raises(InvalidInput, match="on_replay must be a plain callable"):
            any_settler.operation(key="k:{n}", principal=P, on_replay=hook)


@pytest.mark.asyncio
async def test_async_an_async_on_replay_is_refused_when_decorated(
    async_any: AsyncSettler,
) -> None:
    seen: list[int] = []
    with pytest.raises(InvalidInput, match="on_replay must be a plain callable"):
        async_any.operation(key="k:{n}", principal=P, on_replay=_async_hook)

    @async_any.operation(key="k:{n}", principal=P, on_replay=lambda r: seen.append(r.generation))
    async def job(n: int) -> int:
        return n

    assert await job(1) == 1
    assert await job(1) == 1
    assert len(seen) == 1
