"""Which Redis failures a call may be repeated after, and what each failure means to a
caller. Shared by both shells: they run ``tenacity`` with :func:`retry_options` and turn what
is left into a :class:`SettleError` with :func:`backend_error`.

Every script is safe to repeat with the same KEYS and ARGV: a repeated ``reserve`` carries the
same attempt id and gets its own reservation back (``resumed``); a repeated settlement of a
record it already settled is ``absorbed``. So a call whose connection dropped after it was
sent is simply sent again. A script's own error (a ``ResponseError``) is never retried.
A ``mark_provisional`` repeated after another attempt took over is absorbed too: the script
finds this attempt's accepted ``mark_provisional`` in the attempt log.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from redis import exceptions as rx
from redis.cluster import RedisCluster
from tenacity import RetryCallState, retry_if_exception, stop_after_attempt

from settle._jitter import OwnRandomExponentialWait
from settle._log import logger, operation_digest
from settle._runtime.calls import Call
from settle.errors import BackendError, ConfigurationError, SettleError

__all__ = [
    "APART_ROUNDS",
    "ATTEMPTS",
    "TRYAGAIN_SENDS",
    "SlotSplit",
    "backend_error",
    "error_code",
    "failures_as_settle_errors",
    "first_retry_delay",
    "handed_back",
    "is_transient",
    "refused_write",
    "retry_options",
    "slot_split",
    "split_slot",
    "tryagain_pause",
    "unsettled_apart",
]

#: Tries of one script call (the first and the repeats) before the error reaches the caller.
ATTEMPTS = 4
_WAIT_FIRST = 0.05
_WAIT_MAX = 1.0

#: TRYAGAIN's budget, the same on every path (docs/operations.md, "What each failure
#: costs"). A Redis Cluster node refuses a call with TRYAGAIN while the call's slot is
#: migrating and its keys are split between the two nodes; nothing ran. Within one try the
#: call is sent again up to ``TRYAGAIN_SENDS`` times in all, pausing ``TRYAGAIN_PAUSE``
#: after each refusal once half of those sends are spent (:func:`tryagain_pause`); then the
#: try fails, transient, and the call's ``ATTEMPTS`` repeat it. This is redis-py's cluster
#: client's own rule (its ``RedisClusterRequestTTL``, read from it here, and its 0.05 s),
#: which it keeps on the path without ``min_replicas``; the durable path, which sends the
#: script and its WAIT itself, keeps it through these names.
TRYAGAIN_SENDS: int = RedisCluster.RedisClusterRequestTTL
TRYAGAIN_PAUSE = 0.05


def is_transient(exc: BaseException) -> bool:
    """A dropped or refused connection, a timeout, a server still loading its data, a
    cluster resharding (TRYAGAIN) or failing over (CLUSTERDOWN): repeat the call. Wrong
    credentials and a script's own error are not transient.

    redis-py's cluster client repeats a redirection (MOVED, ASK) and TRYAGAIN itself, 16
    times in about 0.1 s, then raises ClusterError ("TTL exhausted"), its only use: every
    try was refused before it ran, so the call is repeated as TRYAGAIN is (a slot whose
    keys are split between two nodes for the length of a migration)."""
    if isinstance(exc, rx.AuthenticationError | rx.AuthorizationError | rx.MaxConnectionsError):
        return False
    return isinstance(
        exc,
        rx.ConnectionError
        | rx.TimeoutError
        | rx.TryAgainError
        | rx.ClusterDownError
        | rx.ClusterError,
    )


def split_slot(exc: BaseException | None) -> bool:
    """Whether ``exc``, the cause of a call's failure on Redis Cluster, is the refusal of a
    slot whose keys a migration split between two nodes: TRYAGAIN, or redis-py's
    ClusterError ("TTL exhausted") after its own repeats of it. Such a call ran nothing.
    Not CLUSTERDOWN (a ClusterError too): a slot no node serves, which no read gets past."""
    return isinstance(exc, rx.TryAgainError | rx.ClusterError) and not isinstance(
        exc, rx.ClusterDownError
    )


class SlotSplit(BackendError):
    """A read marked :attr:`Call.caller_splits` that a Redis Cluster migration refused
    (:func:`split_slot`): handed back to its caller at the first refusal, which reads the
    keys apart. No failure: neither ``settle.backend.retrying`` nor ``settle.backend.failed``
    is logged for it, only ``settle.cluster.read_split`` (:func:`slot_split`)."""


def handed_back(call: Call | None, exc: BaseException) -> bool:
    """Whether ``exc`` ends ``call``'s tries as :class:`SlotSplit`: a migration's refusal
    of a read whose caller reads its keys apart. Repeating it would only wait: a slot stays
    split until the migration moved every key of it, and the reads apart give the same
    answer meanwhile (docs/operations.md, "Redis Cluster")."""
    return call is not None and call.caller_splits and split_slot(exc)


def slot_split(exc: BaseException, call: Call) -> SlotSplit:
    """The :class:`SlotSplit` of ``call`` refused with ``exc``; logs that its keys are read
    apart (``settle.cluster.read_split``, INFO: a resharding's every read of a migrating
    slot logs it, and the read succeeds)."""
    logger.info(
        "settle.cluster.read_split",
        script=call.script,
        operation_digest=operation_digest(call.operation_id),
        keys=len(call.keys),
        error=type(exc).__name__,
    )
    return SlotSplit(
        f"{call.script}: the slot of its keys is migrating and they are split between two "
        f"nodes ({type(exc).__name__}); read them one at a time",
        operation_id=call.operation_id,
        code=error_code(exc),
    )


#: Rounds of a read apart (a :class:`SlotSplit` read one key at a time, then read again
#: when what it checks before and after changed) before it gives up: a state that changes
#: under every round (writes a few ms apart) is read again by its caller.
APART_ROUNDS = 4


def unsettled_apart(call: Call, what: str) -> BackendError:
    """The error of ``call`` read apart (:class:`SlotSplit`) whose ``what`` (the state it
    checks before and after) changed under each of its :data:`APART_ROUNDS`, logged as
    every failure a call gives up on (``settle.backend.failed``)."""
    logger.error(
        "settle.backend.failed",
        script=call.script,
        operation_digest=operation_digest(call.operation_id),
        attempt_id=call.attempt_id,
        error=SlotSplit.__name__,
        raised=BackendError.__name__,
    )
    return BackendError(
        f"{call.script}: {what} kept changing while its slot migrates (read one key at a "
        f"time, {APART_ROUNDS} times); read again",
        operation_id=call.operation_id,
    )


def error_code(exc: BaseException) -> str:
    """The error code of a Redis error reply (``NOGROUP``, ``WRONGTYPE``, ``NOSCRIPT``...):
    the first word of the reply, which the Redis protocol defines as its code. Parts decide on
    this code, never on the rest of the message."""
    if not isinstance(exc, rx.ResponseError) or not exc.args:
        return ""
    word = str(exc.args[0]).split(" ", 1)[0]
    return word if word.isupper() else "ERR"


#: Error codes with which a server refuses every write while a condition of its own lasts:
#: what the condition is, and when a repeat can succeed. A script meets them at its first
#: write (the condition does not change while a script runs), so it wrote nothing.
_REFUSED_WRITES = {
    "OOM": (
        "it is full (used memory above maxmemory, with maxmemory-policy noeviction)",
        "memory is freed or maxmemory raised (docs/operations.md sizes it from the retention)",
    ),
    "NOREPLICAS": (
        "it has fewer good replicas than its min-replicas-to-write",
        "its replicas are connected and caught up again",
    ),
    "MISCONF": (
        "it cannot save its RDB snapshot and stops writes (stop-writes-on-bgsave-error)",
        "its snapshot saves again (see its log: disk full, permissions)",
    ),
}


def refused_write(exc: BaseException) -> str | None:
    """The code of an error reply with which the server refused a write for a condition of
    its own (``OOM``, ``NOREPLICAS``, ``MISCONF``): the reply's own code, or on Redis 6.2 the
    code inside a script's error ("Error running script ...: -OOM command not allowed...");
    None for any other failure."""
    if isinstance(exc, rx.OutOfMemoryError):  # redis-py drops the code from its text
        return "OOM"
    if not isinstance(exc, rx.ResponseError):
        return None
    code = error_code(exc)
    if code in _REFUSED_WRITES:
        return code
    text = str(exc)
    if text.startswith("Error running script"):
        for refused in _REFUSED_WRITES:
            if f": -{refused} " in text:
                return refused
    return None


def retry_options(call: Call | None, tries: int = ATTEMPTS) -> dict[str, Any]:
    """Keyword arguments for ``tenacity.Retrying`` / ``AsyncRetrying`` around one call.

    The shells try a call once without tenacity (its machinery costs more than a round trip)
    and only hand the repeats, ``tries = ATTEMPTS - 1``, to tenacity after a transient failure.
    """
    return {
        "stop": stop_after_attempt(tries),
        "wait": OwnRandomExponentialWait(multiplier=_WAIT_FIRST, max=_WAIT_MAX),
        "retry": retry_if_exception(lambda exc: is_transient(exc) and not handed_back(call, exc)),
        "reraise": True,
        # The try that failed, counted from the call's first (the shells make the first
        # try without tenacity and hand it only the repeats: tries = ATTEMPTS - 1).
        "before_sleep": lambda state: _log_retry(call, state, ATTEMPTS - tries),
    }


def tryagain_pause(sent: int) -> float | None:
    """Seconds to wait before sending a call again after its ``sent``-th send of this try
    was refused with TRYAGAIN; None when the try has spent its ``TRYAGAIN_SENDS``."""
    if sent >= TRYAGAIN_SENDS:
        return None
    return TRYAGAIN_PAUSE if TRYAGAIN_SENDS - sent < TRYAGAIN_SENDS / 2 else 0.0


def first_retry_delay(call: Call | None, exc: BaseException) -> float:
    """Log the first try's transient failure and return how long to wait before the repeats."""
    delay = _WAIT_FIRST
    _log(call, 1, exc, delay)
    return delay


def _log_retry(call: Call | None, state: RetryCallState, before: int) -> None:
    exc = state.outcome.exception() if state.outcome else None
    _log(call, state.attempt_number + before, exc, state.upcoming_sleep)


def _log(call: Call | None, attempt: int, exc: BaseException | None, sleep: float) -> None:
    logger.warning(
        "settle.backend.retrying",
        script=call.script if call else None,
        operation_digest=operation_digest(call.operation_id) if call else None,
        attempt_id=call.attempt_id if call else None,
        attempt=attempt,
        of=ATTEMPTS,
        error=type(exc).__name__ if exc else None,
        sleep=round(sleep, 3),
    )


def backend_error(
    exc: rx.RedisError | rx.RedisClusterException,
    call: Call | None,
    *,
    tries: int = ATTEMPTS,
    earlier_unknown: bool = False,
) -> SettleError:
    """What a Redis failure means to the caller: a misconfiguration (credentials, an
    incomplete cluster) is a :class:`ConfigurationError`; the rest is a :class:`BackendError`.
    ``tries``: how many times the failed command was sent (1 for one not repeated);
    ``earlier_unknown``: an earlier try of the call lost its reply, so it may have run, and
    a refusal of the last try says nothing of it."""
    error = _classify(exc, call, tries, earlier_unknown)
    logger.error(
        "settle.backend.failed",
        script=call.script if call else None,
        operation_digest=operation_digest(call.operation_id) if call else None,
        attempt_id=call.attempt_id if call else None,
        error=type(exc).__name__,
        raised=type(error).__name__,
    )
    return error


@contextmanager
def failures_as_settle_errors(what: str) -> Iterator[None]:
    """A Redis failure inside the block raised as :func:`backend_error` makes it, for work
    that is not one command the runner can send (walking a SCAN cursor): every Redis error
    that reaches a caller is settle's, never redis-py's own."""
    try:
        yield
    except (rx.RedisError, rx.RedisClusterException) as exc:
        raise backend_error(exc, Call(what, (), ())) from exc


def _classify(
    exc: rx.RedisError | rx.RedisClusterException,
    call: Call | None,
    tries: int,
    earlier_unknown: bool = False,
) -> SettleError:
    what = call.script if call else "a command"
    op = call.operation_id if call else None
    name = f"{exc.__class__.__name__}: {exc}"
    if isinstance(exc, rx.NoPermissionError) and any(
        f"'{command}" in str(exc).lower() for command in ("evalsha", "fcall", "function", "script")
    ):
        # A user whose ACL lets it run settle's scripts neither way: what to do is not a
        # credential but a library an admin loads, or one more command allowed.
        return ConfigurationError(
            f"Redis refused to run settle's scripts during {what} ({name}): this user may "
            "call them neither as a FUNCTION library (FCALL of a library loaded on every "
            "primary; an admin loads settle's libraries with `settle doctor`) nor by "
            'EVALSHA. Load the libraries, or allow FCALL or EVALSHA (docs/operations.md, "ACLs"); '
            "nothing was written.",
            operation_id=op,
        )
    if isinstance(exc, rx.AuthenticationError | rx.AuthorizationError | rx.NoPermissionError) or (
        "NOAUTH" in str(exc) or "WRONGPASS" in str(exc)
    ):
        return ConfigurationError(
            f"Redis refused settle's credentials during {what} ({name}). Check the user name "
            "and password in the URL (or the ACL rules of that user); nothing was written.",
            operation_id=op,
        )
    if "DB index is out of range" in str(exc):  # Valkey 9 cluster nodes answer this to SELECT
        return ConfigurationError(
            "the database in the URL does not exist on the server (a server has as many as "
            "its `databases` setting says, 16 by default, numbered from 0; a Redis Cluster "
            "node has only database 0: connect to redis://host:port/0 or use from_cluster())",
            operation_id=op,
        )
    if "SELECT is not allowed in cluster mode" in str(exc):
        return ConfigurationError(
            "the server is a Redis Cluster node, which has only database 0: connect to "
            "redis://host:port/0 or use from_cluster()",
            operation_id=op,
        )
    if isinstance(exc, rx.RedisClusterException):
        return ConfigurationError(
            f"the Redis Cluster cannot serve every settle key during {what} ({name}). Assign "
            "every hash slot and wait for cluster_state:ok before starting settle.",
            operation_id=op,
        )
    refused = refused_write(exc)
    if refused is not None:
        code, (why, when) = refused, _REFUSED_WRITES[refused]
        written = (
            "This try wrote nothing, but an earlier try's reply was lost, so whether that one "
            "ran is unknown (read the record back)"
            if earlier_unknown
            else "Nothing was written"
        )
        return BackendError(
            f"Redis refused to write during {what} ({name}): {why}. {written}, and the call "
            f"is safe to repeat with the same arguments once {when}.",
            operation_id=op,
            code=code,
        )
    retried = f" after {tries} tries" if is_transient(exc) and tries > 1 else ""
    return BackendError(
        f"Redis failed during {what}{retried}: {name}. Check that the server is reachable; "
        "whether a settlement sent before the failure ran is unknown, and settlement calls "
        "are safe to repeat with the same arguments.",
        operation_id=op,
        code=error_code(exc),
    )
