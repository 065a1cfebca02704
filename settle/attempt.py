"""``Attempt``: one attempt of an operation, as the code that runs it sees it.

A decorated function may ask for it (``@settler.operation``), a guarded HTTP handler finds it
in ``scope["settle"]`` (the ASGI middleware) or through ``settle.fastapi.CurrentAttempt``: its
``generation`` is the fencing token and its ``idempotency_key`` the stable key to hand to the
downstream service."""

from __future__ import annotations

import hashlib
import time
from typing import Any, ClassVar, cast

from settle.errors import StaleAttempt
from settle.models import OperationRecord, Renewal, Reserved

__all__ = ["Attempt", "downstream_key"]


def downstream_key(namespace: str, binding: str, operation_id: str) -> str:
    """The downstream idempotency key: stable across every attempt of one operation, scoped
    by namespace and principal, and revealing neither."""
    raw = f"{namespace}\n{binding}\n{operation_id}".encode()
    return "settle_" + hashlib.sha256(raw).hexdigest()[:40]


class Attempt:
    """One reservation of an operation, as the decorated function sees it.

    Declare a parameter annotated ``Attempt`` (give it the default ``Attempt.INJECTED`` so
    that callers, and mypy, need not pass it) and the decorator fills it in:

    - ``operation_id``: the operation this attempt belongs to;
    - ``generation``: the fencing token. It grows with every reservation, so a downstream
      service that remembers the highest generation it has seen can refuse a stale writer;
    - ``number``: how many reservations the operation has had, this one included (1 for
      the first attempt ever, across every worker);
    - ``idempotency_key``: the same for every attempt of the operation (it derives from the
      namespace, the principal and the operation id, never from the generation). Send it
      as the downstream ``Idempotency-Key`` so that the provider deduplicates the retry
      that follows a timeout after its success;
    - ``lost`` / :meth:`check`: the heartbeat found the lease lost (taken over by a newer
      attempt, settled, or its record gone). Another worker may own the operation now; stop
      and do not start new effects. A lease that only lapsed, with no newer attempt, is not
      lost: the attempt still owns the operation and its settlement is accepted.
    - ``deadline`` / :meth:`remaining`: the ``timeout`` as a ``time.monotonic()`` instant.
      A sync function cannot be interrupted, so pass ``remaining()`` to your client.
    """

    INJECTED: ClassVar[Attempt]
    """Placeholder default for the ``Attempt`` parameter; replaced on every call."""

    __slots__ = (
        "_key",
        "_key_of",
        "_lost",
        "_renewal",
        "_stop",
        "attempt_id",
        "deadline",
        "generation",
        "number",
        "operation_id",
    )

    def __init__(
        self,
        *,
        operation_id: str,
        generation: int,
        number: int,
        idempotency_key: str,
        attempt_id: str,
        deadline: float | None = None,
    ) -> None:
        self.operation_id = operation_id
        self.generation = generation
        self.number = number
        self._key: str | None = idempotency_key
        #: What the key derives from when it is first read (None: ``_key`` is the key).
        self._key_of: tuple[str, str, str] | None = None
        self.attempt_id = attempt_id
        self.deadline = deadline
        #: Set once, by the heartbeat thread (after ``_renewal``); a flag, not a
        #: ``threading.Event`` (which costs a Condition and a Lock per attempt): nothing waits.
        self._lost = False
        self._renewal: Renewal | None = None
        self._stop: BaseException | None = None

    @classmethod
    def for_reservation(
        cls, reserved: Reserved, namespace: str, deadline: float | None = None
    ) -> Attempt:
        """The attempt a fresh reservation gives its function (or HTTP handler)."""
        r = reserved.reservation
        # Every slot set here, as ``__init__`` sets it (a test holds the two alike): its
        # call by keyword cost ~3,900 instructions more per first call (the twenty-first
        # round, docs/benchmarks.md).
        attempt = cls.__new__(cls)
        attempt.operation_id = r.operation_id
        attempt.generation = r.generation
        attempt.number = reserved.record.reservations
        # Derived when first read (a SHA-256 most functions never ask for): the same key.
        attempt._key = None
        attempt._key_of = (namespace, r.binding, r.operation_id)
        attempt.attempt_id = r.attempt_id
        attempt.deadline = deadline
        attempt._lost = False
        attempt._renewal = None
        attempt._stop = None
        return attempt

    @property
    def idempotency_key(self) -> str:
        """The downstream idempotency key (see the class's description)."""
        key = self._key
        if key is None and self._key_of is not None:
            # Two threads reading it at once both derive the same str: no lock needed.
            key = self._key = downstream_key(*self._key_of)
        return cast("str", key)  # None only if it was given None

    @idempotency_key.setter
    def idempotency_key(self, value: str) -> None:
        self._key = value

    def __getstate__(self) -> object:
        """Pickled and copied with its key derived, never with the principal it derives
        from: the key is what reveals neither namespace nor principal."""
        key = self.idempotency_key
        _, slots = cast("tuple[None, dict[str, Any]]", super().__getstate__())
        return None, {**slots, "_key": key, "_key_of": None}

    def __repr__(self) -> str:
        return (
            f"Attempt(operation_id={self.operation_id!r}, generation={self.generation}, "
            f"number={self.number}, idempotency_key={self.idempotency_key!r}, "
            f"lost={self.lost})"
        )

    @property
    def lost(self) -> bool:
        """True once a heartbeat found the lease lost (taken over, settled or gone; not a
        lease that only lapsed with no newer attempt: :meth:`Renewal.lapsed
        <settle.models.Renewal.lapsed>`)."""
        return self._lost

    @property
    def lost_reason(self) -> str | None:
        return self._renewal.reason if self._renewal is not None else None

    def remaining(self) -> float | None:
        """Seconds left before ``timeout`` (never negative), or None without a timeout."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())

    def check(self) -> None:
        """Raise if this attempt must stop: :class:`StaleAttempt` when the lease is lost,
        ``TimeoutError`` when the ``timeout`` has passed. Call it between steps."""
        if self.lost:
            record: OperationRecord | None = None
            if self._renewal is not None:
                record = self._renewal.record
            advice = "stop and let the current owner settle it"
            if self.lost_reason == "unknown_operation":
                # Nothing owns it: Redis lost the record (or it was deleted) while this ran.
                advice = (
                    "the operation has no record any more (Redis lost it or it was deleted), "
                    "so nothing remembers this attempt: stop; a new call runs it again"
                )
            self._stop = StaleAttempt(
                f"attempt {self.generation} of operation {self.operation_id!r} lost its lease "
                f"({self.lost_reason}); {advice}",
                operation_id=self.operation_id,
                record=record,
            )
            raise self._stop
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self._stop = TimeoutError(
                f"operation {self.operation_id!r}: the attempt's timeout passed"
            )
            raise self._stop

    def stopped_by(self, error: BaseException | None) -> bool:
        """Whether ``error`` is what :meth:`check` raised to stop this attempt (a lost lease,
        the timeout): settle's signal, never the function's definite answer, whatever
        ``terminal`` lists."""
        return error is not None and error is self._stop

    def mark_lost(self, renewal: Renewal) -> None:
        """Record that the lease is lost (called by the heartbeat that found out)."""
        self._renewal = renewal
        self._lost = True


Attempt.INJECTED = Attempt(
    operation_id="", generation=0, number=0, idempotency_key="", attempt_id=""
)
