"""Frozen, slotted dataclasses built on the hot path: each field's slot set through its own
descriptor, not through ``object.__setattr__``."""

from __future__ import annotations

import dataclasses
import inspect
import sys
from typing import Any, TypeVar

__all__ = ["slot_init"]

T = TypeVar("T")


def slot_init(cls: type[T]) -> type[T]:
    """Give the frozen, slotted dataclass ``cls`` an ``__init__`` that sets each field's slot
    through the slot's own descriptor. The dataclass's sets each through
    ``object.__setattr__`` (looked up on ``object``, the type's MRO checked, per field): about
    1,800 instructions a field, where the descriptor's ``__set__`` takes about 500 (the
    twenty-first round, docs/benchmarks.md). The same parameters in the same order, the same
    defaults and annotations; the class stays frozen (``obj.x = ...`` still raises), equal
    and hashed by value. A class it cannot do this for (a field with a default factory, a
    field left out of ``__init__`` or keyword-only, an ``InitVar``, a ``__post_init__``, an
    ``__init__`` of its own or none, a field named like the names the generated code uses) is
    refused when it is defined."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"slot_init: {cls.__qualname__} is not a frozen, slotted dataclass")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]  # checked a dataclass above
    # Only the ``__init__`` dataclasses generated (an InitVar is a parameter it takes but
    # no field, and a class's own ``__init__`` does what its body says) is replaced.
    generated = getattr(getattr(cls.__init__, "__code__", None), "co_qualname", "")
    if (
        not params.init
        or generated != "__create_fn__.<locals>.__init__"
        or hasattr(cls, "__post_init__")
        or list(inspect.signature(cls.__init__).parameters)[1:] != [f.name for f in fields]
        or any(
            not f.init
            or f.kw_only
            or f.default_factory is not dataclasses.MISSING
            or f.name.startswith("__slot_init_")
            for f in fields
        )
    ):
        raise TypeError(f"slot_init: {cls.__qualname__} has a field or hook it does not set")
    # The generated code's own names cannot be a field's: ``self`` (as dataclasses do) and the
    # ``__slot_init_`` prefix refused above; the source holds the field names and no value.
    this = "__slot_init_self__" if any(f.name == "self" for f in fields) else "self"
    values: dict[str, Any] = {}
    signature = []
    body = []
    for i, f in enumerate(fields):
        values[f"__slot_init_set{i}__"] = getattr(cls, f.name).__set__
        if f.default is dataclasses.MISSING:
            signature.append(f.name)
        else:
            values[f"__slot_init_default{i}__"] = f.default
            signature.append(f"{f.name}=__slot_init_default{i}__")
        body.append(f"        __slot_init_set{i}__({this}, {f.name})")
    source = (
        f"def _make({', '.join(values)}):\n"
        f"    def __init__({', '.join([this, *signature])}):\n"
        + ("\n".join(body) or "        pass")
        + "\n    return __init__\n"
    )
    # Run in the class's module, as dataclasses runs its generated code: the ``__init__``'s
    # ``__globals__`` are the module's, so ``typing.get_type_hints(cls.__init__)`` resolves a
    # string annotation by the module's names (``Any``, a class of the module).
    module = sys.modules.get(cls.__module__)
    scope: dict[str, Any] = {}
    exec(source, vars(module) if module is not None else {}, scope)  # noqa: S102  # the source is made of the class's field names only
    init = scope["_make"](**values)
    original = cls.__init__
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__annotations__ = dict(original.__annotations__)
    init.__doc__ = original.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
