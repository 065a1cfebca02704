"""``slot_init``: the decorator's steps (built several times per call) set their slots
through the slots' descriptors, and are the same dataclasses as before: the same
parameters, defaults and fields, frozen, equal and hashed by value."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any

import pytest

from settle._slots import slot_init
from settle.decorator import _plan
from settle.decorator._signature import CallIdentity
from settle.http.problems import Response
from settle.http.request import RequestHead

#: Every class of the decorator's hot path that slot_init builds.
STEPS = [
    CallIdentity,
    _plan.Reserve,
    _plan.Run,
    _plan.Settle,
    _plan.Read,
    _plan.Release,
    _plan.Sleep,
    _plan.Return,
    _plan.Raise,
    _plan.Ran,
]

#: The HTTP guards' classes built on every request (the head) and every replay or problem
#: (the response): public, so each stays the dataclass it was (issue 19, the twenty-third
#: round).
HTTP = [RequestHead, Response]


@pytest.mark.parametrize("cls", STEPS + HTTP, ids=lambda cls: cls.__name__)
def test_a_step_holds_each_field_it_is_given_and_the_dataclass_defaults(cls: Any) -> None:
    """Its parameters are its fields, in order, with their defaults and annotations; each
    value lands in its own field, by position and by keyword; a field left out holds its
    default; the step stays frozen, equal and hashed by value, and ``replace`` works."""
    assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"
    declared = dataclasses.fields(cls)
    empty = inspect.Parameter.empty
    assert [(p.name, p.default) for p in inspect.signature(cls).parameters.values()] == [
        (f.name, empty if f.default is dataclasses.MISSING else f.default) for f in declared
    ]
    assert {f.name: f.type for f in declared} == {
        name: kind for name, kind in cls.__init__.__annotations__.items() if name != "return"
    }
    values = {f.name: object() for f in declared}
    by_keyword = cls(**values)
    by_position = cls(*values.values())
    assert [getattr(by_keyword, n) for n in values] == list(values.values())
    assert [getattr(by_position, n) for n in values] == list(values.values())
    assert by_keyword == by_position
    assert hash(by_keyword) == hash(by_position)
    required = {f.name: values[f.name] for f in declared if f.default is dataclasses.MISSING}
    short = cls(**required)
    for f in declared:
        expected = values[f.name] if f.name in required else f.default
        assert getattr(short, f.name) is expected, f.name
    first = declared[0].name
    assert dataclasses.replace(by_keyword, **{first: 1}) != by_keyword
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(by_keyword, first, 1)
    with pytest.raises(TypeError):
        cls(*values.values(), object())  # one too many
    if required:
        with pytest.raises(TypeError):
            cls()  # one missing


def test_slot_init_refuses_what_it_would_not_build_alike() -> None:
    """A class that is not a frozen, slotted dataclass, or whose ``__init__`` does more than
    set each field (a default factory, a field left out, a keyword-only one, a
    ``__post_init__``), is refused when it is defined: its steps would be built wrong."""

    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(slots=True)
    class NotFrozen:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Factory:
        a: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True, slots=True)
    class LeftOut:
        a: int = dataclasses.field(default=0, init=False)

    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class KeywordOnly:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class PostInit:
        a: int

        def __post_init__(self) -> None:
            pass

    for cls in (NoSlots, NotFrozen, Factory, LeftOut, KeywordOnly, PostInit, int):
        with pytest.raises(TypeError, match="slot_init"):
            slot_init(cls)


def test_slot_init_refuses_an_init_it_would_replace_with_a_different_one() -> None:
    """A dataclass ``__init__`` that takes an ``InitVar`` (a parameter that is no field), a
    class's own ``__init__`` (``init=False`` or written in its body, even with the fields'
    parameters) is refused when it is defined: replacing it would change what the class
    takes or does, where the dataclass's is kept."""

    @dataclasses.dataclass(frozen=True, slots=True)
    class WithInitVar:
        a: int
        b: dataclasses.InitVar[int] = 0

    @dataclasses.dataclass(frozen=True, slots=True)
    class OwnInit:
        a: int

        def __init__(self, a: int) -> None:
            object.__setattr__(self, "a", a * 2)

    @dataclasses.dataclass(frozen=True, slots=True, init=False)
    class NoInit:
        a: int

        def __init__(self, a: int, scale: int) -> None:
            object.__setattr__(self, "a", a * scale)

    assert WithInitVar(1, 2).a == 1
    assert OwnInit(1).a == 2
    assert NoInit(1, 3).a == 3
    for cls in (WithInitVar, OwnInit, NoInit):
        with pytest.raises(TypeError, match="slot_init"):
            slot_init(cls)


@pytest.mark.parametrize(
    "names", [["self"], ["a", "self"], ["_set1", "b"], ["_make", "_default0", "b"]]
)
def test_a_field_named_like_the_generated_codes_names_is_set_like_any_other(
    names: list[str],
) -> None:
    """Field names are escaped from the generated ``__init__``'s own: a field named ``self``
    (which dataclasses allow) or like a helper name takes its own value, by position and by
    keyword, and its default when left out, as the dataclass's ``__init__`` gives it; a
    callable value is held, never called."""
    fields: list[Any] = [(n, Any) for n in names[:-1]]
    fields.append((names[-1], Any, dataclasses.field(default=len)))
    plain = dataclasses.make_dataclass("Plain", fields, frozen=True, slots=True)
    built = slot_init(dataclasses.make_dataclass("Built", fields, frozen=True, slots=True))
    assert list(inspect.signature(built).parameters) == names
    given: list[Any] = [print, abs, repr][: len(names)]
    for cls in (plain, built):
        for obj in (cls(*given), cls(**dict(zip(names, given, strict=True)))):
            assert [getattr(obj, n) for n in names] == given
        short = cls(*given[:-1])
        assert [getattr(short, n) for n in names] == [*given[:-1], len]


def test_slot_init_refuses_a_field_with_its_prefix() -> None:
    """The generated code's names start ``__slot_init_``: a field named so is refused."""
    cls = dataclasses.make_dataclass(
        "Prefixed", [("__slot_init_set0__", Any)], frozen=True, slots=True
    )
    with pytest.raises(TypeError, match="slot_init"):
        slot_init(cls)


@pytest.mark.parametrize("cls", STEPS + HTTP, ids=lambda cls: cls.__name__)
def test_a_step_refuses_bad_arguments_with_the_dataclasss_own_messages(cls: Any) -> None:
    """Too many, too few, unknown or repeated arguments raise the ``TypeError`` the
    dataclass's own ``__init__`` raises, word for word (its twin, built without
    ``slot_init``, under the same qualified name)."""
    declared = dataclasses.fields(cls)
    twin: Any = dataclasses.make_dataclass(
        cls.__name__,
        [(f.name, f.type, dataclasses.field(default=f.default)) for f in declared],
        frozen=True,
        slots=True,
    )
    twin.__qualname__ = cls.__qualname__
    twin.__init__.__qualname__ = f"{cls.__qualname__}.__init__"
    values = [object() for _ in declared]
    first = declared[0].name
    calls = [
        lambda c: c(*values, object()),
        lambda c: c(*values, unknown=1),
        lambda c: c(*values, **{first: 1}),
    ]
    if any(f.default is dataclasses.MISSING for f in declared):
        calls.append(lambda c: c())
    for call in calls:
        messages = []
        for c in (twin, cls):
            with pytest.raises(TypeError) as raised:
                call(c)
            messages.append(str(raised.value))
        assert messages[0] == messages[1]


def test_every_step_of_the_plan_is_one_slot_init_builds() -> None:
    """Every class a plan hands its driver (``Step``), and the two it builds for them, is
    in :data:`STEPS`: a step added later without ``@slot_init`` is checked here too."""
    assert {*typing.get_args(_plan.Step), _plan.Ran, CallIdentity} == set(STEPS)


@pytest.mark.parametrize("cls", STEPS + HTTP, ids=lambda cls: cls.__name__)
def test_a_step_sets_its_slots_without_object_setattr(cls: Any) -> None:
    """What slot_init is for (issue 19, the twenty-first round): a step's ``__init__`` is
    not the dataclass's, which sets each field through ``object.__setattr__`` (about 1,800
    instructions a field, where the slot's descriptor takes about 500). Without it (the
    decorator left off, or its ``__init__`` not installed) every other test here passes."""
    code = cls.__init__.__code__
    assert code.co_qualname != "__create_fn__.<locals>.__init__"
    assert "__setattr__" not in code.co_names


@slot_init
@dataclasses.dataclass(frozen=True, slots=True)
class _Annotated:
    """A field annotated by a name of this module (a string, under ``from __future__ import
    annotations``), as a public class's may be."""

    value: Any
    head: RequestHead | None = None


@pytest.mark.parametrize("cls", [*STEPS, *HTTP, _Annotated], ids=lambda cls: cls.__name__)
def test_a_steps_init_resolves_its_annotations_in_its_own_module(cls: Any) -> None:
    """Found in review of the twenty-third round: the built ``__init__`` ran in an empty
    namespace, so ``typing.get_type_hints(cls.__init__)`` raised ``NameError`` for a field
    annotated by a name of the class's module (``Any``), where the dataclass's resolved it."""
    hints = typing.get_type_hints(cls.__init__)
    assert set(hints) >= {f.name for f in dataclasses.fields(cls)}
    assert cls.__init__.__globals__ is vars(inspect.getmodule(cls))
