"""settle's structlog logger. Event names are stable (``settle.<area>.<what>``) and fields
are named; payloads, results and principals themselves are never logged.

A principal appears in a log line only as ``binding_digest``: the first 12 hex digits of
HMAC-SHA256 under a per-deployment secret, ``SETTLE_DIGEST_KEY``; an operation id only as
``operation_digest`` (16 hex digits under the same secret; SPEC 12); the other inputs of an
idempotency key likewise, a delivery progress emission id as ``emission_digest`` and a cursor
event id as ``event_digest``. Two lines of one principal, operation, emission or event carry
the same digest, so they can be correlated, but the digest cannot be reversed with a
dictionary of user ids or order numbers without the secret.
Without ``SETTLE_DIGEST_KEY`` each process draws a random secret: digests then correlate
lines of one process only. The digests are for logs only; nothing stored depends on them,
so the secret can be rotated at any time.

A library is quiet until the application says otherwise. While structlog is unconfigured,
settle's events go to the standard library logger ``settle`` (with a ``NullHandler``):
nothing is written until the application configures :mod:`logging`, and
``logging.basicConfig(level=logging.INFO)`` shows them as ``<event> field=value ...``.
Once the application configures structlog (``structlog.configure``), they go through its
configuration with the same names and fields. The ``settle`` CLI configures its own console
output (``settle.cli._context.configure_logging``).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import os
import secrets
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog

__all__ = [
    "DIGEST_KEY_ENV",
    "STDLIB_LOGGER",
    "binding_digest",
    "emission_digest",
    "enabled",
    "event_digest",
    "logger",
    "operation_digest",
]

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
    else the standard library logger ``settle``. A bound logger (:meth:`bind`) chooses at
    each use too: a store or consumer made at start-up binds its logger once, and an
    application that configures structlog after that must still get its events (they went
    to the standard library logger, where nothing was written)."""

    __slots__ = ("_context", "_quiet")

    def __init__(self, context: dict[str, Any] | None = None) -> None:
        self._context = context or {}
        self._quiet: Any = None  # the standard library route, bound once (it never changes)

    def bind(self, **fields: Any) -> _Logger:
        return _Logger({**self._context, **fields})

    def __getattr__(self, name: str) -> Any:
        if structlog.is_configured():
            # Bound at each use: the application may configure structlog again (its
            # processors are read when a logger is bound).
            target = _configured.bind(**self._context) if self._context else _configured
        else:
            if self._quiet is None:
                self._quiet = _quiet.bind(**self._context) if self._context else _quiet
            target = self._quiet
        return getattr(target, name)


logger: Any = _Logger()


def _structlog_state() -> Any:
    """structlog's own configuration object (``structlog._config._CONFIG``), which
    ``configure()`` and ``reset_defaults()`` change in place and its loggers read when they
    are bound; None on a structlog without one of that shape (then :func:`enabled` asks the
    public functions)."""
    state = getattr(getattr(structlog, "_config", None), "_CONFIG", None)
    if isinstance(getattr(state, "is_configured", None), bool) and hasattr(
        state, "default_wrapper_class"
    ):
        return state
    return None


#: Read by :func:`enabled` on every call, never copied: ``structlog.get_config()`` builds a
#: dict of the whole configuration per call (~4,000 instructions of ``enabled``'s ~5,400).
_STRUCTLOG = _structlog_state()


def enabled(level: int) -> bool:
    """Whether an event at ``level`` (a :mod:`logging` level) can be written. Unconfigured:
    as the standard library logger ``settle`` says, exactly as ``filter_by_level`` would.
    Configured with one of structlog's filtering loggers
    (``structlog.make_filtering_bound_logger``): as its level says (a filtered level is a
    no-op method that no processor sees). Any other configuration: always (its processors
    decide). The per-call path asks first and skips building events that would only be
    dropped."""
    state = _STRUCTLOG
    if state is None:  # another structlog: its public functions
        if not structlog.is_configured():
            return _stdlib.isEnabledFor(level)
        floor = _filtering_level(structlog.get_config()["wrapper_class"])
        return floor is None or level >= floor
    if not state.is_configured:
        return _stdlib.isEnabledFor(level)
    floor = _filtering_level(state.default_wrapper_class)
    return floor is None or level >= floor


@functools.lru_cache(maxsize=16)
def _filtering_level(wrapper: Any) -> int | None:
    """The level a ``make_filtering_bound_logger`` class drops events below; None for any
    other wrapper class (then nothing is skipped)."""
    name = str(getattr(wrapper, "__name__", ""))
    if not name.startswith("BoundLoggerFiltering"):
        return None
    effective = getattr(wrapper, "get_effective_level", None)
    if not callable(effective):  # structlog before 25.1: the level is only in its name
        return _FILTERING_CLASS_LEVELS.get(name)
    try:
        level = effective(None)  # ``lambda self: level``
    except Exception:  # noqa: BLE001 - not the class structlog makes: skip nothing
        return None
    return level if isinstance(level, int) else None


#: The names structlog gives its filtering classes (``BoundLoggerFilteringAtInfo``), for
#: the versions whose classes have no ``get_effective_level`` (24.x, which pyproject allows).
_FILTERING_CLASS_LEVELS = {
    f"BoundLoggerFilteringAt{name.capitalize()}": level
    for name, level in (
        ("notset", logging.NOTSET),
        ("debug", logging.DEBUG),
        ("info", logging.INFO),
        ("warning", logging.WARNING),
        ("error", logging.ERROR),
        ("critical", logging.CRITICAL),
    )
}


DIGEST_KEY_ENV = "SETTLE_DIGEST_KEY"


@functools.cache
def _digest_key() -> bytes:
    configured = os.environ.get(DIGEST_KEY_ENV, "")
    # The bytes as set: a byte of no UTF-8 text (Python decodes the environment with
    # surrogateescape) is itself, where encoding strictly raised at the first digest.
    return configured.encode("utf-8", "surrogateescape") if configured else secrets.token_bytes(32)


def binding_digest(binding: str) -> str:
    """A short keyed digest of a principal, for log lines (never the principal itself)."""
    mac = hmac.new(_digest_key(), binding.encode("utf-8"), hashlib.sha256)
    return mac.hexdigest()[:12]


def operation_digest(operation_id: str | None) -> str | None:
    """A keyed digest of an operation id, for log lines (never the id itself: ids often
    carry order or user numbers). 16 hex digits: operations are many, and two of them
    sharing a digest would mix their lines. ``settle digest <id>`` prints it under the same
    ``SETTLE_DIGEST_KEY``."""
    if operation_id is None:
        return None
    return _keyed(b"op\0", operation_id)


def emission_digest(emission_id: str | None) -> str | None:
    """A keyed digest of a delivery progress emission id (``settle.progress``), for log
    lines: the emission id is what the consumer's idempotency key is made of. 16 hex digits
    under ``SETTLE_DIGEST_KEY``, apart from an operation id's (``settle digest --emission``)."""
    return None if emission_id is None else _keyed(b"emission\0", emission_id)


def event_digest(event_id: str | None) -> str | None:
    """A keyed digest of a cursor event id (``settle.cursor``), for log lines: the event id
    is what the handler's idempotency key is made of. 16 hex digits under
    ``SETTLE_DIGEST_KEY``, apart from an operation id's (``settle digest --event``)."""
    return None if event_id is None else _keyed(b"event\0", event_id)


def _keyed(domain: bytes, value: str) -> str:
    """16 hex digits of HMAC-SHA256 of ``domain + value``: the domain keeps an emission and an
    operation of the same text apart."""
    mac = hmac.new(_digest_key(), domain + value.encode("utf-8"), hashlib.sha256)
    return mac.hexdigest()[:16]
