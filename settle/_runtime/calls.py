"""The one call type every part plans and the one reply shape every script answers in."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from settle._slots import slot_init
from settle._text import as_text
from settle.errors import CorruptRecord, SettleError

__all__ = [
    "Call",
    "Reply",
    "RunScript",
    "Unacknowledged",
    "naming",
    "packs_plain",
    "parse_reply",
]

#: hiredis writes integers of this magnitude itself (``packing.pack_command``); the lower
#: bound made once, not negated for each value compared with it.
INT64 = 2**63
INT64_MIN = -INT64


def packs_plain(values: Iterable[object]) -> bool:
    """Whether hiredis packs each of ``values`` as the connection itself would, so that
    ``packing.pack_command`` need not look at it: no memoryview (hiredis would send a
    strided view's underlying bytes) and no integer beyond 64 bits (hiredis crashes the
    process on one of over 4,300 digits)."""
    return all(
        type(v) is not memoryview and (type(v) is not int or INT64_MIN <= v < INT64) for v in values
    )


# slot_init: each field set through its slot's descriptor, not ``object.__setattr__`` (about
# 18,000 instructions for the eleven fields, on every script call; docs/benchmarks.md).
@slot_init
@dataclass(frozen=True, slots=True)
class Call:
    """One script call: which script, its KEYS and ARGV, and what decoding needs to know.

    ``operation_id`` is what errors and logs name as the subject of the call: the operation
    id in the core, the stream in ``settle.cursor``, the consumer in ``settle.progress``.
    ``action`` and ``shard`` are the core's (a settlement's action, a quarantine read's
    shard); the companions leave them empty. ``reads_only`` marks a call of a writing
    script whose arguments let it write nothing (the namespace check that does not create
    the metadata): with ``min_replicas`` it runs without WAIT, as a read does, so a settler
    started while its replicas are down still reads. ``stops`` names the reply codes that
    only tell the caller to stop (a renewal's ``lost``: the lease is someone else's, or gone):
    such a reply wrote nothing, and stopping never puts two attempts on the operation at once,
    so with ``min_replicas`` it is returned, as :class:`Unacknowledged`, even when no replica
    acknowledged the call (a replica down would otherwise keep a fenced-off attempt running
    until it is back, where without ``min_replicas`` its next renewal stops it).
    ``plain`` marks a call whose keys and arguments are all text, bytes and integers
    within 64 bits (:func:`packs_plain`), as the core's reserve and settlement plans make
    them from what they checked: the lane packs it with hiredis without looking at each
    argument again (``packing.pack_command``). Unmarked, every argument is looked at.
    ``caller_splits`` marks a read of several keys whose caller reads them apart when a Redis
    Cluster migration splits their slot: the runner hands that refusal back at once, as
    :class:`~settle._runtime.transient.SlotSplit`, neither repeated nor logged as a failure
    (a write is never marked: it stays one atomic call). ``wait_ms``, when set, bounds how
    long the call's ``WAIT`` holds it for its replicas below ``replica_timeout``: a renewal
    waits no longer than its heartbeat's interval, so the next renewal is sent in time (a
    renewal that waited ``replica_timeout`` pushed the next one back by that much, and a
    replica that stopped let the lease lapse under the running function).
    """

    script: str
    keys: tuple[str, ...]
    args: tuple[str | bytes | int, ...]
    operation_id: str | None = None
    attempt_id: str | None = None
    action: Any = None
    shard: int | None = None
    reads_only: bool = False
    stops: tuple[str, ...] = ()
    caller_splits: bool = False
    wait_ms: int | None = None
    plain: bool = False

    def stops_caller(self, reply: Any) -> bool:
        """Whether the script's ``reply`` is one of the verdicts in :attr:`stops`."""
        if not self.stops or not isinstance(reply, list) or not reply:
            return False
        code = reply[0]
        return (code.decode() if isinstance(code, bytes) else code) in self.stops


@dataclass(frozen=True, slots=True)
class Unacknowledged:
    """A stopping verdict (:attr:`Call.stops`) the durable runner returns though too few
    replicas acknowledged the call: ``reply`` as the script gave it. What the primary showed
    (another attempt's completion, say) may not survive a failover: the verdict stops the
    caller, and the decoder hands on no more of it than stopping needs."""

    reply: Any


@contextmanager
def naming(call: Call) -> Iterator[None]:
    """A :class:`SettleError` raised inside, that names no operation, names ``call``'s: the
    start-up check that fails on a call fails that call (SPEC 11)."""
    try:
        yield
    except SettleError as exc:
        if exc.operation_id is None:
            exc.operation_id = call.operation_id
        raise


@dataclass(frozen=True, slots=True)
class RunScript:
    """The instruction every part's procedure yields to have a script run on its runner;
    the shell sends the raw reply back in."""

    call: Call


@dataclass(frozen=True, slots=True)
class Reply:
    """``{code, detail, now_ms, ...body}``: what every settle script returns (prelude.lua)."""

    code: str
    detail: str
    now_ms: int
    body: list[Any]


def parse_reply(raw: Any, call: Call | None = None, *, body: int | None = None) -> Reply:
    """Split a script's reply; ``body`` is how many items must follow ``now_ms`` (any when
    None). A reply of another shape means the script and this code disagree: a typed
    :class:`CorruptRecord`, never an index error."""
    if (
        not isinstance(raw, list | tuple)
        or len(raw) < 3
        or (body is not None and len(raw) != 3 + body)
    ):
        what = call.script if call else "script"
        raise CorruptRecord(
            f"unexpected {what} reply shape ({type(raw).__name__}); the server runs scripts "
            "of another settle version: restart every client on one version",
            operation_id=call.operation_id if call else None,
        )
    try:
        return Reply(as_text(raw[0]), as_text(raw[1]), int(raw[2]), list(raw[3:]))
    except (TypeError, ValueError, UnicodeDecodeError) as exc:
        raise CorruptRecord(f"script reply cannot be decoded: {exc}") from exc
