"""``_trusted`` (settle/models.py) builds the models of every settle call from a per-class
cache filled on a class's first use. Threads share that cache (a threaded WSGI server,
Django, a sync Settler in a thread pool): a thread switched out while another fills it
must find it whole, or the first concurrent calls after a start fail with a KeyError
that is no settle error, after their script ran."""

from __future__ import annotations

import sys
import threading

from pydantic import BaseModel, create_model

from settle import models
from settle.models import _trusted

_VALUES = {"a": 1, "b": "x"}


class _SwitchOnHash(type(BaseModel)):  # type: ignore[misc]
    """A model class whose hashing (every dict look-up of it) runs ``_trusted`` for it once
    it is in the cache: what a thread switched in at that instant does."""

    armed = False

    def __hash__(cls) -> int:
        if _SwitchOnHash.armed and any(k is cls for k in list(models._FIELDS)):
            _SwitchOnHash.armed = False
            _trusted(cls, dict(_VALUES))
        return type.__hash__(cls)


class _Switched(BaseModel, metaclass=_SwitchOnHash):
    a: int
    b: str


def test_a_thread_switched_in_while_a_class_is_first_cached_builds_the_model() -> None:
    _SwitchOnHash.armed = True
    try:
        for _ in range(2):  # a switch at the first look-up after the cache was filled
            model = _trusted(_Switched, dict(_VALUES))
            assert model == _Switched.model_construct(**_VALUES)
            assert model.model_fields_set == {"a", "b"}
        assert not _SwitchOnHash.armed  # the switched-in build did run
    finally:
        _SwitchOnHash.armed = False


def test_threads_building_new_models_at_once_all_get_them() -> None:
    errors: list[BaseException] = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for i in range(150):
            cls = create_model(f"Fresh{i}", **{f"f{j}": (int, 0) for j in range(16)})
            values = {f"f{j}": j for j in range(16)}
            start = threading.Barrier(6)

            def build(
                cls: type[BaseModel] = cls,
                values: dict[str, int] = values,
                start: threading.Barrier = start,
            ) -> None:
                start.wait()
                try:
                    _trusted(cls, dict(values))
                except BaseException as exc:  # collected, asserted below
                    errors.append(exc)

            threads = [threading.Thread(target=build) for _ in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors, f"class {i}: {errors[0]!r}"
    finally:
        sys.setswitchinterval(interval)
