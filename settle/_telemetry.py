"""OpenTelemetry traces and metrics for every part of settle: the hooks every part calls
(:class:`Otel`, or :data:`NOOP`) and the guard around every call into OpenTelemetry. This
is the one module that imports ``opentelemetry``; the span objects, a Redis call's client
span and the instruments it builds are in ``settle/_otel`` (spans, redis_spans, metrics).

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
import sys
import threading
import time
from typing import Any

from settle._log import logger
from settle._otel.metrics import (
    CALL_BUCKETS,
    MESSAGING,
    MESSAGING_BUCKETS,
    NS,
    Instruments,
    forked,
)
from settle._otel.redis_spans import Client, server_attributes
from settle._otel.redis_spans import status_code as _status_code
from settle._otel.spans import (
    NOTHING,
    Call,
    CallSpan,
    Muted,
    Nothing,
    Operation,
    Request,
    Settling,
    Span,
)

__all__ = [
    "CALL_BUCKETS",
    "MESSAGING_BUCKETS",
    "NOOP",
    "SCOPE",
    "CallSpan",
    "_status_code",
    "telemetry",
]

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


class Noop:
    """Every hook, doing nothing (OpenTelemetry is not importable)."""

    __slots__ = ()
    enabled = False

    def _nothing(self, *_: Any, **__: Any) -> Nothing:
        return NOTHING

    call = check = read_apart = redis = pipeline = operation = settling = _nothing

    def http_request(self, *_: Any) -> Nothing:
        return NOTHING


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


def _after_fork() -> None:
    forked()
    _failed._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


#: The server attributes a messaging span and its duration carry (the stream's server).
_SERVER = ("server.address", "server.port")
#: The node a messaging span's settlement went to, on a cluster (the span only).
_PEER = ("network.peer.address", "network.peer.port")

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
        self.instruments = Instruments(meter, metrics.Observation)

    def idle(self) -> bool:
        """True while the application has set neither a tracer nor a meter provider (the
        API is installed, often pulled in by another package, but nothing would record):
        every hook then hands out the shared no-op, as if OpenTelemetry were absent. Once
        a provider is set (it cannot be unset), this is False for good."""
        if self._live:
            return False
        # The quick answer on every call while nothing is set, written out here (a frame
        # fewer on each of a request's checks; docs/benchmarks.md, the twenty-third round):
        # the API's own globals are still None and no environment variable names a provider
        # (``get_tracer_provider`` reads the environment on each call, several times per
        # settle call otherwise). When unsure, the API is asked below.
        if (
            self._env_unset
            and getattr(self.trace, "_TRACER_PROVIDER", False) is None
            and getattr(self._metrics_internal, "_METER_PROVIDER", False) is None
        ):
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

    def quiet(self) -> Nothing | None:
        """What a hook of work that carries its context to another thread (the decorator's
        operation, a guarded HTTP request: their heartbeat renews in a thread) hands out
        when nothing is to be reported (:meth:`off`), None when it is: under
        ``suppress_instrumentation()``, a :class:`Muted` that carries the suppression to
        that thread, so that its renewals are not reported either."""
        if self.idle():
            return NOTHING
        if self.suppressed():
            return Muted(self)
        return None

    def suppressed(self) -> bool:
        """Whether the current context is under ``suppress_instrumentation()`` (True when
        OpenTelemetry raised: report nothing)."""
        try:
            current = self.context.get_current()
            return bool(current.get(self._suppress_key) or current.get(_SUPPRESS_PLAIN))
        except Exception as error:  # noqa: BLE001  # a context that cannot be read
            _failed(error)
            return True

    @staticmethod
    def quietly(call: Any, *args: Any, **kwargs: Any) -> Any:
        """:func:`_quietly`, for the span objects (``settle._otel``)."""
        return _quietly(call, *args, **kwargs)

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

    def call(self, name: str, namespace: str, subject: Any = None) -> Call | Nothing:
        """The span of one settle call (``settle.<name>``); ``subject`` is the reservation
        a settlement or renewal presents (its generation is recorded)."""
        if self.off():
            return NOTHING
        span = self.start(f"settle.{name}", attributes={"settle.namespace": namespace})
        if span is None:
            return NOTHING
        call = Call(self, span, name, namespace)
        generation = getattr(subject, "generation", None)
        if isinstance(generation, int):
            call.set("settle.generation", generation)
        return call

    def check(self, namespace: str) -> Span | Nothing:
        """The span of a settler's set-up before its first call (``settle.check``), its
        Redis calls inside. No measurement: ``settle.call.duration`` is the duration of the
        calls an application makes, not of a start-up's server checks."""
        if self.off():
            return NOTHING
        span = self.start("settle.check", attributes={"settle.namespace": namespace})
        return NOTHING if span is None else Span(self, span)

    def read_apart(self, script: str) -> Span | Nothing:
        """The span of a read a cluster resharding refused, read again one key at a time
        (``settle.cluster.read_apart``), its plain commands inside: one trace, where the
        stores of ``settle.cursor`` and ``settle.progress``, which have no call span, made
        a root span of each command."""
        if self.off():
            return NOTHING
        span = self.start(
            "settle.cluster.read_apart", attributes={"db.stored_procedure.name": script}
        )
        return NOTHING if span is None else Span(self, span)

    def observe(self, call: Call, result: Any) -> None:
        ns = call.namespace
        kind = type(result).__name__
        if kind == "Reserved":
            call.set("settle.outcome", "reserved")
            call.set("settle.generation", result.reservation.generation)
            call.set("settle.takeover", result.takeover)
            if result.takeover:
                self.instruments.takeovers.add(ns, result.takeover)
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
            self.instruments.settlements.add(ns, action, verdict)
            if result.kind is not None:
                call.set("settle.quarantine.kind", result.kind.value)
                # A repeat of a rejected response stays one entry (SPEC 3): not counted again.
                if result.quarantine_repeated:
                    call.set("settle.quarantine.repeated", True)
                    self.instruments.quarantine_repeats.add(ns, result.kind.value, action)
                else:
                    self.instruments.quarantined.add(ns, result.kind.value, action)
        elif kind == "Renewal":
            call.set("settle.outcome", "renewed" if result.renewed else "lost")
            if not result.renewed:
                call.set("settle.renew.reason", result.reason)
                self.instruments.leases_lost.add(ns, result.reason or "")

    def finish_call(self, call: Call, kind: type[BaseException] | None, seconds: float) -> None:
        if call.name == "reserve":
            if kind is not None and kind.__name__ in _REFUSALS:
                call.set("settle.outcome", _REFUSALS[kind.__name__])
            if outcome := call.attributes.get("settle.outcome"):
                self.instruments.reservations.add(call.namespace, outcome)
        elif call.name == "renew" and kind is not None:
            self.instruments.renewals_failed.add(call.namespace, kind.__qualname__)
        measured = {NS: call.namespace, "settle.call.name": call.name}
        for key in ("settle.outcome", "error.type"):
            if key in call.attributes:
                measured[key] = call.attributes[key]
        self.instruments.call_duration.record(seconds, measured)

    # -- Redis -----------------------------------------------------------------------------

    def redis(
        self,
        client: Any,
        operation: str,
        call: Any = None,
        *,
        batch: int | None = None,
        key: str | None = None,
        script: str | None = None,
    ) -> Client | Nothing:
        """A client span of one Redis call: ``EVALSHA`` of ``call``'s script (its stored
        procedure name), a ``PIPELINE`` of ``batch`` calls (of one ``script``: its name), or
        a plain command (of ``key`` alone, when it names one: on a cluster, the span names
        the node of its slot).

        None inside a span that is not recorded (its trace was sampled out): a child of it
        would be sampled out too (a ``ParentBased`` sampler, the SDK's default), and making
        one would cost as much as the call's own span."""
        if self.off():
            return NOTHING
        sampled_out = _quietly(self._sampled_out)
        if sampled_out or sampled_out is None:  # None: OpenTelemetry raised
            return NOTHING
        attributes: dict[str, Any] = {"db.system.name": "redis", "db.operation.name": operation}
        name = operation
        if call is not None:
            attributes["db.stored_procedure.name"] = name = call.script
            name = f"{operation} {call.script}"
        if batch is not None:
            attributes["db.operation.batch.size"] = batch
            if script is not None:
                attributes["db.stored_procedure.name"] = script
        if call is not None and call.keys:
            key = call.keys[0]
        attributes.update(server_attributes(client, key))
        span = self.start(name, kind=self._client, attributes=attributes)
        return NOTHING if span is None else Client(self, span, leaf=True)

    def pipeline(self, client: Any, operation: str, calls: list[Any]) -> Client | Nothing:
        """A client span of ``calls`` sent in one pipeline, each made with ``operation``
        (``FCALL`` or ``EVALSHA``): ``PIPELINE`` and its batch size, and the script when
        every call runs the same one; a pipeline of one call is that call's span, as the
        semantic conventions say a batch size SHOULD never be 1.

        ``PIPELINE``, not the Redis conventions' ``PIPELINE FCALL`` / ``PIPELINE EVALSHA``
        (conventions in development): the name dashboards filter on, the same whichever way
        the server runs scripts."""
        if len(calls) == 1:
            return self.redis(client, operation, calls[0])
        scripts = {call.script for call in calls}
        script = scripts.pop() if len(scripts) == 1 else None
        return self.redis(client, "PIPELINE", batch=len(calls), script=script)

    def _sampled_out(self) -> bool:
        parent = self.trace.get_current_span()
        return not parent.is_recording() and bool(parent.get_span_context().is_valid)

    # -- the decorator ---------------------------------------------------------------------

    def operation(self, namespace: str, function: Any) -> Operation | Nothing:
        """The span of one call of the decorated ``function``."""
        if (quiet := self.quiet()) is not None:
            return quiet
        span = self.start(
            "settle.operation",
            attributes={"settle.namespace": namespace, "code.function.name": _named(function)},
        )
        return NOTHING if span is None else Operation(self, span)

    # -- HTTP ------------------------------------------------------------------------------

    def http_request(self, namespace: str) -> Request | Nothing:
        """A guarded request, on the current span (the HTTP server span of the
        application's instrumentation) at its start."""
        if (quiet := self.quiet()) is not None:
            return quiet
        span = _quietly(self.trace.get_current_span)
        return NOTHING if span is None else Request(self, span, namespace)

    # -- delivery progress -----------------------------------------------------------------

    def settling(
        self, scope: Any, kind: Any, consumer: str, client: Any = None
    ) -> Settling | Nothing:
        """The span of one delivery settlement (messaging conventions, operation type
        ``settle``) on the stream's server, ``client``; :meth:`Span.done` takes its
        receipt."""
        if self.off():
            return NOTHING
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
        # server as configured; on a cluster, the node that serves the stream's slot is the
        # peer (the span's only: a metric keeps the configured server).
        server = _quietly(server_attributes, client, scope.stream) if client is not None else None
        for key in (*_SERVER, *_PEER):
            if server and key in server:
                attributes[key] = server[key]
        span = self.start(f"{name} {scope.stream}", kind=self._client, attributes=attributes)
        return NOTHING if span is None else Settling(self, span, attributes)

    def finish_settling(
        self, settling: Settling, kind: type[BaseException] | None, seconds: float
    ) -> None:
        measured = {k: settling.base[k] for k in MESSAGING}
        for key in _SERVER:
            if key in settling.base:
                measured[key] = settling.base[key]
        error = kind.__qualname__ if kind is not None else None
        if error is not None:
            measured["error.type"] = error
        self.instruments.messaging_duration.record(seconds, measured)
        outcome = settling.attributes.get("settle.outcome", "error")
        self.instruments.delivery_settlements.add(*(measured[k] for k in MESSAGING), error, outcome)


def _named(function: Any) -> str:
    """``function``'s fully-qualified name, as the semantic conventions ask of
    ``code.function.name``: its module and qualified name (``shop.payments.charge``,
    ``shop.billing.Billing.charge`` for a method)."""
    qualname = getattr(function, "__qualname__", None) or getattr(function, "__name__", "")
    module = getattr(function, "__module__", None)
    return f"{module}.{qualname}" if isinstance(module, str) and module else str(qualname)
