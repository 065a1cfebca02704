"""The decorator's identities in this process: where the first function decorated under
each default identity (``module.qualname``) of a namespace was defined, so that another
definition under it is refused when decorated instead of replaying the first one's stored
results (issue 16). Only file and line are kept, no function object."""

from __future__ import annotations

import contextlib
import inspect
import threading
import types

from settle.errors import InvalidInput

__all__ = ["claim_identity"]

#: How many (namespace, identity) pairs :func:`claim_identity` remembers; past that the
#: oldest is forgotten (a second definition of it then goes unnoticed, never refused).
_SITES_KEPT = 4096
_sites: dict[tuple[str, str], tuple[str, int]] = {}
_sites_lock = threading.Lock()


def _definition_site(fn: object) -> tuple[str, int] | None:
    """Where ``fn`` was defined (file, first line), seen through ``functools.wraps``
    wrappers and methods; None for what has no code object (a builtin)."""
    with contextlib.suppress(ValueError):  # a __wrapped__ cycle
        fn = inspect.unwrap(fn)  # type: ignore[arg-type]
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if not isinstance(code, types.CodeType):
        return None
    return code.co_filename, code.co_firstlineno


def claim_identity(namespace: str, name: str, fn: object) -> None:
    """Remember where the first function decorated under ``name`` (its default identity,
    ``module.qualname``) in ``namespace`` was defined, and refuse another definition under
    it: a class or function redefined with the same qualname (a test, a plugin, a notebook
    cell), two ``def run`` in two branches of a factory. Both would fingerprint alike, so
    one's stored results would be replayed to the other's calls. The same code decorated
    again (a factory called twice, a module reloaded) is allowed; so is any function given
    ``name=``, which is how functions share operations on purpose. Only the file and line
    are kept, no function object."""
    site = _definition_site(fn)
    if site is None:
        return
    key = (namespace, name)
    with _sites_lock:  # two threads decorating at once: one is first
        first = _sites.setdefault(key, site)
        if first == site:
            if len(_sites) > _SITES_KEPT:
                del _sites[next(iter(_sites))]
            return
    raise InvalidInput(
        f"@settler.operation: {name} (defined at {site[0]}:{site[1]}) is another function "
        f"than the {name} already decorated in namespace {namespace!r} (defined at "
        f"{first[0]}:{first[1]}): under one identity they would return each other's stored "
        'results; give each its own name="..."'
    )
