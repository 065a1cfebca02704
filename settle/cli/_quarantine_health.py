"""``settle doctor``'s quarantine rows: how much evidence each shard holds, how long the
oldest unresolved entry has waited, and how close the fullest shard is to the settlers'
``quarantine_maxlen``, past which each new entry pushes the oldest out, unresolved evidence
included (docs/cli.md, "settle doctor"; the thresholds are this module's constants).

Nothing is written: the namespace's stored shard count is read first (a namespace that does
not exist holds no quarantine), then each shard's ``XLEN`` and ``HLEN`` of its resolutions
(an entry leaves the stream only with its resolution: the difference is the unresolved), and
the headers (kind and time, never a payload) oldest first with settle's own read script, up
to the first unresolved entry only: the quarantine is never walked whole, whatever it holds."""

from __future__ import annotations

from datetime import datetime

from redis.exceptions import RedisClusterException, RedisError

from settle._core.codec import UndecodableEntry
from settle._core.keys import Keys
from settle._runtime._sync import client_from_url
from settle._runtime.health import Finding, Status
from settle._sync.settler import Settler
from settle.cli._context import bounded, probed_shards, settings
from settle.demo.server import client_of, server_now
from settle.errors import SettleError

__all__ = [
    "MAXLEN_FAIL",
    "MAXLEN_WARN",
    "UNRESOLVED_FAIL_S",
    "UNRESOLVED_WARN_S",
    "graded",
    "quarantine_findings",
]

#: An unresolved entry older than this is a ``warn``: a rejected response (a late charge, a
#: conflicting settlement) nobody has looked at for a business day.
UNRESOLVED_WARN_S = 24 * 3600
#: ... and older than this a ``fail``: a week of unexamined evidence of a payment that may
#: have gone out twice is past what a reconciliation or a chargeback window forgives.
UNRESOLVED_FAIL_S = 7 * 24 * 3600
#: The fullest shard's share of ``quarantine_maxlen`` that is a ``warn``, and a ``fail``:
#: the next entries push the oldest out, unresolved or not.
MAXLEN_WARN = 0.8
MAXLEN_FAIL = 0.95

_LIST = "settle quarantine ls --unresolved, then resolve each (settle quarantine resolve ID)"


def quarantine_findings(
    url: str, namespace: str, timeout: float, maxlen: int | None
) -> list[Finding]:
    """The three quarantine rows (``quarantine``, ``quarantine age``, ``quarantine
    maxlen``); a shard that cannot be read is named and is a ``warn``, never counted as
    empty."""
    try:
        shards = probed_shards(bounded(client_from_url(url), url, timeout), namespace)
        if shards is None:
            seen = f"namespace {namespace!r} does not exist: nothing quarantined"
            return [
                Finding("quarantine", Status.OK, seen),
                Finding("quarantine age", Status.OK, seen),
                _maxlen_finding({}, maxlen),
            ]
        with _reader(url, namespace, shards, timeout) as settler:
            sizes, unresolved, unread = _sizes(settler, shards)
            found = [_size_finding(sizes, unread, shards)]
            found.append(_age_finding(settler, unresolved, unread))
            found.append(_maxlen_finding(sizes, maxlen, unread))
            return found
    except (SettleError, RedisError, RedisClusterException, OSError) as exc:
        why = f"could not be read ({_cause(exc)})"
        fix = "see the rows above (a node down, a command denied), then run doctor again"
        return [
            Finding(name, Status.WARN, why, fix)
            for name in ("quarantine", "quarantine age", "quarantine maxlen")
        ]


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__ if isinstance(exc, SettleError) and exc.__cause__ else exc
    return " ".join(f"{type(cause).__name__}: {cause}".split())


def _reader(url: str, namespace: str, shards: int, timeout: float) -> Settler:
    """A settler that reads only (``Settler._reading``): the server checked (connected,
    scripts loaded, a cluster client on a cluster), the namespace not, since the namespace
    row above judges the metadata's and the shard states' counts and the namespace was
    read to exist with ``shards`` shards; nothing is created nor claimed. It writes
    nothing, so an evicting server is read (the eviction row fails the policy): refused, it
    left the quarantine rows unread where the policy puts the entries at risk."""
    config = settings({"namespace": namespace, "shards": shards, "allow_eviction": True})
    settler = Settler(bounded(client_from_url(url), url, timeout), config)
    try:
        settler._reading(namespace=False).check()
    except BaseException:
        settler.close()
        raise
    return settler


def _sizes(settler: Settler, shards: int) -> tuple[dict[int, int], int, dict[int, str]]:
    """Each shard's stream length, the unresolved entries of all (each stream's length less
    its resolutions), and the shards that could not be read (why)."""
    keys = Keys(settler.config.namespace, shards)
    client = client_of(settler)
    sizes: dict[int, int] = {}
    unresolved = 0
    unread: dict[int, str] = {}
    for shard in range(shards):
        try:
            size = int(client.xlen(keys.quarantine(shard)))
            resolved = int(client.hlen(keys.resolutions(shard))) if size else 0
        except (RedisError, RedisClusterException, OSError) as exc:
            unread[shard] = _cause(exc)
            continue
        sizes[shard] = size
        unresolved += max(0, size - resolved)
    return sizes, unresolved, unread


def _unread_text(unread: dict[int, str]) -> str:
    shown = ", ".join(map(str, sorted(unread)[:8])) + (", ..." if len(unread) > 8 else "")
    first = unread[min(unread)]
    return f"shard{'s' if len(unread) > 1 else ''} {shown} could not be read ({first})"


def _size_finding(sizes: dict[int, int], unread: dict[int, str], shards: int) -> Finding:
    total = sum(sizes.values())
    fullest = sorted(sizes.items(), key=lambda item: (-item[1], item[0]))[:3]
    per = ", ".join(f"shard {s}: {n}" for s, n in fullest if n)
    seen = f"{total} entries in {shards} shards" + (f" (most in {per})" if per else "")
    if unread:
        return Finding(
            "quarantine",
            Status.WARN,
            f"{_unread_text(unread)}; {seen} of the others",
            "bring the node that holds them back (see cluster slots), then run doctor again",
        )
    return Finding("quarantine", Status.OK, seen)


def _age_finding(settler: Settler, unresolved: int, unread: dict[int, str]) -> Finding:
    """The oldest unresolved entry's age: the walk's first (stream ids are in time order),
    where the walk stops; ``unresolved`` counted them all."""
    if unread:  # the walk reads every shard: it would fail on the first unread one
        return Finding(
            "quarantine age",
            Status.WARN,
            f"unresolved entries not counted: {_unread_text(unread)}",
            "bring the node that holds them back, then run doctor again",
        )
    if not unresolved:
        return Finding("quarantine age", Status.OK, "no unresolved entry")
    undecodable = 0
    oldest: datetime | None = None
    walk = settler.quarantine._walk(unresolved=True).header_marking()
    for header in settler.quarantine._scanned(walk):
        if not isinstance(header, UndecodableEntry):
            oldest = header.at
            break  # oldest first: the rest are younger, and are not read
        undecodable += not header.resolved
    odd = f" ({undecodable} this version cannot decode)" if undecodable else ""
    if oldest is None:
        return Finding(
            "quarantine age",
            Status.WARN if undecodable else Status.OK,
            f"{unresolved} unresolved{odd}, none this version can date",
            "settle quarantine ls names them",
        )
    # The server's clock, which dated the entry: the operator's machine's clock, 8 days
    # ahead, failed a 4-minute-old entry as over 7 days old. A user denied TIME got here
    # never: every settle script reads it, the walk above too (tests/cli/test_doctor_time_
    # denied.py). On a cluster, the default node's clock (the clocks row compares them).
    waited = max(0.0, (server_now(settler) - oldest).total_seconds())
    seen = f"{unresolved} unresolved{odd}; the oldest waits since {oldest:%Y-%m-%dT%H:%M:%SZ} "
    seen += f"({_duration(waited)})"
    if waited >= UNRESOLVED_FAIL_S:
        return Finding("quarantine age", Status.FAIL, seen + ", over 7 days", _LIST)
    if waited >= UNRESOLVED_WARN_S:
        return Finding("quarantine age", Status.WARN, seen + ", over 24 hours", _LIST)
    if undecodable:  # older than the oldest it can date: written by another version
        return Finding("quarantine age", Status.WARN, seen, "settle quarantine ls names them")
    return Finding("quarantine age", Status.OK, seen)


def _duration(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{round(seconds / 60)} minutes"


def _maxlen_finding(
    sizes: dict[int, int], maxlen: int | None, unread: dict[int, str] | None = None
) -> Finding:
    if maxlen is None:
        return Finding(
            "quarantine maxlen",
            Status.OK,
            "not checked: pass --quarantine-maxlen (your settlers' quarantine_maxlen); "
            "without one, the streams keep every entry until trimmed",
        )
    if not sizes:
        if unread:
            return Finding("quarantine maxlen", Status.WARN, _unread_text(unread), "see quarantine")
        return Finding("quarantine maxlen", Status.OK, f"empty; quarantine_maxlen {maxlen}")
    shard, size = max(sizes.items(), key=lambda item: (item[1], -item[0]))
    share = size / maxlen
    seen = f"fullest shard {shard} holds {size} of quarantine_maxlen {maxlen} ({share:.0%})"
    fix = (
        "resolve and trim (settle quarantine trim --resolved), or raise quarantine_maxlen: "
        "each new entry past it pushes the oldest out, unresolved evidence included"
    )
    if unread and share < MAXLEN_FAIL:
        return Finding("quarantine maxlen", Status.WARN, f"{seen}; {_unread_text(unread)}", fix)
    return graded("quarantine maxlen", share, (MAXLEN_WARN, MAXLEN_FAIL), seen, fix)


def graded(check: str, share: float, limits: tuple[float, float], seen: str, fix: str) -> Finding:
    """``check`` by how full something is: ``warn`` from ``limits[0]``, ``fail`` from
    ``limits[1]`` (``fix`` shown for both), else ``ok``."""
    warn, failed = limits
    if share >= failed:
        return Finding(check, Status.FAIL, seen, fix)
    if share >= warn:
        return Finding(check, Status.WARN, seen, fix)
    return Finding(check, Status.OK, seen)
