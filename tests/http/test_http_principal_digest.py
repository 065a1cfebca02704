"""The principal's digest in an operation id is cached (``keys._principal_digest``): the
cache must give each principal its own digest, stay bounded, and keep no object the principal
callable returned (a str subclass may carry the request, a user, a token)."""

from __future__ import annotations

import gc
import hashlib
import weakref

from settle.http import keys
from settle.http.keys import operation_id


class _Caseless(str):
    """A str whose ``==`` and hash ignore case (as case-insensitive str types do)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and self.lower() == other.lower()

    def __hash__(self) -> int:
        return hash(self.lower())


class _Held:
    """What a principal object may hold."""


def _digest(principal: str) -> str:
    return hashlib.sha256(principal.encode()).hexdigest()[:32]


def test_principals_a_str_subclass_calls_equal_keep_their_own_operation_ids() -> None:
    """``'Alice'`` and ``'alice'`` are two principals (their bindings differ): the second
    must not be named with the first's digest because its type's ``==`` says they match."""
    first = operation_id("idem", "k1", _Caseless("Alice"), "principal")
    second = operation_id("idem", "k1", _Caseless("alice"), "principal")
    assert first == f"idem:{_digest('Alice')}:k1"
    assert second == f"idem:{_digest('alice')}:k1"


def test_the_cache_keeps_no_principal_object() -> None:
    principal = _Caseless("tenant:held")
    held = _Held()
    principal.held = held  # type: ignore[attr-defined]
    gone = weakref.ref(held)
    assert operation_id("idem", "k", principal, "principal").startswith("idem:")
    del principal, held
    gc.collect()
    assert gone() is None


def test_the_cache_is_bounded() -> None:
    for n in range(3000):
        name = f"tenant:{n}"
        assert operation_id("idem", "k", name, "principal") == f"idem:{_digest(name)}:k"
    assert keys._principal_digest.cache_info().currsize <= 1024
