"""OpenTelemetry traces and metrics for every part of settle, in one place.

settle makes spans and measurements through the *global* tracer and meter providers with
the instrumentation scope ``settle``, as OpenTelemetry asks libraries to do: the application
chooses the SDK and the exporters, settle only reports. When ``opentelemetry`` (the
``opentelemetry-api`` distribution, extra ``settle-sdk[otel]``) is not importable, nothing
is imported and every hook is a shared no-op: :func:`telemetry` answers :data:`NOOP`.

What settle reports (docs/observability.md lists every name and attribute):

* a span per settle call (``settle.reserve``, ``settle.complete``, ...) with the namespace,
  the outcome or verdict, the quarantine kind, the generation and a takeover, and the
  ``settle.call.duration`` histogram; counters of reservations, settlements, quarantine
  entries, takeovers, lost leases and failed renewals;
* inside it a client span per Redis call (the runtime's runner) with the Redis client
  semantic conventions: never the script text, the keys or a payload;
* the decorator's operation and its attempts; the HTTP middlewares' outcome on the current
  (server) span and ``settle.http.requests``; delivery settlements of ``settle.progress``
  with the messaging conventions and ``messaging.client.operation.duration``.

Operation ids, principals, keys and payloads never appear: no hook is given one.

Telemetry never changes what settle does: every call into OpenTelemetry (a span started,
ended or given attributes, a measurement recorded) is guarded, and an exception from it (a
span processor or exporter that raises) is dropped and logged as ``settle.telemetry.failed``
with its class only (:func:`_failed`), so a settle call returns or raises exactly what it
would without telemetry.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import threading
import time
import weakref
from typing import Any, Self, TypeVar

from redis.exceptions import RedisClusterException, RedisError, ResponseError

from settle._log import logger

__all__ = ["NOOP", "SCOPE", "CallSpan", "telemetry"]

T = TypeVar("T")

#: The instrumentation scope of every span and instrument.
SCOPE = "settle"

#: Exceptions whose class says the outcome of a ``reserve`` (no rule: a name for a metric).
_REFUSALS = {"FingerprintMismatch": "fingerprint_mismatch", "BindingMismatch": "binding_mismatch"}

#: At most one ``settle.telemetry.failed`` line per exception class in this many seconds: a
#: broken exporter fails on every call, and its log must not flood the application's.
_FAILED_EVERY = 60.0


class _Failures:
    """Logs an exception raised inside OpenTelemetry (class only: its message may hold
    anything), rate-limited per exception class; ``suppressed`` counts the ones not logged
    since the last line."""

    __slots__ = ("_last", "_lock", "_suppressed")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def __call__(self, error: Exception) -> None:
        kind = type(error).__qualname__
        now = time.monotonic()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < _FAILED_EVERY:
                self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
                return
            self._last[kind] = now
            suppressed = self._suppressed.pop(kind, 0)
        logger.warning("settle.telemetry.failed", error=kind, suppressed=suppressed)

    def _forked(self) -> None:
        self._lock = threading.Lock()


_failed = _Failures()


def _quietly(call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)`` into OpenTelemetry; None when it raised (logged by
    :data:`_failed`): telemetry never changes what settle returns or raises."""
    try:
        return call(*args, **kwargs)
    except Exception as error:  # noqa: BLE001  # a span processor, exporter or reader raised
        _failed(error)
        return None


class _Nothing:
    """A span that is no span: what every hook hands out when telemetry is off."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return False  # nothing to report: a shell may skip its reporting work

    def __enter__(self) -> _Nothing:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def done(self, result: T) -> T:
        return result

    def capture(self) -> _Resume | _Nothing:
        return self

    def _nothing(self, *_: Any) -> None:
        return None

    set = attempt = ran = attempt_done = answered = finished = _nothing


_NOTHING = _Nothing()


class _Muted(_Nothing):
    """What the decorator's and the HTTP guard's hooks hand out under
    ``suppress_instrumentation()``: nothing reported, and the suppression carried to the
    heartbeat thread with the rest of the caller's context (:meth:`capture`), so that its
    renewals are not reported either."""

    __slots__ = ("_otel",)

    def __init__(self, otel: Otel) -> None:
        self._otel = otel

    def capture(self) -> _Resume | _Nothing:
        return _capture(self._otel)


class Noop:
    """Every hook, doing nothing (OpenTelemetry is not importable)."""

    __slots__ = ()
    enabled = False

    def _nothing(self, *_: Any, **__: Any) -> _Nothing:
        return _NOTHING

    call = redis = pipeline = operation = settling = _nothing

    def http_request(self, *_: Any) -> _Nothing:
        return _NOTHING


NOOP = Noop()


@functools.cache
def telemetry() -> Noop | Otel:
    """The hooks: OpenTelemetry's when ``opentelemetry`` is importable, else :data:`NOOP`."""
    try:
        from opentelemetry import context, metrics, trace  # noqa: PLC0415  # only if installed
    except ImportError:
        return NOOP
    try:
        return Otel(context, metrics, trace)
    except Exception as error:  # noqa: BLE001  # a provider that cannot load: report nothing
        _failed(error)
        return NOOP


# -- OpenTelemetry -------------------------------------------------------------------------


def _settings(client: Any, key: str | None) -> dict[str, Any]:
    """``server.address`` / ``server.port`` / ``db.namespace`` of the node a call goes to:
    a standalone client's pool, or the cluster node that serves ``key``'s slot."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:  # standalone: the same for every call, kept with the pool
        known = _POOLS.get(pool)
        if known is None:
            known = _POOLS[pool] = _peer(client, None)
        return known
    return _peer(client, key)


#: The server attributes of each standalone client's connection pool.
_POOLS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def _peer(client: Any, key: str | None) -> dict[str, Any]:
    node = None
    if key is not None and hasattr(client, "get_node_from_key"):
        try:
            node = client.get_node_from_key(key)
        except Exception:  # noqa: BLE001  # no node known yet: report none
            node = None
    if node is not None:
        return {"server.address": node.host, "server.port": int(node.port), "db.namespace": "0"}
    pool = getattr(client, "connection_pool", None)
    given = getattr(pool, "connection_kwargs", None) or {}
    found: dict[str, Any] = {}
    if "path" in given:
        found["server.address"] = str(given["path"])
    elif "host" in given:
        found["server.address"] = str(given["host"])
        found["server.port"] = int(given.get("port", 6379))
    found["db.namespace"] = str(given.get("db", 0))
    return found


class _Span:
    """One span for a ``with`` block, made current unless it is a ``leaf`` (nothing runs
    inside a Redis call's span); ends it, marks an error by its class only (an exception
    message may name an operation id), and calls ``finish``."""

    __slots__ = ("_finish", "_otel", "_start", "_token", "attributes", "span")

    def __init__(self, otel: Otel, span: Any, finish: Any = None, *, leaf: bool = False) -> None:
        self._otel = otel
        self.span = span
        self._finish = finish
        self.attributes: dict[str, Any] = {}
        self._start = time.perf_counter()
        self._token = None if leaf else otel.attach(span)

    def __enter__(self) -> Self:
        return self

    def set(self, key: str, value: Any) -> None:
        """Add an attribute (None: nothing); all are set on the span at once, at its end."""
        if value is not None:
            self.attributes[key] = value

    def __exit__(self, kind: type[BaseException] | None, exc: object, tb: object) -> None:
        # Each step on its own: one that raises must not leave the span current or unended,
        # nor replace what the block returned or raised.
        if kind is not None:
            self._failed(kind, exc)
            _quietly(self.span.set_status, self._otel.trace.StatusCode.ERROR)
        if self._finish is not None:
            _quietly(self._finish, self, kind, time.perf_counter() - self._start)
        if self._token is not None:
            _quietly(self._otel.context.detach, self._token)
        if self.attributes:
            _quietly(self.span.set_attributes, self.attributes)
        _quietly(self.span.end)

    def _failed(self, kind: type[BaseException], _exc: object) -> None:
        """Name the error the block raised (its class: never its message)."""
        self.attributes["error.type"] = kind.__qualname__


class _Client(_Span):
    """A Redis call's client span. A failure is named by what Redis or redis-py said, not by
    the settle error that wraps it (the Redis semantic conventions: the original exception
    is preferred to a generic wrapper): a Redis error reply by its error prefix,
    ``db.response.status_code`` and ``error.type`` alike (``OOM``, ``ERR``...), anything
    else by the class of redis-py's exception (``ConnectionError``, ``TimeoutError``)."""

    __slots__ = ()

    def _failed(self, kind: type[BaseException], exc: object) -> None:
        original = _redis_error(exc)
        if original is None:
            super()._failed(kind, exc)
            return
        code = _status_code(original)
        if code is not None:
            self.attributes["db.response.status_code"] = code
        self.attributes["error.type"] = code or type(original).__qualname__


def _redis_error(exc: object) -> BaseException | None:
    """The redis-py exception ``exc`` is or wraps (settle raises its own errors ``from``
    it), None when there is none."""
    seen = 0
    while isinstance(exc, BaseException) and seen < 8:
        if isinstance(exc, (RedisError, RedisClusterException)):
            return exc
        exc, seen = exc.__cause__, seen + 1
    return None


#: A Redis error prefix: an upper-case word (redis-py reads them the same way).
_ERROR_PREFIX = re.compile(r"[A-Z][A-Z0-9_]{0,63}")


def _status_code(error: BaseException) -> str | None:
    """The error prefix of a Redis error reply (``OOM``, ``WRONGTYPE``, ``ERR``...): as
    redis-py read it (also on the replies it makes connection errors: ``NOAUTH``,
    ``LOADING``), or the first word of a reply it kept whole; None for an error Redis did
    not answer (a dropped connection, a timeout). Only the prefix: the rest of the reply
    can quote keys or arguments."""
    seen: BaseException | None = error
    for _ in range(8):  # a copy settle made of it (one per call of a batch) names its cause
        if not isinstance(seen, RedisError):
            return None
        code = getattr(seen, "status_code", None)
        if isinstance(code, str) and _ERROR_PREFIX.fullmatch(code):
            return code
        first = (str(seen.args[0]) if seen.args else "").split(" ", 1)[0]
        if isinstance(seen, ResponseError) and _ERROR_PREFIX.fullmatch(first):
            return first
        seen = seen.__cause__
    return None


class _Call(_Span):
    """A settle call's span: its result's attributes and counters (:meth:`done`)."""

    __slots__ = ("name", "namespace")

    def __init__(self, otel: Otel, span: Any, name: str, namespace: str) -> None:
        super().__init__(otel, span, otel.finish_call)
        self.name = name
        self.namespace = namespace

    def done(self, result: T) -> T:
        """Record what ``result`` says (outcome, verdict, kind, takeover) and return it."""
        _quietly(self._otel.observe, self, result)
        return result


class _Operation(_Span):
    """The decorator's span of one operation; each attempt a child span, current while it
    runs and settles."""

    __slots__ = ("_current", "attempts")

    def __init__(self, otel: Otel, span: Any) -> None:
        super().__init__(otel, span)
        self._current: _Span | None = None
        self.attempts = 0

    def attempt(self, attempt: Any) -> None:
        """An attempt (a :class:`~settle.attempt.Attempt`) starts running."""
        self.attempt_done()
        self.attempts += 1
        span = self._otel.start(
            "settle.attempt",
            attributes={
                "settle.attempt.number": int(attempt.number),
                "settle.generation": int(attempt.generation),
            },
        )
        if span is not None:
            self._current = _Span(self._otel, span)

    def ran(self, ran: Any) -> None:
        """What the attempt's function did (the decorator's ``Ran``): its error's class,
        a lost lease."""
        current = self._current
        if current is None:
            return
        if ran.error is not None:
            current.set("error.type", type(ran.error).__qualname__)
            _quietly(current.span.set_status, self._otel.trace.StatusCode.ERROR)
        if ran.lost is not None:
            current.set("settle.lease.lost", True)

    def capture(self) -> _Resume | _Nothing:
        """The current context (the running attempt's span), to be made current again
        around work another thread does for the attempt (``with captured: ...``): the
        sync heartbeat's renewals are children of the attempt they renew."""
        return _capture(self._otel)

    def attempt_done(self, kind: type[BaseException] | None = None) -> None:
        current, self._current = self._current, None
        if current is not None:
            current.__exit__(kind, None, None)

    def __exit__(self, kind: type[BaseException] | None, exc: object, tb: object) -> None:
        self.attempt_done(kind)
        self.set("settle.attempts", self.attempts)
        if kind is None:
            self.set("settle.outcome", "completed" if self.attempts else "replayed")
        super().__exit__(kind, exc, tb)


#: What a settle call's ``with`` block holds: ``span.done(result)`` returns ``result``.
CallSpan = _Call | _Nothing


class _Tally:
    """One counter, counted in this process and reported through an *observable* counter
    when the application's metric reader collects.

    A synchronous counter's ``add`` costs the SDK about 10 µs (its attributes hashed, a
    measurement built and handed to every reader) on every call; a tally is a dict update
    under a lock, and the SDK's work happens once per collection instead. The readers see
    the same monotonic sum with the same attributes. ``names`` are the attributes, in the
    order :meth:`add` is given their values (None: the attribute is absent)."""

    __slots__ = ("_counts", "_lock", "_names")

    def __init__(
        self, meter: Any, name: str, unit: str, description: str, names: tuple[str, ...]
    ) -> None:
        self._names = names
        self._counts: dict[tuple[Any, ...], int] = {}
        self._lock = threading.Lock()
        _TALLIES.append(self)
        meter.create_observable_counter(
            name, callbacks=[self._observe], unit=unit, description=description
        )

    def add(self, *values: Any) -> None:
        with self._lock:
            self._counts[values] = self._counts.get(values, 0) + 1

    def _observe(self, _options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation  # noqa: PLC0415  # imported by now

        with self._lock:
            counted = list(self._counts.items())
        names = self._names
        return [
            Observation(n, {k: v for k, v in zip(names, values, strict=True) if v is not None})
            for values, n in counted
        ]

    def _forked(self) -> None:
        # The child is another process: its counts start at zero, and a lock another
        # thread held at the fork would never be released in it.
        self._lock = threading.Lock()
        self._counts = {}


_TALLIES: list[_Tally] = []


def _after_fork() -> None:
    for tally in _TALLIES:
        tally._forked()
    _failed._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)

_NS = "settle.namespace"
#: The server attributes a messaging span and its duration carry (the stream's server).
_SERVER = ("server.address", "server.port")
_MESSAGING = (
    "messaging.system",
    "messaging.operation.type",
    "messaging.operation.name",
    "messaging.destination.name",
    "messaging.consumer.group.name",
)


#: The bucket boundaries (seconds) the histograms ask for. Without them the SDK's default
#: boundaries (0, 5, 10, 25, ... 10000: made for milliseconds) put every settle call, a
#: fraction of a millisecond to a few on a near Redis, in its first bucket (0, 5 s], and a
#: percentile read from the buckets said about 5 s. A call's: 100 µs to 10 s (a retried
#: or ``min_replicas`` call waits seconds), at most 2.5 times apart.
CALL_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
#: ``messaging.client.operation.duration``'s, as the messaging semantic conventions give them.
MESSAGING_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)

#: The plain context key ``suppress_instrumentation()`` also sets (the instrumentations'
#: ``is_instrumentation_enabled`` reads it beside the API's own key).
_SUPPRESS_PLAIN = "suppress_instrumentation"

#: The API's own providers, in place until the application sets one (by class name: some
#: are private to the API).
_UNSET_PROVIDERS = frozenset(
    {
        "ProxyTracerProvider",
        "NoOpTracerProvider",
        "_DefaultTracerProvider",
        "_ProxyMeterProvider",
        "NoOpMeterProvider",
        "_DefaultMeterProvider",
    }
)


class Otel:
    """The hooks over OpenTelemetry's API (global providers, scope ``settle``)."""

    enabled = True

    def __init__(self, context: Any, metrics: Any, trace: Any) -> None:
        from settle import __version__  # noqa: PLC0415  # settle is imported by now

        self.context = context
        self.trace = trace
        self._metrics = metrics
        self._live = False
        self._metrics_internal = sys.modules.get("opentelemetry.metrics._internal")
        # The key ``suppress_instrumentation()`` sets (beside the plain name, which the
        # instrumentations still read and an older ``opentelemetry-instrumentation`` sets).
        self._suppress_key = getattr(context, "_SUPPRESS_INSTRUMENTATION_KEY", _SUPPRESS_PLAIN)
        self._env_unset = not {"OTEL_PYTHON_TRACER_PROVIDER", "OTEL_PYTHON_METER_PROVIDER"} & set(
            os.environ
        )
        self.tracer = trace.get_tracer(SCOPE, __version__)
        meter = metrics.get_meter(SCOPE, __version__)
        self._client = trace.SpanKind.CLIENT
        self.reservations = _Tally(
            meter,
            "settle.reservations",
            "{reservation}",
            "Reservations by outcome",
            (_NS, "settle.outcome"),
        )
        self.settlements = _Tally(
            meter,
            "settle.settlements",
            "{settlement}",
            "Settlements by action and verdict",
            (_NS, "settle.action", "settle.verdict"),
        )
        self.quarantined = _Tally(
            meter,
            "settle.quarantine.entries",
            "{entry}",
            "Quarantine entries written, by kind",
            (_NS, "settle.quarantine.kind", "settle.action"),
        )
        self.quarantine_repeats = _Tally(
            meter,
            "settle.quarantine.repeats",
            "{delivery}",
            "Rejected responses delivered again (kept as their first entry), by kind",
            (_NS, "settle.quarantine.kind", "settle.action"),
        )
        self.takeovers = _Tally(
            meter,
            "settle.takeovers",
            "{takeover}",
            "Takeovers by reason",
            (_NS, "settle.takeover.reason"),
        )
        self.leases_lost = _Tally(
            meter,
            "settle.leases.lost",
            "{lease}",
            "Renewals that found the lease lost",
            (_NS, "settle.renew.reason"),
        )
        self.renewals_failed = _Tally(
            meter,
            "settle.renewals.failed",
            "{renewal}",
            "Renewals that raised (store unavailable)",
            (_NS, "error.type"),
        )
        self.http = _Tally(
            meter,
            "settle.http.requests",
            "{request}",
            "Guarded HTTP requests by outcome",
            (_NS, "settle.http.outcome"),
        )
        self.delivery_settlements = _Tally(
            meter,
            "settle.progress.settlements",
            "{settlement}",
            "Delivery settlements by outcome",
            (*_MESSAGING, "error.type", "settle.outcome"),
        )
        self.call_duration = meter.create_histogram(
            "settle.call.duration",
            "s",
            "Duration of settle calls",
            explicit_bucket_boundaries_advisory=CALL_BUCKETS,
        )
        self.messaging_duration = meter.create_histogram(
            "messaging.client.operation.duration",
            "s",
            "Duration of delivery settlements",
            explicit_bucket_boundaries_advisory=MESSAGING_BUCKETS,
        )

    def idle(self) -> bool:
        """True while the application has set neither a tracer nor a meter provider (the
        API is installed, often pulled in by another package, but nothing would record):
        every hook then hands out the shared no-op, as if OpenTelemetry were absent. Once
        a provider is set (it cannot be unset), this is False for good."""
        if self._live:
            return False
        if self._globals_unset():
            return True
        try:
            unset = (
                type(self.trace.get_tracer_provider()).__name__ in _UNSET_PROVIDERS
                and type(self._metrics.get_meter_provider()).__name__ in _UNSET_PROVIDERS
            )
        except Exception as error:  # noqa: BLE001  # a provider that cannot load: report nothing
            _failed(error)
            return True
        if unset:
            return True
        self._live = True
        return False

    def off(self) -> bool:
        """True when nothing is to be reported: no provider is set (:meth:`idle`), or the
        work runs under OpenTelemetry's ``suppress_instrumentation()`` (what an application
        and the SDK's own exporters use to say "report nothing of this"), which
        OpenTelemetry's own instrumentations honour by making no span and recording no
        measurement."""
        return self.idle() or self.suppressed()

    def suppressed(self) -> bool:
        """Whether the current context is under ``suppress_instrumentation()`` (True when
        OpenTelemetry raised: report nothing)."""
        try:
            current = self.context.get_current()
            return bool(current.get(self._suppress_key) or current.get(_SUPPRESS_PLAIN))
        except Exception as error:  # noqa: BLE001  # a context that cannot be read
            _failed(error)
            return True

    def _globals_unset(self) -> bool:
        """The quick answer on every call while nothing is set: the API's own globals are
        still None and no environment variable names a provider (``get_tracer_provider``
        reads the environment on each call, several times per settle call otherwise).
        False when unsure; :meth:`idle` then asks the API."""
        return (
            self._env_unset
            and getattr(self.trace, "_TRACER_PROVIDER", False) is None
            and getattr(self._metrics_internal, "_METER_PROVIDER", False) is None
        )

    def start(self, name: str, **options: Any) -> Any:
        """``tracer.start_span(name, **options)``; None when it raised (logged)."""
        return _quietly(self.tracer.start_span, name, **options)

    def attach(self, span: Any = None, context: Any = None) -> Any:
        """Make ``span`` current (or ``context``, a captured context); the token to detach,
        None when OpenTelemetry raised (logged)."""
        if span is not None:
            context = _quietly(self.trace.set_span_in_context, span)
        return None if context is None else _quietly(self.context.attach, context)

    # -- settle calls ----------------------------------------------------------------------

    def call(self, name: str, namespace: str, subject: Any = None) -> _Call | _Nothing:
        """The span of one settle call (``settle.<name>``); ``subject`` is the reservation
        a settlement or renewal presents (its generation is recorded)."""
        if self.off():
            return _NOTHING
        span = self.start(f"settle.{name}", attributes={"settle.namespace": namespace})
        if span is None:
            return _NOTHING
        call = _Call(self, span, name, namespace)
        generation = getattr(subject, "generation", None)
        if isinstance(generation, int):
            call.set("settle.generation", generation)
        return call

    def observe(self, call: _Call, result: Any) -> None:
        ns = call.namespace
        kind = type(result).__name__
        if kind == "Reserved":
            call.set("settle.outcome", "reserved")
            call.set("settle.generation", result.reservation.generation)
            call.set("settle.takeover", result.takeover)
            if result.takeover:
                self.takeovers.add(ns, result.takeover)
        elif kind == "Replay":
            call.set("settle.outcome", "replayed")
            call.set("settle.generation", result.record.generation)
        elif kind == "InProgress":
            call.set("settle.outcome", "in_progress")
            call.set("settle.generation", result.generation)
        elif kind == "Settlement":
            action, verdict = result.action.value, result.verdict.value
            call.set("settle.action", action)
            call.set("settle.verdict", verdict)
            call.set("settle.outcome", verdict)
            self.settlements.add(ns, action, verdict)
            if result.kind is not None:
                call.set("settle.quarantine.kind", result.kind.value)
                # A repeat of a rejected response stays one entry (SPEC 3): not counted again.
                if result.quarantine_repeated:
                    call.set("settle.quarantine.repeated", True)
                    self.quarantine_repeats.add(ns, result.kind.value, action)
                else:
                    self.quarantined.add(ns, result.kind.value, action)
        elif kind == "Renewal":
            call.set("settle.outcome", "renewed" if result.renewed else "lost")
            if not result.renewed:
                call.set("settle.renew.reason", result.reason)
                self.leases_lost.add(ns, result.reason or "")

    def finish_call(self, call: _Call, kind: type[BaseException] | None, seconds: float) -> None:
        if call.name == "reserve":
            if kind is not None and kind.__name__ in _REFUSALS:
                call.set("settle.outcome", _REFUSALS[kind.__name__])
            if outcome := call.attributes.get("settle.outcome"):
                self.reservations.add(call.namespace, outcome)
        elif call.name == "renew" and kind is not None:
            self.renewals_failed.add(call.namespace, kind.__qualname__)
        measured = {_NS: call.namespace, "settle.call.name": call.name}
        for key in ("settle.outcome", "error.type"):
            if key in call.attributes:
                measured[key] = call.attributes[key]
        self.call_duration.record(seconds, measured)

    # -- Redis -----------------------------------------------------------------------------

    def redis(
        self,
        client: Any,
        operation: str,
        call: Any = None,
        *,
        batch: int | None = None,
        key: str | None = None,
    ) -> _Span | _Nothing:
        """A client span of one Redis call: ``EVALSHA`` of ``call``'s script (its stored
        procedure name), a ``PIPELINE`` of ``batch`` calls, or a plain command (of ``key``
        alone, when it names one: on a cluster, the span names the node of its slot).

        None inside a span that is not recorded (its trace was sampled out): a child of it
        would be sampled out too (a ``ParentBased`` sampler, the SDK's default), and making
        one would cost as much as the call's own span."""
        if self.off():
            return _NOTHING
        sampled_out = _quietly(self._sampled_out)
        if sampled_out or sampled_out is None:  # None: OpenTelemetry raised
            return _NOTHING
        attributes: dict[str, Any] = {"db.system.name": "redis", "db.operation.name": operation}
        name = operation
        if call is not None:
            attributes["db.stored_procedure.name"] = name = call.script
            name = f"{operation} {call.script}"
        if batch is not None:
            attributes["db.operation.batch.size"] = batch
        if call is not None and call.keys:
            key = call.keys[0]
        attributes.update(_settings(client, key))
        span = self.start(name, kind=self._client, attributes=attributes)
        return _NOTHING if span is None else _Client(self, span, leaf=True)

    def pipeline(self, client: Any, operation: str, calls: list[Any]) -> _Span | _Nothing:
        """A client span of ``calls`` sent in one pipeline, each made with ``operation``
        (``FCALL`` or ``EVALSHA``): ``PIPELINE`` and its batch size; a pipeline of one call
        is that call's span, as the semantic conventions say a batch size SHOULD never be
        1."""
        if len(calls) == 1:
            return self.redis(client, operation, calls[0])
        return self.redis(client, "PIPELINE", batch=len(calls))

    def _sampled_out(self) -> bool:
        parent = self.trace.get_current_span()
        return not parent.is_recording() and bool(parent.get_span_context().is_valid)

    # -- the decorator ---------------------------------------------------------------------

    def operation(self, namespace: str, function: Any) -> _Operation | _Nothing:
        """The span of one call of the decorated ``function``."""
        if self.idle():
            return _NOTHING
        if self.suppressed():
            return _Muted(self)
        span = self.start(
            "settle.operation",
            attributes={"settle.namespace": namespace, "code.function.name": _named(function)},
        )
        return _NOTHING if span is None else _Operation(self, span)

    # -- HTTP ------------------------------------------------------------------------------

    def http_request(self, namespace: str) -> _Request | _Nothing:
        """A guarded request, on the current span (the HTTP server span of the
        application's instrumentation) at its start."""
        if self.idle():
            return _NOTHING
        if self.suppressed():
            return _Muted(self)
        span = _quietly(self.trace.get_current_span)
        return _NOTHING if span is None else _Request(self, span, namespace)

    # -- delivery progress -----------------------------------------------------------------

    def settling(
        self, scope: Any, kind: Any, consumer: str, client: Any = None
    ) -> _Settling | _Nothing:
        """The span of one delivery settlement (messaging conventions, operation type
        ``settle``) on the stream's server, ``client``; :meth:`_Span.done` takes its
        receipt."""
        if self.off():
            return _NOTHING
        name = str(kind.value)
        attributes: dict[str, Any] = {
            "messaging.system": "redis",
            "messaging.operation.type": "settle",
            "messaging.operation.name": name,
            "messaging.destination.name": scope.stream,
            "messaging.consumer.group.name": scope.group,
            "settle.progress.consumer": consumer,
        }
        # The broker, as the messaging conventions require it when known: the stream's
        # server (on a cluster, the node that serves the stream's slot).
        server = _quietly(_settings, client, scope.stream) if client is not None else None
        for key in _SERVER:
            if server and key in server:
                attributes[key] = server[key]
        span = self.start(f"{name} {scope.stream}", kind=self._client, attributes=attributes)
        return _NOTHING if span is None else _Settling(self, span, attributes)

    def finish_settling(
        self, settling: _Settling, kind: type[BaseException] | None, seconds: float
    ) -> None:
        measured = {k: settling.base[k] for k in _MESSAGING}
        for key in _SERVER:
            if key in settling.base:
                measured[key] = settling.base[key]
        error = kind.__qualname__ if kind is not None else None
        if error is not None:
            measured["error.type"] = error
        self.messaging_duration.record(seconds, measured)
        outcome = settling.attributes.get("settle.outcome", "error")
        self.delivery_settlements.add(*(measured[k] for k in _MESSAGING), error, outcome)


def _named(function: Any) -> str:
    """``function``'s fully-qualified name, as the semantic conventions ask of
    ``code.function.name``: its module and qualified name (``shop.payments.charge``,
    ``shop.billing.Billing.charge`` for a method)."""
    qualname = getattr(function, "__qualname__", None) or getattr(function, "__name__", "")
    module = getattr(function, "__module__", None)
    return f"{module}.{qualname}" if isinstance(module, str) and module else str(qualname)


class _Request:
    """A guarded HTTP request: its outcome goes on the server span (which OpenTelemetry's
    ASGI instrumentation ends with the response's last message, so the shell reports it
    before sending that) and into ``settle.http.requests`` once the request is done."""

    __slots__ = ("_namespace", "_otel", "_span")

    def __init__(self, otel: Otel, span: Any, namespace: str) -> None:
        self._otel = otel
        self._span = span
        self._namespace = namespace

    def answered(self, outcome: str | None) -> None:
        if outcome is not None:
            _quietly(self._answered, outcome)

    def _answered(self, outcome: str) -> None:
        if self._span.is_recording():
            self._span.set_attribute("settle.http.outcome", outcome)
            self._span.set_attribute("settle.namespace", self._namespace)

    def finished(self, outcome: str | None) -> None:
        if outcome is None:
            return
        self.answered(outcome)
        self._otel.http.add(self._namespace, outcome)

    def capture(self) -> _Resume | _Nothing:
        """The current context (the request's server span), for the WSGI guard's heartbeat
        thread: its renewals are children of the request they renew."""
        return _capture(self._otel)


def _capture(otel: Otel) -> _Resume | _Nothing:
    """The current context, to be made current again in another thread."""
    captured = _quietly(otel.context.get_current)
    return _NOTHING if captured is None else _Resume(otel, captured)


class _Resume:
    """A captured context, made current for a ``with`` block (in any thread)."""

    __slots__ = ("_context", "_otel", "_token")

    def __init__(self, otel: Otel, context: Any) -> None:
        self._otel = otel
        self._context = context
        self._token: Any = None

    def __enter__(self) -> Self:
        self._token = self._otel.attach(context=self._context)
        return self

    def __exit__(self, *_: object) -> None:
        token, self._token = self._token, None
        if token is not None:
            _quietly(self._otel.context.detach, token)


class _Settling(_Span):
    __slots__ = ("base",)

    def __init__(self, otel: Otel, span: Any, base: dict[str, Any]) -> None:
        super().__init__(otel, span, otel.finish_settling)
        self.base = base

    def done(self, receipt: Any) -> Any:
        """Record the provider's answer to the settlement and return ``receipt``."""
        self.set("settle.outcome", receipt.outcome.value)
        return receipt
