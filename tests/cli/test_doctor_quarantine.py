"""``settle doctor``'s quarantine rows (docs/cli.md, "settle doctor"): it said nothing of the
quarantine, so an operator at 3 a.m. learnt neither that evidence of a rejected payment had
waited a week unresolved nor that a shard's stream was about to push evidence out at
``quarantine_maxlen``. Real servers, real entries (a late stale response each)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, tzinfo
from typing import Any

import pytest
import redis
import structlog
from click.testing import CliRunner

from settle import Settler
from settle._core.keys import Keys
from settle.cli import main
from settle.embedded import EmbeddedRedis
from tests.cli.conftest import CLI_ENV, cli_env, settle
from tests.cli.helpers import paused, stale_settlement
from tests.stopwatch import Stopwatch

DAY_MS = 86_400_000


def _doctor(url: str, namespace: str, *args: str) -> tuple[int, dict[str, Any]]:
    done = settle("doctor", "--redis-url", url, "--namespace", namespace, *args, "--json")
    assert done.stderr == ""
    report = json.loads(done.stdout)
    return done.returncode, {c["check"]: c for c in report["checks"]}


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as s:
        yield s


def _quarantined(url: str, namespace: str, n: int) -> None:
    """``n`` unresolved entries, all in the one shard of ``namespace``."""
    with Settler.from_url(url, namespace=namespace, shards=1) as s:
        s.check()
        for i in range(n):
            stale_settlement(s, f"order-{i}")


def _age(url: str, namespace: str, days: float) -> None:
    """Make the one entry of shard 0 ``days`` old: the same fields under an older id
    (stream ids are the server's time of the write; a stream takes no id below its last,
    so it is made anew)."""
    key = Keys(namespace, 1).quarantine(0)
    with redis.Redis.from_url(url) as c:
        ((_, fields),) = c.xrange(key)
        c.delete(key)
        ms = int(c.time()[0]) * 1000 - int(days * DAY_MS)
        fields[b"at"] = str(ms).encode()  # the entry's own time (ms, or us when given)
        if b"us" in fields:
            fields[b"us"] = str(ms * 1000).encode()
        c.xadd(key, fields, id=f"{ms}-0")


def test_doctor_counts_the_quarantine_per_shard_and_the_unresolved(
    server: EmbeddedRedis,
) -> None:
    _quarantined(server.url, "q", 2)
    code, checks = _doctor(server.url, "q")
    assert checks["quarantine"]["status"] == "ok"
    assert "2 entries in 1 shards" in checks["quarantine"]["detail"]
    assert "shard 0: 2" in checks["quarantine"]["detail"]
    assert checks["quarantine age"]["status"] == "ok"
    assert checks["quarantine age"]["detail"].startswith("2 unresolved")
    assert "--quarantine-maxlen" in checks["quarantine maxlen"]["detail"]
    assert code == 0


@pytest.mark.parametrize(("days", "status", "code"), [(2, "warn", 0), (8, "fail", 1)])
def test_an_old_unresolved_entry_warns_after_a_day_and_fails_after_a_week(
    server: EmbeddedRedis, days: float, status: str, code: int
) -> None:
    _quarantined(server.url, "q", 1)
    _age(server.url, "q", days)
    got, checks = _doctor(server.url, "q")
    age = checks["quarantine age"]
    assert age["status"] == status, age
    assert f"({days:.1f} days)" in age["detail"]
    assert "settle quarantine ls --unresolved" in age["fix"]
    assert got == code
    strict, _ = _doctor(server.url, "q", "--strict")
    assert strict == 1


def test_an_old_entry_that_is_resolved_passes(server: EmbeddedRedis) -> None:
    _quarantined(server.url, "q", 1)
    _age(server.url, "q", 30)
    with Settler.from_url(server.url, namespace="q", shards=1) as s:
        (entry,) = s.quarantine.list()
        s.quarantine.resolve(entry.ref, note="refunded")
    _, checks = _doctor(server.url, "q", "--strict")
    assert checks["quarantine age"]["status"] == "ok", checks["quarantine age"]
    assert checks["quarantine age"]["detail"] == "no unresolved entry"


@pytest.mark.parametrize(
    ("maxlen", "status", "code"), [("10", "ok", 0), ("5", "warn", 0), ("4", "fail", 1)]
)
def test_a_shard_close_to_quarantine_maxlen_warns_then_fails(
    server: EmbeddedRedis, maxlen: str, status: str, code: int
) -> None:
    _quarantined(server.url, "q", 4)
    for how in ("option", "environment"):
        args = ("--quarantine-maxlen", maxlen) if how == "option" else ()
        env = cli_env(SETTLE_QUARANTINE_MAXLEN=maxlen) if how == "environment" else None
        done = settle(
            "doctor", "--redis-url", server.url, "--namespace", "q", *args, "--json", env=env
        )
        checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
        row = checks["quarantine maxlen"]
        assert row["status"] == status, row
        assert f"holds 4 of quarantine_maxlen {maxlen}" in row["detail"]
        assert done.returncode == code


def test_a_namespace_that_does_not_exist_holds_no_quarantine(server: EmbeddedRedis) -> None:
    code, checks = _doctor(server.url, "nobody")
    assert "nothing quarantined" in checks["quarantine"]["detail"]
    assert checks["quarantine"]["status"] == "ok"
    assert code == 0


def test_doctor_waits_no_longer_than_redis_timeout_on_a_paused_server(
    server: EmbeddedRedis,
) -> None:
    """``--redis-timeout`` was accepted and ignored: doctor waited its own 5 s (and
    redis-py's retries) for a server stopped with SIGSTOP."""
    assert server.process is not None
    # In this process, timed around the command alone: a console script's start-up, measured
    # once and subtracted from another run's, varies by seconds on a loaded CI worker. The
    # structlog configuration main sets is put back (see the quarantine age test below).
    logging_as_it_was = structlog.get_config()
    try:
        with paused(server):
            clock = Stopwatch()  # less the time a loaded worker kept it waiting for a CPU
            done = CliRunner().invoke(
                main,
                ["doctor", "--redis-url", server.url, "--redis-timeout", "0.5"],
                env=dict.fromkeys(CLI_ENV),  # none of the environment's settings
            )
            took = clock.unloaded()
    finally:
        structlog.configure(**logging_as_it_was)
    assert done.exit_code == 3, done.output
    assert "cannot reach Redis" in done.stderr
    assert "TimeoutError" in done.stderr
    assert took < 2.5, f"took {took:.1f} s"


def _script_calls(url: str) -> int:
    """Script calls the server has run (EVALSHA, FCALL and their read-only forms)."""
    with redis.Redis.from_url(url) as c:
        stats = c.info("commandstats")
    return sum(
        int(v["calls"])
        for k, v in stats.items()
        if k.split("|")[0] in ("cmdstat_evalsha", "cmdstat_evalsha_ro", "cmdstat_eval")
        or k.split("|")[0] in ("cmdstat_fcall", "cmdstat_fcall_ro")
    )


def test_the_quarantine_age_reads_up_to_the_oldest_unresolved_entry_not_every_entry(
    server: EmbeddedRedis,
) -> None:
    """A quarantine of a million unresolved entries was walked whole (every header, a page
    of a few hundred per script call) to find the oldest and count them: doctor, run from a
    monitoring cron, cost the server a full scan each time. The count is each shard's XLEN
    less its resolutions; the oldest is the walk's first unresolved entry (stream ids are in
    time order), so a larger quarantine costs doctor no more script calls."""
    _quarantined(server.url, "q", 1)
    before = _script_calls(server.url)
    _, checks = _doctor(server.url, "q")
    small = _script_calls(server.url) - before
    assert checks["quarantine age"]["detail"].startswith("1 unresolved")
    key = Keys("q", 1).quarantine(0)
    with redis.Redis.from_url(server.url) as c:
        ((_, fields),) = c.xrange(key)
        pipe = c.pipeline(transaction=False)
        for _ in range(5000):
            pipe.xadd(key, fields)
        pipe.execute()
    before = _script_calls(server.url)
    _, checks = _doctor(server.url, "q")
    large = _script_calls(server.url) - before
    assert checks["quarantine age"]["detail"].startswith("5001 unresolved"), checks
    assert large == small, f"{large} script calls for 5001 entries, {small} for one"


@pytest.mark.parametrize("readable_after", [True, False])
def test_an_oldest_entry_this_version_cannot_decode_warns(
    server: EmbeddedRedis, readable_after: bool
) -> None:
    """An unresolved entry another version wrote (a kind this one does not know) is counted
    and named, a ``warn``: never passed over as no evidence."""
    with Settler.from_url(server.url, namespace="q", shards=1) as s:
        s.check()
        s.client.xadd(Keys("q", 1).quarantine(0), {"op": "order-x", "kind": "future"})
        if readable_after:
            stale_settlement(s, "order-1")
    code, checks = _doctor(server.url, "q")
    age = checks["quarantine age"]
    assert age["status"] == "warn", age
    unresolved = 2 if readable_after else 1
    assert age["detail"].startswith(f"{unresolved} unresolved (1 this version cannot decode)")
    assert code == 0


def test_the_quarantine_rows_write_nothing(server: EmbeddedRedis) -> None:
    """doctor reads the quarantine with a settler that is never checked: a check may claim
    a shard or write the namespace's metadata. Every key is byte for byte as it was, and a
    namespace that does not exist is not made."""
    _quarantined(server.url, "q", 2)
    with redis.Redis.from_url(server.url) as c:

        def keys() -> dict[bytes, bytes | None]:
            return {k: c.dump(k) for k in c.scan_iter()}

        before = keys()
        _doctor(server.url, "q")
        _doctor(server.url, "nobody")
        assert keys() == before


def test_the_age_is_read_on_the_server_clock_not_the_operators(
    server: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 16 ("use the server clock everywhere"): the entry is dated by the server; an
    operator's machine whose clock ran 8 days ahead failed a minutes-old entry as over 7 days
    old (doctor exit 1). The machine's clock is moved in doctor's process; the server's is
    the real one."""
    import settle.cli._quarantine_health as health  # noqa: PLC0415

    class Ahead(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> Ahead:  # type: ignore[override]
            return cls.fromtimestamp((datetime.now(tz) + timedelta(days=8)).timestamp(), tz)

    _quarantined(server.url, "q", 1)
    monkeypatch.setattr(health, "datetime", Ahead)
    # In this process: the CLI's main configures structlog for its stderr (CRITICAL and up),
    # which the tests that run after this one in the worker would inherit (their captured
    # logs then empty); the configuration is put back as it was.
    logging_as_it_was = structlog.get_config()
    try:
        done = CliRunner().invoke(
            main, ["doctor", "--redis-url", server.url, "--namespace", "q", "--json"]
        )
    finally:
        structlog.configure(**logging_as_it_was)
    age = {c["check"]: c for c in json.loads(done.stdout)["checks"]}["quarantine age"]
    assert age["status"] == "ok", age
    assert "(0 minutes)" in age["detail"] or "(1 minutes)" in age["detail"], age
    assert done.exit_code == 0
