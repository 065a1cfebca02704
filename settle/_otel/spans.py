"""The span objects settle's telemetry hooks hand out (``settle._telemetry.Otel``): a
settle call's, a Redis call's base, the decorator's operation and its attempts, a guarded
HTTP request (the application's server span), a delivery settlement, and the no-op a hook
hands out when nothing is to be reported.

Every call into OpenTelemetry goes through ``otel.quietly`` (a raising span processor or
exporter is logged and dropped: telemetry never changes what settle does).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Self, TypeVar

if TYPE_CHECKING:
    from settle._telemetry import Otel

__all__ = [
    "NOTHING",
    "Call",
    "CallSpan",
    "Muted",
    "Nothing",
    "Operation",
    "Request",
    "Resume",
    "Settling",
    "Span",
    "capture",
]

T = TypeVar("T")


class Nothing:
    """A span that is no span: what every hook hands out when telemetry is off."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return False  # nothing to report: a shell may skip its reporting work

    def __enter__(self) -> Nothing:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def done(self, result: T) -> T:
        return result

    def capture(self) -> Resume | Nothing:
        return self

    def _nothing(self, *_: Any) -> None:
        return None

    set = attempt = ran = attempt_done = answered = finished = read_split = _nothing


NOTHING = Nothing()


class Muted(Nothing):
    """What the decorator's and the HTTP guard's hooks hand out under
    ``suppress_instrumentation()``: nothing reported, and the suppression carried to the
    heartbeat thread with the rest of the caller's context (:meth:`capture`), so that its
    renewals are not reported either."""

    __slots__ = ("_otel",)

    def __init__(self, otel: Otel) -> None:
        self._otel = otel

    def capture(self) -> Resume | Nothing:
        return capture(self._otel)


class Span:
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
            self._otel.quietly(self.span.set_status, self._otel.trace.StatusCode.ERROR)
        if self._finish is not None:
            self._otel.quietly(self._finish, self, kind, time.perf_counter() - self._start)
        if self._token is not None:
            self._otel.quietly(self._otel.context.detach, self._token)
        if self.attributes:
            self._otel.quietly(self.span.set_attributes, self.attributes)
        self._otel.quietly(self.span.end)

    def _failed(self, kind: type[BaseException], _exc: object) -> None:
        """Name the error the block raised (its class: never its message)."""
        self.attributes["error.type"] = kind.__qualname__


class Call(Span):
    """A settle call's span: its result's attributes and counters (:meth:`done`)."""

    __slots__ = ("name", "namespace")

    def __init__(self, otel: Otel, span: Any, name: str, namespace: str) -> None:
        super().__init__(otel, span, otel.finish_call)
        self.name = name
        self.namespace = namespace

    def done(self, result: T) -> T:
        """Record what ``result`` says (outcome, verdict, kind, takeover) and return it."""
        self._otel.quietly(self._otel.observe, self, result)
        return result


class Operation(Span):
    """The decorator's span of one operation; each attempt a child span, current while it
    runs and settles."""

    __slots__ = ("_current", "attempts")

    def __init__(self, otel: Otel, span: Any) -> None:
        super().__init__(otel, span)
        self._current: Span | None = None
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
            self._current = Span(self._otel, span)

    def ran(self, ran: Any) -> None:
        """What the attempt's function did (the decorator's ``Ran``): its error's class,
        a lost lease."""
        current = self._current
        if current is None:
            return
        if ran.error is not None:
            current.set("error.type", type(ran.error).__qualname__)
            self._otel.quietly(current.span.set_status, self._otel.trace.StatusCode.ERROR)
        if ran.lost is not None:
            current.set("settle.lease.lost", True)

    def capture(self) -> Resume | Nothing:
        """The current context (the running attempt's span), to be made current again
        around work another thread does for the attempt (``with captured: ...``): the
        sync heartbeat's renewals are children of the attempt they renew."""
        return capture(self._otel)

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
CallSpan = Call | Nothing


class Request:
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
            self._otel.quietly(self._answered, outcome)

    def _answered(self, outcome: str) -> None:
        if self._span.is_recording():
            self._span.set_attribute("settle.http.outcome", outcome)
            self._span.set_attribute("settle.namespace", self._namespace)

    def finished(self, outcome: str | None) -> None:
        if outcome is None:
            return
        self.answered(outcome)
        self._otel.instruments.http.add(self._namespace, outcome)

    def capture(self) -> Resume | Nothing:
        """The current context (the request's server span), for the WSGI guard's heartbeat
        thread: its renewals are children of the request they renew."""
        return capture(self._otel)


def capture(otel: Otel) -> Resume | Nothing:
    """The current context, to be made current again in another thread."""
    captured = otel.quietly(otel.context.get_current)
    return NOTHING if captured is None else Resume(otel, captured)


class Resume:
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
            self._otel.quietly(self._otel.context.detach, token)


class Settling(Span):
    __slots__ = ("base",)

    def __init__(self, otel: Otel, span: Any, base: dict[str, Any]) -> None:
        super().__init__(otel, span, otel.finish_settling)
        self.base = base

    def done(self, receipt: Any) -> Any:
        """Record the provider's answer to the settlement and return ``receipt``."""
        self.set("settle.outcome", receipt.outcome.value)
        return receipt
