"""The span objects settle's telemetry hooks hand out (``settle._telemetry.Otel``): a
settle call's, a Redis call's base, the decorator's operation and its attempts, a guarded
HTTP request (the application's server span), a delivery settlement, and the no-op a hook
hands out when nothing is to be reported.

Every call into OpenTelemetry goes through ``otel.quietly`` (a raising span processor or
exporter is logged and dropped: telemetry never changes what settle does).
"""

from __future__ import annotations

import threading
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
    "forked",
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

    set = attempt = ran = attempt_done = answered = finished = _nothing


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
        self._end()

    def _end(self) -> None:
        self._otel.quietly(self.span.end)

    def _failed(self, kind: type[BaseException], _exc: object) -> None:
        """Name the error the block raised (its class: never its message)."""
        self.attributes["error.type"] = kind.__qualname__


#: Guards the count of every :class:`Held` span (a few per decorated call: uncontended).
_HOLDS = threading.Lock()


def forked() -> None:
    """In a child process after a fork: a new :data:`_HOLDS` (a heartbeat thread of the
    parent held it at the fork would leave it held for good in the child, where that
    thread does not exist, and hang the child's first decorated call)."""
    global _HOLDS  # noqa: PLW0603  # the one lock, replaced as the tallies' are
    _HOLDS = threading.Lock()


class Held(Span):
    """A span other threads work under (the sync heartbeat's renewals under their attempt,
    the attempts under their operation): it ends when its block has exited and the last of
    that work is done (:meth:`hold`, :meth:`release`), so that no child outlives it. A
    ``holder`` is held until this span ends."""

    __slots__ = ("_closing", "_holder", "_holds")

    def __init__(self, otel: Otel, span: Any, holder: Held | None = None) -> None:
        super().__init__(otel, span)
        self._holds = 0
        self._closing = False
        self._holder = holder
        if holder is not None:
            holder.hold()

    def hold(self) -> bool:
        """Keep the span open for work done under it until :meth:`release`; False (nothing
        held) when it has ended."""
        with _HOLDS:
            if self._closing and not self._holds:
                return False
            self._holds += 1
            return True

    def release(self) -> None:
        with _HOLDS:
            self._holds -= 1
            if self._holds or not self._closing:
                return
        self._ended()

    def _end(self) -> None:
        with _HOLDS:
            self._closing = True
            if self._holds:
                return  # the last release ends it
        self._ended()

    def _ended(self) -> None:
        self._otel.quietly(self.span.end)
        if self._holder is not None:
            self._holder.release()


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


class Operation(Held):
    """The decorator's span of one operation; each attempt a child span, current while it
    runs and settles."""

    __slots__ = ("_current", "attempts")

    def __init__(self, otel: Otel, span: Any) -> None:
        super().__init__(otel, span)
        self._current: Held | None = None
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
            self._current = Held(self._otel, span, self)

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
        sync heartbeat's renewals are children of the attempt they renew, which ends after
        them (a renewal in flight when the attempt ends holds it open)."""
        return capture(self._otel, self._current or self)

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


def capture(otel: Otel, holder: Held | None = None) -> Resume | Nothing:
    """The current context, to be made current again in another thread; ``holder``, the
    current span when settle made it, is held open while it is."""
    captured = otel.quietly(otel.context.get_current)
    return NOTHING if captured is None else Resume(otel, captured, holder)


class Resume:
    """A captured context, made current for a ``with`` block (in any thread), its
    ``holder`` held open meanwhile; once the holder has ended, the block's spans are not
    its children (they would outlive it) but roots of their own."""

    __slots__ = ("_context", "_held", "_holder", "_otel", "_token")

    def __init__(self, otel: Otel, context: Any, holder: Held | None = None) -> None:
        self._otel = otel
        self._context = context
        self._holder = holder
        self._held = False
        self._token: Any = None

    def __enter__(self) -> Self:
        context, holder = self._context, self._holder
        if holder is not None:
            self._held = holder.hold()
            if not self._held:
                trace = self._otel.trace
                context = self._otel.quietly(trace.set_span_in_context, trace.INVALID_SPAN, context)
        self._token = self._otel.attach(context=context)
        return self

    def __exit__(self, *_: object) -> None:
        token, self._token = self._token, None
        if token is not None:
            self._otel.quietly(self._otel.context.detach, token)
        holder = self._holder
        if self._held and holder is not None:
            self._held = False
            holder.release()


class Settling(Span):
    __slots__ = ("base",)

    def __init__(self, otel: Otel, span: Any, base: dict[str, Any]) -> None:
        super().__init__(otel, span, otel.finish_settling)
        self.base = base

    def done(self, receipt: Any) -> Any:
        """Record the provider's answer to the settlement and return ``receipt``."""
        self.set("settle.outcome", receipt.outcome.value)
        return receipt
