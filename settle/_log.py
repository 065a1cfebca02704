"""settle's structlog logger. Event names are stable (``settle.<area>.<what>``) and fields
are named; payloads, results and principals are never logged (a principal appears only as a
short digest, so two log lines can still be correlated).

A library is quiet until the application says otherwise. While structlog is unconfigured,
settle's events go to the standard library logger ``settle`` (with a ``NullHandler``):
nothing is written until the application configures :mod:`logging`, and
``logging.basicConfig(level=logging.INFO)`` shows them as ``<event> field=value ...``.
Once the application configures structlog (``structlog.configure``), they go through its
configuration with the same names and fields. The ``settle`` CLI configures its own console
output (``settle.cli._context.configure_logging``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog

__all__ = ["STDLIB_LOGGER", "binding_digest", "logger"]

#: The standard library logger settle's events go to while structlog is unconfigured.
STDLIB_LOGGER = "settle"

_stdlib = logging.getLogger(STDLIB_LOGGER)
# No output (not even logging's "last resort" for warnings) until the application
# configures logging: the library convention.
_stdlib.addHandler(logging.NullHandler())


def _to_stdlib(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> Mapping[str, Any]:
    """``settle.reserve.reserved namespace='shop' generation=3`` as the record's message; the
    event and its fields also as the record's ``settle_event`` / ``settle_fields``."""
    event = str(event_dict.pop("event"))
    text = " ".join([event, *(f"{key}={value!r}" for key, value in event_dict.items())])
    # stacklevel: the record names settle's line that logged, not structlog's.
    extra = {"settle_event": event, "settle_fields": event_dict}
    return {"msg": text, "extra": extra, "stacklevel": 4}


_quiet = structlog.wrap_logger(
    _stdlib,
    processors=[structlog.stdlib.filter_by_level, _to_stdlib],
    wrapper_class=structlog.stdlib.BoundLogger,
    context_class=dict,
    cache_logger_on_first_use=True,
)
_configured = structlog.get_logger(STDLIB_LOGGER)


class _Logger:
    """Chooses at each use: the application's structlog configuration when it has one,
    else the standard library logger ``settle``."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        target = _configured if structlog.is_configured() else _quiet
        return getattr(target, name)


logger: Any = _Logger()


def binding_digest(binding: str) -> str:
    return hashlib.sha256(binding.encode("utf-8")).hexdigest()[:12]
