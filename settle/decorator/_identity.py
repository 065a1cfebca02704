"""The decorator's identities in this process: where the first function decorated under
each default identity (``module.qualname``) of a namespace was defined, so that another
definition under it is refused when decorated instead of replaying the first one's stored
results (issue 16). Only file and line are kept, no function object."""

from __future__ import annotations

import contextlib
import inspect
import string
import threading
import types

from settle.errors import InvalidInput

__all__ = ["claim_identity"]

#: How many (namespace, identity) pairs :func:`claim_identity` remembers; past that the
#: oldest is forgotten (a second definition of it then goes unnoticed).
_SITES_KEPT = 4096
#: How many definitions (site and key prefix) of one identity it remembers; past that a
#: further one goes unnoticed (a registry of hundreds of functions all named ``_``).
_DEFINITIONS_KEPT = 64
_Site = tuple[str, int]
#: A definition: where it is, and the fixed text every id of its key starts with (None
#: for a key callable, whose ids can be anything).
_Definition = tuple[_Site, str | None]
_sites: dict[tuple[str, str, str], tuple[_Definition, ...]] = {}
_sites_lock = threading.Lock()


def _definition_site(fn: object) -> _Site | None:
    """Where ``fn`` was defined (file, first line), seen through ``functools.wraps``
    wrappers and methods; None for what has no code object (a builtin)."""
    with contextlib.suppress(ValueError):  # a __wrapped__ cycle
        fn = inspect.unwrap(fn)  # type: ignore[arg-type]
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if not isinstance(code, types.CodeType):
        return None
    return code.co_filename, code.co_firstlineno


def _key_prefix(key: object) -> str | None:
    """The text every id a key template makes starts with (its literal text before the
    first field, ``{{`` read as ``{``); None for a key callable."""
    if not isinstance(key, str):
        return None
    prefix = []
    for literal, field, _, _ in string.Formatter().parse(key):  # checked well-formed
        prefix.append(literal)
        if field is not None:
            break
    return "".join(prefix)


def _can_meet(a: str | None, b: str | None) -> bool:
    """Whether two keys can make one id: unless both start with fixed texts of which
    neither is a prefix of the other (``card:`` and ``bank:``), assume they can."""
    return a is None or b is None or a.startswith(b) or b.startswith(a)


def claim_identity(place: str, namespace: str, name: str, fn: object, key: object) -> None:
    """Remember where each function decorated under ``name`` (its default identity,
    ``module.qualname``) in ``namespace`` was defined and the fixed text its ids start
    with, and refuse another definition under it whose key can make an id one of them
    makes: a class or function redefined with the same qualname (a test, a plugin, a
    notebook cell), two ``def run`` in two branches of a factory. Both would fingerprint
    alike, so one's stored results would be replayed to the other's calls. The same code
    decorated again (a factory called twice, a module reloaded) is allowed, and so are
    definitions whose keys never meet (functions all named ``_``, keys ``card:{x}`` and
    ``bank:{x}``); so is any function given ``name=``, which is how functions share
    operations on purpose. Only files, lines and key prefixes are kept, no function.
    ``place``: where the records live (every Redis is one place; each in-process keyspace
    its own): a ``MemorySettler`` and a Redis settler of one namespace share no record, so
    the README's two ``charge`` examples, one on each, run in one session."""
    site = _definition_site(fn)
    if site is None:
        return
    prefix = _key_prefix(key)
    known = (place, namespace, name)
    with _sites_lock:  # two threads decorating at once: one is first
        definitions = _sites.get(known, ())
        clash = next((d for d in definitions if d[0] != site and _can_meet(d[1], prefix)), None)
        if clash is None:
            if (site, prefix) not in definitions and len(definitions) < _DEFINITIONS_KEPT:
                _sites[known] = (*definitions, (site, prefix))
            if len(_sites) > _SITES_KEPT:
                del _sites[next(iter(_sites))]
            return
    first = clash[0]
    raise InvalidInput(
        f"@settler.operation: {name} (defined at {site[0]}:{site[1]}) is another function "
        f"than the {name} already decorated in namespace {namespace!r} (defined at "
        f"{first[0]}:{first[1]}) and their keys can make one id: under one identity they "
        'would return each other\'s stored results; give each its own name="..."'
    )
